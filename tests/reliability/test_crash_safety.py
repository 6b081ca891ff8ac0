"""Crash safety of ``attnkit train``, tested on real processes.

A run killed with SIGKILL at ten random moments (one of them inside a checkpoint write) and
resumed each time ends bit for bit where an uninterrupted run ends, metrics included; SIGTERM
and SIGINT stop a run after a final checkpoint and print how to resume; a second signal
abandons the save under way and leaves the checkpoint before it intact; a save that fails for
a full disk or a denied permission leaves the previous checkpoint intact and says why in one line.

Every run is a subprocess with one thread (``OMP_NUM_THREADS=1``), started through a small
driver that can hold a checkpoint save half-written (``PAUSE_IN_CHECKPOINT``) so that a signal
lands inside it for sure.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

import attnkit.models.io
from attnkit.cli import main
from attnkit.models.run_dir import MARKER, checkpoint_dir, checkpoint_step, complete_checkpoints, latest_checkpoint
from attnkit.training.checkpoint import load_checkpoint

STEPS, EVERY = 60, 3  # a run's steps (ten kills a few steps apart must not reach the end); a checkpoint every EVERY
TIMEOUT = 120  # seconds for any one wait; a whole run takes about 8 s on a busy core
OPTIONS = [
    "--preset", "gpt-tiny", "--data.vocab_size=400", "--train.batch_tokens=1024", "--train.warmup=5",
    "--train.lr=3e-3", "--train.log_every=1", "--train.eval_every=10", "--model.dropout=0.1",  # dropout: RNG matters
    f"--train.max_steps={STEPS}", f"--train.checkpoint_every={EVERY}", "--train.keep_checkpoints=2", "--quiet",
]  # fmt: skip
UNTIMED = {"seconds", "tokens_per_s"}  # the only metrics a resumed run may change

# `attnkit train`, optionally held inside the save of checkpoint PAUSE_IN_CHECKPOINT once its
# model.safetensors is written (PAUSED_FLAG is touched then): a half-written checkpoint to kill.
DRIVER = """
import os, sys, time
from pathlib import Path

if "PAUSE_IN_CHECKPOINT" in os.environ:
    import attnkit.models.io as io

    real_save_file, step = io.save_file, int(os.environ["PAUSE_IN_CHECKPOINT"])

    def save_file(tensors, filename, metadata=None):
        real_save_file(tensors, filename, metadata=metadata)
        if f".step-{step:08d}.tmp-" in str(filename):
            Path(os.environ["PAUSED_FLAG"]).touch()
            time.sleep(600)

    io.save_file = save_file
from attnkit.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def corpus(random_words: Callable[..., Path]) -> Path:
    return random_words(400)


class Session:
    """One ``attnkit train`` process, its standard error in a file beside the run directory."""

    started = itertools.count()

    def __init__(self, command: list[str], run_dir: Path, pause_at: int | None = None) -> None:
        self.run_dir, self.flag = run_dir, run_dir.parent / "paused"
        self.flag.unlink(missing_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if pause_at is not None:
            env.update(PAUSE_IN_CHECKPOINT=str(pause_at), PAUSED_FLAG=str(self.flag))
        self.err_path = run_dir.parent / f"{run_dir.name}-{next(Session.started)}.err"
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", DRIVER, *command], stdout=subprocess.DEVNULL,
                                         stderr=err, env=env)  # fmt: skip

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(f"the run exited ({self.proc.returncode}) before {what}:\n{self.stderr}")
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"timed out waiting for {what}:\n{self.stderr}")
            time.sleep(0.01)

    def finish(self) -> int:
        try:
            return self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"the run did not end within {TIMEOUT} s:\n{self.stderr}")


def attnkit_train(corpus: Path, run_dir: Path, *extra: str, pause_at: int | None = None) -> Session:
    return Session(["train", *OPTIONS, f"--data.path={corpus}", "--out", str(run_dir), *extra], run_dir, pause_at)


def logged_step(run_dir: Path) -> int:
    """The last step in metrics.jsonl (0 before the first)."""
    path = run_dir / "metrics.jsonl"
    steps = [0]
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            steps.append(json.loads(line)["step"])
    return max(steps)


def latest_step(run_dir: Path) -> int:
    latest = latest_checkpoint(run_dir)
    return checkpoint_step(latest) if latest else 0


def half_written(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "checkpoints").glob(".step-*.tmp-*"))


def records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in UNTIMED} for line in lines]


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """Bit-identical final checkpoints (weights, optimiser, RNG, data position) and metrics."""
    ours, theirs = latest_checkpoint(run_dir), latest_checkpoint(reference)
    assert ours.name == theirs.name == f"step-{STEPS:08d}"
    for name in ("model.safetensors", "optimizer.safetensors", "rng.safetensors"):
        a, b = load_file(ours / name), load_file(theirs / name)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}: {key}"
    progress = [json.loads((p / "trainer_state.json").read_text())["progress"] for p in (ours, theirs)]
    for p in progress:
        del p["seconds"]
    assert progress[0] == progress[1]
    assert records(run_dir) == records(reference)
    assert not half_written(run_dir)


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run, uninterrupted."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    session = attnkit_train(corpus, run_dir)
    assert session.finish() == 0, session.stderr
    return run_dir


@pytest.mark.slow
def test_sigkill_at_ten_random_moments_then_resume_is_bit_identical(
    tmp_path: Path, corpus: Path, reference: Path
) -> None:
    rng = random.Random(0)
    run_dir = tmp_path / "run"
    mid_write = 3  # this kill lands inside a checkpoint write, for sure
    for kill in range(10):
        resume = ["--resume"] if kill else []
        since = max(logged_step(run_dir), latest_step(run_dir))  # logged already: a resumed session logs it again
        if kill == 0:  # anywhere from start-up (tokenizer, run.json) to the first steps
            session = attnkit_train(corpus, run_dir)
            time.sleep(rng.uniform(0.0, 2.0))
        elif kill == mid_write:
            before = latest_checkpoint(run_dir)
            pause_at = (latest_step(run_dir) // EVERY + 1) * EVERY  # the next checkpoint it writes
            session = attnkit_train(corpus, run_dir, *resume, pause_at=pause_at)
            session.wait_until(session.flag.exists, f"the save of step {pause_at}")
            assert half_written(run_dir) and latest_checkpoint(run_dir) == before
        else:  # a few steps in: in a step, a log line, a checkpoint write or the removal of an old one
            target = since + rng.randint(1, 3)
            session = attnkit_train(corpus, run_dir, *resume)
            session.wait_until(lambda t=target: logged_step(run_dir) >= t, f"step {target}")
            time.sleep(rng.uniform(0.0, 0.1))  # about a step
        session.proc.kill()
        assert session.finish() == -signal.SIGKILL, f"kill {kill} came too late: the run had ended"
    assert latest_step(run_dir) < STEPS
    session = attnkit_train(corpus, run_dir, "--resume")
    assert session.finish() == 0, session.stderr
    assert_same_run(run_dir, reference)


STOPPED = re.compile(r"attnkit: stopped at step (\d+) by (SIG\w+); checkpoint (\S+); resume with: (.+)$")


def resume_as_told(stderr: str, run_dir: Path, pause_at: int | None = None) -> Session:
    """Run the resume command the stopped run printed, word for word."""
    command = shlex.split(STOPPED.search(stderr).group(4))
    assert command[:2] == ["attnkit", "train"]
    return Session(command[1:], run_dir, pause_at)


def stop_with(session: Session, sig: signal.Signals, after_step: int) -> int:
    """Send ``sig`` once the run has logged ``after_step``; check the stop; the step it stopped at."""
    session.wait_until(lambda: logged_step(session.run_dir) >= after_step, f"step {after_step}")
    session.proc.send_signal(sig)
    assert session.finish() == 128 + sig
    last = session.stderr.strip().splitlines()[-1]
    stopped = STOPPED.fullmatch(last)
    assert stopped, last
    step = int(stopped.group(1))
    assert step >= after_step and stopped.group(2) == sig.name
    assert Path(stopped.group(3)) == checkpoint_dir(session.run_dir, step) == latest_checkpoint(session.run_dir)
    assert (Path(stopped.group(3)) / MARKER).is_file()
    return step


@pytest.mark.slow
def test_sigterm_and_sigint_stop_after_a_checkpoint_and_a_second_signal_abandons_the_save(
    tmp_path: Path, corpus: Path, reference: Path
) -> None:
    run_dir = tmp_path / "run"
    first = attnkit_train(corpus, run_dir)
    step = stop_with(first, signal.SIGTERM, after_step=4)
    second = resume_as_told(first.stderr, run_dir)
    step = stop_with(second, signal.SIGINT, after_step=step + 2)
    # Held inside the save of the next checkpoint: a first signal asks for a stop after it, a
    # second abandons it; the checkpoint before survives whole and the half-written one is removed.
    saved, pause_at = latest_checkpoint(run_dir), (step // EVERY + 1) * EVERY
    third = resume_as_told(second.stderr, run_dir, pause_at=pause_at)
    third.wait_until(third.flag.exists, f"the save of step {pause_at}")
    third.proc.send_signal(signal.SIGTERM)
    third.wait_until(lambda: "finishing the step" in third.stderr, "the first signal's notice")
    third.proc.send_signal(signal.SIGINT)
    assert third.finish() == 130
    last = third.stderr.strip().splitlines()[-1]
    assert last == f"attnkit: abandoned by a second SIGINT; its last complete checkpoint is {saved}; resume with: " \
        f"attnkit train --out {run_dir} --resume"  # fmt: skip
    assert latest_checkpoint(run_dir) == saved and not half_written(run_dir)
    assert not checkpoint_dir(run_dir, pause_at).exists()
    load_checkpoint(saved)  # whole and readable
    last = resume_as_told(second.stderr, run_dir)
    assert last.finish() == 0, last.stderr
    assert_same_run(run_dir, reference)


# -- saves that fail: in-process, the failure injected where the operating system would raise it --

SMALL = ["--train.max_steps=6", "--train.checkpoint_every=2", "--train.eval_every=0"]
FAILING = ".step-00000004.tmp-"  # the save of step 4 fails; step 2's checkpoint must survive it


def _full_disk_in_safetensors(monkeypatch: pytest.MonkeyPatch) -> None:
    real = attnkit.models.io.save_file

    def save_file(tensors: dict, filename: Path, metadata: dict | None = None) -> None:
        if FAILING in str(filename):  # word for word what safetensors 0.8 raises on a full tmpfs
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(attnkit.models.io, "save_file", save_file)


def _full_disk_in_json(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.write_bytes

    def write_bytes(self: Path, data: bytes) -> int:
        if FAILING in str(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)


@pytest.mark.parametrize("inject", [_full_disk_in_safetensors, _full_disk_in_json], ids=["safetensors", "json"])
def test_a_full_disk_keeps_the_previous_checkpoint_and_says_why_in_one_line(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, inject: Callable
) -> None:
    run_dir = tmp_path / "run"
    args = ["train", *OPTIONS, *SMALL, f"--data.path={corpus}", "--out", str(run_dir)]
    with monkeypatch.context() as patch:
        inject(patch)
        assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "could not save checkpoint step-00000004" in err and "No space left on device" in err
    assert "step-00000002, is intact" in err and "free space" in err
    assert err.endswith(f"resume with: attnkit train --out {run_dir} --resume")
    assert [p.name for p in complete_checkpoints(run_dir)] == ["step-00000002"] and not half_written(run_dir)
    assert main(["train", "--out", str(run_dir), "--resume", "--quiet"]) == 0
    assert latest_step(run_dir) == 6


def test_a_denied_permission_keeps_the_previous_checkpoint_and_says_why_in_one_line(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    args = ["train", *OPTIONS, *SMALL, f"--data.path={corpus}", "--out", str(run_dir)]
    assert main([*args, "--session-steps=2"]) == 0
    checkpoints = run_dir / "checkpoints"
    with monkeypatch.context() as patch:
        if os.geteuid() == 0:  # root writes through any mode bits: deny the way the kernel would
            real = Path.mkdir

            def mkdir(self: Path, *a: object, **k: object) -> None:
                if FAILING in str(self):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
                real(self, *a, **k)

            patch.setattr(Path, "mkdir", mkdir)
        else:
            checkpoints.chmod(0o555)
        capsys.readouterr()
        try:
            assert main(["train", "--out", str(run_dir), "--resume", "--quiet"]) == 1
        finally:
            checkpoints.chmod(0o755)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "could not save checkpoint step-00000004" in err and "Permission denied" in err
    assert f"make {checkpoints} writable" in err and "step-00000002, is intact" in err
    assert [p.name for p in complete_checkpoints(run_dir)] == ["step-00000002"] and not half_written(run_dir)
    assert main(["train", "--out", str(run_dir), "--resume", "--quiet"]) == 0
    assert latest_step(run_dir) == 6
