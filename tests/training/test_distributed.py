"""Scale-out under torchrun, on CPU with gloo: two processes against one.

By the sharding (:class:`~attnkit.data.batching.StepBatches`), a step of ``W`` processes with
``train.batches_per_step=k`` trains on the same ``W * k`` consecutive batches, with the same
dropout and masking seeds, as one process with ``batches_per_step=W * k``; the per-token loss
normalisation over micro-batches and ranks makes the gradients equal too. So 2 DDP (or FSDP)
processes must reproduce the single process with ``batches_per_step=2`` step by step, up to the
order of floating-point sums (gloo's all-reduce, FSDP's reduce-scatter and sharded gradient
norm): the train losses to a relative 1e-5, the weights to rtol 1e-4, atol 1e-5 (they move by
more than 1e-3 over the run, so the check has teeth; in practice DDP matches bit for bit and
FSDP to about 5e-7).

Every launch is a subprocess (``python -m torch.distributed.run --standalone``, which picks a
free port itself) with a hard timeout and one thread per process.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import attnkit
from attnkit.data.batching import ShardedBatches, StepBatches, TokenBatches
from attnkit.models.run_dir import MARKER, checkpoint_dir, complete_checkpoints, latest_checkpoint

STEPS, STOP = 6, 3  # a run's steps; where a session stops mid-run
CHECKPOINT_FILES = {MARKER, "config.json", "model.safetensors", "optimizer.safetensors", "rng.safetensors",
                    "trainer_state.json"}  # fmt: skip
LOSS_RTOL = 1e-5
WEIGHT_TOL = {"rtol": 1e-4, "atol": 1e-5}
TIMEOUT = 240  # seconds per launch; one takes about 10 s on two CPU cores
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@pytest.fixture(scope="module")
def corpus(random_words: Callable[..., Path]) -> Path:
    """300 lines of random words (shared by this module's runs)."""
    return random_words(300)


def options(corpus: Path, **changes: object) -> list[str]:
    """gpt-tiny on the corpus, dropout on (the seeds must line up too), a learning rate that moves the weights."""
    settings = {
        "data.path": corpus, "data.vocab_size": 400, "train.batch_tokens": 1024, "train.max_steps": STEPS,
        "train.warmup": 2, "train.lr": 3e-3, "train.log_every": 1, "train.eval_every": 0,
        "train.checkpoint_every": STOP, "model.dropout": 0.1, **changes,
    }  # fmt: skip
    return ["--preset", "gpt-tiny", "--quiet", *(f"--{key}={value}" for key, value in settings.items())]


def start(out: Path, args: list[str], processes: int = 1) -> subprocess.Popen:
    """``attnkit train --out OUT ARGS`` in ``processes`` processes, one thread each."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"] if processes > 1 else []
    command = [sys.executable, *launcher, "-m", "attnkit", "train", "--out", str(out), *args]
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV} | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def stop(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGTERM: torchrun then stops its workers (each in a session of its own) and exits."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def attnkit_train(out: Path, args: list[str], processes: int = 1) -> subprocess.CompletedProcess:
    """Run :func:`start` to the end, within ``TIMEOUT``; fails the test unless it succeeds."""
    proc = start(out, args, processes)
    command = " ".join(proc.args)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        stdout, stderr = stop(proc)
        pytest.fail(f"{command} ran past {TIMEOUT} s\n{stdout[-2000:]}\n{stderr[-4000:]}")
    assert proc.returncode == 0, f"{command} failed\n{stdout[-2000:]}\n{stderr[-6000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def records(run_dir: Path, split: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def train_losses(run_dir: Path) -> dict[int, float]:
    steps = [r["step"] for r in records(run_dir, "train")]
    assert steps == sorted(set(steps)), f"train metric lines repeat or go back: {steps}"  # one writer
    return {r["step"]: r["loss"] for r in records(run_dir, "train")}


def checkpoint_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(checkpoint_dir(run_dir, step) / "model.safetensors")


def assert_same_losses(got: dict[int, float], expected: dict[int, float]) -> None:
    assert got.keys() <= expected.keys()
    for step, loss in got.items():
        assert math.isclose(loss, expected[step], rel_tol=LOSS_RTOL), (step, loss, expected[step])


def assert_same_weights(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in got.items():
        torch.testing.assert_close(tensor, expected[name], **WEIGHT_TOL, msg=lambda m, name=name: f"{name}: {m}")


def assert_written_once(run_dir: Path, steps: list[int]) -> None:
    """Exactly the complete checkpoints ``steps``, whole, and nothing half-written beside them."""
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == [f"step-{s:08d}" for s in steps]
    for step in steps:
        assert {p.name for p in checkpoint_dir(run_dir, step).iterdir()} == CHECKPOINT_FILES


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The single process equal to two: two batches per step."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    attnkit_train(run_dir, options(corpus, **{"train.batches_per_step": 2}))
    assert sorted(train_losses(run_dir)) == list(range(1, STEPS + 1))
    before, after = checkpoint_weights(run_dir, STOP), checkpoint_weights(run_dir, STEPS)
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert moved > 100 * WEIGHT_TOL["atol"], "the weights barely move: the comparisons below would prove nothing"
    return run_dir


# -- the sharding itself (no processes) ----------------------------------------------------


@pytest.mark.parametrize(("world_size", "per_rank"), [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2)])
def test_w_ranks_take_the_steps_of_one_process_with_w_times_the_batches(world_size: int, per_rank: int) -> None:
    lengths = [random.Random(i).randint(3, 40) for i in range(301)]
    batches = TokenBatches(lengths, 200, seed=7)
    one = StepBatches(batches, 0, 1, world_size * per_rank)
    ranks = [StepBatches(batches, r, world_size, per_rank) for r in range(world_size)]
    for epoch in range(3):
        steps = one.epoch_batches(epoch)
        shares = [rank.epoch_batches(epoch) for rank in ranks]
        assert all(len(share) == len(steps) for share in shares)
        for i, step in enumerate(steps):
            assert [b for share in shares for b in share[i]] == step
            assert all(len(share[i]) == per_rank for share in shares)
        if per_rank == 1:  # the plain shard of each rank, step by step
            for r, share in enumerate(shares):
                assert [b for (b,) in share] == ShardedBatches(batches, r, world_size).epoch_batches(epoch)


def test_a_step_position_means_the_same_at_any_world_size() -> None:
    batches = TokenBatches([random.Random(i).randint(3, 40) for i in range(301)], 200, seed=7)
    two = [iter(StepBatches(batches, r, 2, 1)) for r in range(2)]
    for _ in range(5):
        for it in two:
            next(it)
    position = two[0].state_dict()
    one = iter(StepBatches(batches, 0, 1, 2))
    one.load_state_dict(position)
    for _ in range(40):  # into the next epochs
        assert next(one) == [b for it in two for b in next(it)]
    # One batch per step (another G): on from the 10 batches the two ranks took, in its own list.
    assert position == {"epoch": 0, "batch": 10}
    half = iter(StepBatches(batches, 0, 1, 1))
    half.load_state_dict(position)
    assert half.state_dict() == position
    assert list(itertools.islice(half, 6)) == [[b] for b in batches.epoch_batches(0)[10:16]]


# -- torchrun ------------------------------------------------------------------------------


def test_ddp_matches_one_process_on_the_doubled_batch(corpus: Path, reference: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "ddp"
    result = attnkit_train(run_dir, options(corpus), processes=2)
    assert result.stdout.count("validation: loss") == 1  # rank 0 reports
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert_same_losses(losses, train_losses(reference))
    assert_written_once(run_dir, [STOP, STEPS])
    for step in (STOP, STEPS):
        assert_same_weights(checkpoint_weights(run_dir, step), checkpoint_weights(reference, step))
    assert len(records(run_dir, "valid")) == 1  # the final evaluation, written once


def test_fsdp2_runs_and_resumes_at_world_size_1(corpus: Path, reference: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "fsdp"
    fsdp = options(corpus, **{"train.distributed": "fsdp", "train.eval_every": 2})  # evaluation: collective
    attnkit_train(run_dir, [*fsdp, f"--session-steps={STOP}"], processes=2)
    assert_written_once(run_dir, [STOP])
    assert sorted(train_losses(run_dir)) == list(range(1, STOP + 1))
    assert [r["step"] for r in records(run_dir, "valid")] == [2, STOP]  # every 2 steps, and the session's last
    # The gathered checkpoint is the full model: attnkit reads it, and it is the reference's step.
    full = dict(attnkit.from_pretrained(checkpoint_dir(run_dir, STOP)).named_parameters())
    expected = dict(attnkit.from_pretrained(checkpoint_dir(reference, STOP)).named_parameters())
    assert_same_weights({k: v.detach() for k, v in full.items()}, {k: v.detach() for k, v in expected.items()})

    # One process with two batches per step continues the two-process run as if it had never stopped.
    attnkit_train(run_dir, [*fsdp, "--resume", "--train.batches_per_step=2"])
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))  # it continued from step STOP + 1
    assert_same_losses(losses, train_losses(reference))
    assert_same_weights(checkpoint_weights(run_dir, STEPS), checkpoint_weights(reference, STEPS))
    assert_written_once(run_dir, [STOP, STEPS])


def test_ddp_checkpoint_resumes_at_world_size_1(corpus: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "ddp"
    attnkit_train(run_dir, [*options(corpus), f"--session-steps={STOP}"], processes=2)
    assert_written_once(run_dir, [STOP])
    stopped = checkpoint_weights(run_dir, STOP)
    # A half-written save, as a run killed mid-save leaves it: never resumed, and cleared away.
    leftover = run_dir / "checkpoints" / f".step-{STEPS:08d}.tmp-0000"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"truncated")

    # The same options in one process: each step now trains on one batch, not two (it says so).
    result = attnkit_train(run_dir, [*options(corpus), "--resume"])
    assert "train.batches_per_step" in result.stderr  # the warning about the changed batch
    assert "step 6:" in result.stdout
    losses = train_losses(run_dir)  # each step once: only rank 0 wrote, and the resume did not repeat
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert all(math.isfinite(loss) for loss in losses.values())
    assert [r["step"] for r in records(run_dir, "valid")] == [STOP, STEPS]  # each session's final evaluation
    assert_written_once(run_dir, [STOP, STEPS])
    assert all(torch.equal(stopped[k], v) for k, v in checkpoint_weights(run_dir, STOP).items())
    assert json.loads((checkpoint_dir(run_dir, STEPS) / "trainer_state.json").read_text())["step"] == STEPS


def test_a_killed_ddp_run_leaves_only_whole_checkpoints(corpus: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    args = options(corpus, **{"train.max_steps": 100_000, "train.checkpoint_every": 1, "train.keep_checkpoints": 2})
    proc = start(run_dir, args, processes=2)  # a save (and a deletion) every step: a kill lands amid one
    deadline = time.monotonic() + TIMEOUT
    while len(complete_checkpoints(run_dir)) < 2 or latest_checkpoint(run_dir).name < "step-00000004":
        assert proc.poll() is None, stop(proc)
        assert time.monotonic() < deadline, stop(proc)
        time.sleep(0.05)
    stop(proc)
    assert proc.returncode != 0
    visible = [p for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith(".")]
    assert visible and all({f.name for f in p.iterdir()} == CHECKPOINT_FILES for p in visible)
    last = int(latest_checkpoint(run_dir).name.removeprefix("step-"))
    train_steps = sorted(train_losses(run_dir))
    assert train_steps[:last] == list(range(1, last + 1))  # one line per step (a kill may cut the last)

    attnkit_train(run_dir, [*args, "--resume", f"--train.max_steps={last + 1}", "--train.batches_per_step=2"])
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]  # leftovers cleared
    assert latest_checkpoint(run_dir).name == f"step-{last + 1:08d}"
