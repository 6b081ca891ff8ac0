"""The benchmark suites run (tiny shapes, one repeat): their numbers are reports, never asserted
here, but the code that produces them — the GPU script's included, on the CPU — must work."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnkit import kernels
from attnkit.models.weights import WEIGHT_FORMATS, runs_fast

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("suite", "options"),
    [
        ("peak", []),
        ("attention", ["--small"]),
        ("gpu", ["--small", "--device", "cpu"]),
        ("startup", []),
        ("embed", ["--small"]),
        ("blocks", ["--small"]),
        ("data", ["--small", "--sizes", "0.3"]),
    ],
)
def test_suite_runs_and_writes_json(suite: str, options: list[str], tmp_path: Path) -> None:
    out = tmp_path / f"{suite}.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", suite, *options, "--repeats", "1", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.lstrip().startswith("###")
    numbers = json.loads(out.read_text())
    assert numbers["machine"]["torch"]


def test_lm_races_attnkit_against_transformers_gpt2_and_samples_both(tmp_path: Path) -> None:
    out = tmp_path / "lm.json"
    command = [sys.executable, "-m", "benchmarks", "lm", "--small", "--budget", "2", "--out", str(out)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lm = json.loads(out.read_text())["lm"]
    assert set(lm["curves"]) == set(lm["samples"]) == {"attnkit", "transformers GPT-2"}
    for name, curve in lm["curves"].items():
        assert len(curve) == 5 and lm["steps"][name] > 0
        assert all(1.0 < perplexity < 2 * lm["model"]["vocab_size"] for _, perplexity in curve)
        assert set(lm["samples"][name]) == {"In the beginning", "The LORD is my shepherd", "And Jesus said unto them"}


def test_recipe_variants_take_list_values() -> None:
    from benchmarks.recipe import parse_changes

    changes = parse_changes("data.tasks=translate English to French,modernize,train.lr=1e-3", "variant 'x'")
    assert changes == {"data.tasks": "translate English to French,modernize", "train.lr": "1e-3"}
    changes = parse_changes("data.tokenizer_weights=fr=3,en=2,train.lr=1e-3", "variant 'x'")
    assert changes == {"data.tokenizer_weights": "fr=3,en=2", "train.lr": "1e-3"}


def recipe(*options: str, out: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "benchmarks", "recipe", "--preset", "numbers-en-de", "--out", str(out), *options]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_recipe_runs_two_variants_and_writes_json_table_and_plot(tmp_path: Path) -> None:
    base = "data.numbers=600,train.batch_tokens=512,train.warmup=5"
    variants = ["--variant", "noam:", "--variant", "budget:train.schedule=budget-linear,train.lr=3e-3"]
    result = recipe("--name", "tiny", "--steps", "25", "--base", base, *variants, out=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads((tmp_path / "recipe-tiny.json").read_text())
    runs = {r["variant"]: r for r in payload["runs"]}
    assert set(runs) == {"noam", "budget"}
    for run in runs.values():
        assert run["steps"] == 25 and run["budget"] == "25 steps" and run["split"] == "valid"
        assert run["target_tokens_per_s"] > 0 and 0 <= run["padding"] < 1
        assert {"bleu_greedy", "bleu_beam4", "chrf_greedy", "chrf_beam4", "valid_nll", "load_before"} <= set(run)
    assert runs["budget"]["horizon"] == 25  # by steps: the budget schedule decays over them
    table = (tmp_path / "recipe-tiny.md").read_text()
    assert table.count("| 25 steps |") == 2 and "BLEU beam-4" in table
    assert (tmp_path / "recipe-tiny.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--variant", "x:train.lr_typo=1"], "variant 'x': unknown option --train.lr_typo; did you mean --train.lr?"),
        (["--variant", "x:train.schedule=wavy"], "variant 'x': --train.schedule=wavy: expected one of"),
        (["--variant", "x:train.lr"], "variant 'x': 'train.lr' is not key=value"),
        (["--variant", "x:", "--seeds", "a"], "--seeds must be integers"),
        ([], "no variant to run"),
    ],
)
def test_recipe_refuses_bad_variants_before_running_anything(tmp_path: Path, options: list[str], message: str) -> None:
    result = recipe(*options, out=tmp_path / "results")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "results").exists()


def test_trainspeed_runs_both_trees_in_turn(tmp_path: Path) -> None:
    out = tmp_path / "trainspeed.json"
    command = [sys.executable, "-m", "benchmarks", "trainspeed", "--small", "--baseline", "HEAD", "--out", str(out),
               "--precision", "fp32"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    numbers = json.loads(out.read_text())["trainspeed"]
    fp32 = numbers["precisions"]["fp32"]
    assert set(fp32["median"]) == {"baseline", "this"} and fp32["ratio"] > 0
    assert all(0 < m < 1 for m in fp32["mfu"].values())
    assert numbers["machine"]["cpu_class"] and numbers["machine"]["aten_cpu_capability"]
    assert "fp32 ratio: **" in result.stdout


def test_decoding_reports_every_format_against_transformers_and_ctranslate2_or_why_not(tmp_path: Path) -> None:
    out = tmp_path / "decoding.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "decoding", "--small", "--repeats", "1", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    numbers = json.loads(out.read_text())
    rows = {(r["case"].rsplit(", ", 1)[1], r["peer_name"], r["case"].split(" ")[0]) for r in numbers["results"]}
    formats = [f for f in WEIGHT_FORMATS if f != "gguf" and runs_fast(f, torch.device("cpu"))]
    assert "int4" in formats or not kernels.available()
    for fmt in formats:
        for case in ("GPT-2", "Marian-shaped"):
            assert (f"attnkit {fmt}", "transformers fp32", case) in rows
            if importlib.util.find_spec("ctranslate2"):
                assert (f"attnkit {fmt}", "CTranslate2 int8", case) in rows
            else:
                assert "not installed" in numbers["skipped"]["CTranslate2"]
        assert numbers["floors"][fmt]["floor_ms"] > 0 and numbers["floors"][fmt]["ms_per_token"] > 0
        assert (f"attnkit {fmt} compiled", "transformers fp32", "GPT-2") in rows
        assert numbers["floors"][f"{fmt} compiled"]["compile_seconds"] > 0
    assert all(t > 0 for r in numbers["results"] for t in (*r["ours"], *r["peer"]))


def test_decoding_runs_the_cases_asked_for_and_records_the_forced_kernels(tmp_path: Path) -> None:
    out = tmp_path / "marian.json"
    from attnkit.machine import FORCING
    from benchmarks import decoding

    env = {k: v for k, v in os.environ.items() if k not in FORCING} | {"ATEN_CPU_CAPABILITY": "default"}
    env["ATTNKIT_INT8_GEMM"] = "off"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "decoding", "--small", "--repeats", "1", "--cases", "marian",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    numbers = json.loads(out.read_text())
    assert {r["case"].split(" ")[0] for r in numbers["results"]} == {"Marian-shaped"} and numbers["floors"] == {}
    assert numbers["machine"]["env"] == {"ATEN_CPU_CAPABILITY": "default", "ATTNKIT_INT8_GEMM": "off"}
    assert numbers["machine"]["aten_cpu_capability"] == "DEFAULT"
    with pytest.raises(ValueError, match="no decoding case bleu: choose among gpt2, marian"):
        decoding.run(cases=("marian", "bleu"))


# Stand-ins for llama-cpp-python, put first on the paths of this process and the probe's.
FAKE_LLAMA_CPP = {
    "crashes": "import os, signal\n\nclass Llama:\n    def __init__(self, **_):\n        pass\n\n"
    "    def generate(self, tokens, **_):\n        os.kill(os.getpid(), signal.SIGSEGV)\n",
    "fails": "class Llama:\n    def __init__(self, **_):\n        raise ValueError('failed to load model from file')\n",
    "runs": "class Llama:\n    def __init__(self, model_path, n_threads, n_threads_batch, n_ctx, verbose):\n"
    "        pass\n\n    def generate(self, tokens, top_k, temp, reset):\n        return iter(tokens)\n",
}


@pytest.mark.parametrize("build", sorted(FAKE_LLAMA_CPP))
def test_a_llama_cpp_that_crashes_on_the_file_is_skipped_with_why(
    build: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A llama.cpp build that dies decoding the benchmark's prompt (as one built for AMX did) is
    skipped with its signal and a build that runs, not run in the benchmark's own process."""
    from benchmarks import decoding

    (tmp_path / "llama_cpp").mkdir()
    (tmp_path / "llama_cpp" / "__init__.py").write_text(FAKE_LLAMA_CPP[build])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    reason = decoding.missing_llama_cpp(tmp_path / "model.gguf", [1, 504, 3])
    if build == "runs":
        assert reason is None
        return
    assert reason is not None and "\n" not in reason
    if build == "crashes":
        assert "signal SIGSEGV" in reason and "-DGGML_AMX_TILE=OFF" in reason and "--force-reinstall" in reason
    else:  # not a crash: no advice about AMX
        assert "exit code 1: ValueError: failed to load model" in reason and "AMX" not in reason


def test_crossing_finds_where_the_shifted_pretrained_curve_goes_below() -> None:
    from benchmarks.crossing import crossing

    alone = [(0.0, 0, 5.0), (100.0, 100, 3.0), (200.0, 200, 2.0), (300.0, 300, 1.8)]
    # After 50 s of pretraining the pretrained arm falls from 4.0 (at 50 s of total) to 1.0 (at
    # 250 s): 4 - 0.015 (t - 50); the tasks alone, on [100, 200] s: 3 - 0.01 (t - 100). Equal at t = 150.
    fast = [(0.0, 0, 4.0), (200.0, 200, 1.0)]
    assert crossing(fast, alone, offset=50.0) == pytest.approx(150.0)
    assert crossing([(0.0, 0, 9.0), (300.0, 300, 8.0)], alone, offset=0.0) is None  # always above
    assert crossing([(0.0, 0, 1.0), (300.0, 300, 0.5)], alone, offset=0.0) == 0.0  # below from the start
    assert crossing(fast, alone, offset=1000.0) is None  # no common seconds: nothing to compare
    zigzag = [(0.0, 0, 4.0), (100.0, 100, 4.0), (200.0, 200, 1.0)]  # below, above at 100 s, below again
    assert crossing(zigzag, alone, offset=0.0) == 0.0  # the first second it is below


@pytest.mark.slow
def test_crossing_runs_both_arms_as_curves_after_a_pretraining(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks", "crossing", "--family", "bert", "--small", "--pretrain", "4"]
    command += ["--tasks", "5", "--alone", "9", "--every", "2", "--out", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    result = json.loads((tmp_path / "crossing-bert-small.json").read_text())
    assert result["pretraining"]["updates"] == 4 and result["family"] == "bert"
    tuned, alone = result["arms"].values()
    # a point at every checkpoint, the last update's included
    assert [u for _, u, _ in tuned["curve"]] == [2, 4, 5] and [u for _, u, _ in alone["curve"]] == [2, 4, 6, 8, 9]
    assert all(0.0 < loss < 2.0 for arm in (tuned, alone) for _, _, loss in arm["curve"])  # two labels: ln 2 near
    assert tuned["pretraining_seconds"] == result["pretraining"]["seconds"] > 0 == alone["pretraining_seconds"]
    assert all(0.0 <= arm["accuracy"] <= 1.0 for arm in (tuned, alone))
    assert [row[0] for row in result["equal_updates"]] == [2, 4]
    bad = subprocess.run([*command[:-2], "--every", "3"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--every 3 leaves a curve under 2 points" in bad.stderr
    assert (tmp_path / "crossing-bert-small.png").read_bytes()[:4] == b"\x89PNG"


def test_few_labels_counts_merge_into_one_result_of_one_experiment() -> None:
    from benchmarks.fewlabels import ARMS, merge

    def result(counts: list[str], seeds: list[int], cpu: str = "avx2") -> dict:
        per = {c: f"{c}@{seeds}" for c in counts}
        return {"family": "bert", "task": "books", "pretraining": "runs/pretrain/bert", "pretraining_steps": 3000,
                "seeds": seeds, "reads": "<s> x </s>", "checkpoint": "last", "machine": {"cpu_class": cpu},
                "steps": per, "rates": per,
                "tuned_at": per, "tuning": per, "measured": per, "arms": {arm: per for arm in ARMS}}  # fmt: skip

    old, new = result(["all", "1000"], [0, 1]), result(["100", "1000"], [0, 1])
    new["steps"] = {c: f"new {c}" for c in new["steps"]}
    merged = merge(old, new, Path("fewlabels-bert-books.json"))
    assert list(merged["steps"]) == ["100", "1000", "all"] and list(merged["arms"][ARMS[1]]) == ["100", "1000", "all"]
    assert merged["steps"] == {"100": "new 100", "1000": "new 1000", "all": "all@[0, 1]"}  # the newer count wins
    assert old == result(["all", "1000"], [0, 1])  # nothing changed in place
    with pytest.raises(ValueError, match=r"holds seeds \[0, 1\], this run \[0\]: not one table; give --out"):
        merge(old, result(["100"], [0]), Path("fewlabels-bert-books.json"))
    with pytest.raises(ValueError, match="measured on avx2, this machine is avx512-bf16"):
        merge(old, result(["100"], [0, 1], "avx512-bf16"), Path("fewlabels-bert-books.json"))
    earlier = {**old, "reads": "x"}  # a classifier that read its verses another way: another experiment
    with pytest.raises(ValueError, match="holds reads 'x', this run '<s> x </s>': not one table"):
        merge(earlier, new, Path("fewlabels-bert-books.json"))
    with pytest.raises(ValueError, match="holds checkpoint 'last', this run 'best': not one table"):
        merge(old, {**new, "checkpoint": "best"}, Path("fewlabels-bert-books.json"))


def test_a_recipe_variant_is_labelled_with_its_own_budget() -> None:
    from benchmarks.recipe import label, plan

    assert label("t5-bible-tasks", {}) == "600 s"
    assert label("t5-bible-tasks", {"train.max_steps": "4656", "train.time_budget": "null"}) == "4656 steps"
    by_steps = plan("translate-en-fr", {}, {"a": {"train.schedule": "budget-linear"}}, None, 25)["a"]
    assert by_steps["train.time_budget"] == "1e9" and label("translate-en-fr", by_steps) == "25 steps"
    assert label("translate-en-fr", plan("translate-en-fr", {}, {"a": {}}, 150, None)["a"]) == "150 s"


@pytest.mark.slow
def test_pretraining_resumes_and_few_labels_fine_tune_both_arms_on_it(tmp_path: Path) -> None:
    pretrain = [sys.executable, "-m", "benchmarks", "pretrain", "--family", "bert", "--small", "--steps", "4",
                "--dir", str(tmp_path / "pre"), "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(pretrain, check=True, capture_output=True, text=True, timeout=600, cwd=ROOT)
    first = json.loads((tmp_path / "pretrain-bert-small.json").read_text())
    subprocess.run(pretrain, check=True, capture_output=True, text=True, timeout=600, cwd=ROOT)  # resumes: done
    again = json.loads((tmp_path / "pretrain-bert-small.json").read_text())
    assert first["updates"] == again["updates"] == 4 and again["curve"] == first["curve"]
    assert [(c["from_update"], c["to_update"]) for c in again["calls"]] == [(0, 4), (4, 4)]  # each call, kept
    shutil.rmtree(tmp_path / "pre" / "checkpoints")  # stopped before its first checkpoint: starts over
    subprocess.run(pretrain, check=True, capture_output=True, text=True, timeout=600, cwd=ROOT)
    over = json.loads((tmp_path / "pretrain-bert-small.json").read_text())
    losses = {split: [(u, loss) for u, _, loss in points] for split, points in first["curve"].items()}
    assert {split: [(u, loss) for u, _, loss in points] for split, points in over["curve"].items()} == losses
    assert [(c["from_update"], c["to_update"]) for c in over["calls"]] == [(0, 4)]
    assert [u for u, _, _ in first["curve"]["train"]] == [1, 2, 3, 4]
    assert first["config"]["data"]["bibles"] == ["4"] and first["config"]["train"]["max_steps"] == 4
    few = [sys.executable, "-m", "benchmarks", "fewlabels", "--family", "bert", "--task", "testament", "--small",
           "--counts", "10", "--seeds", "0,1", "--pretrained", str(tmp_path / "pre"),
           "--out", str(tmp_path)]  # fmt: skip
    subprocess.run(few, check=True, capture_output=True, text=True, timeout=900, cwd=ROOT)
    result = json.loads((tmp_path / "fewlabels-bert-testament-small.json").read_text())
    from benchmarks.fewlabels import ARMS, RATES

    assert set(result["rates"]["10"].values()) <= set(RATES["bert"]) and list(result["arms"]) == list(ARMS)
    assert result["tuned_at"] == {"10": "10"} and result["measured"]["10"]["counts"] == ["10"]
    for arm in ARMS:
        grid = result["tuning"]["10"][arm]
        assert set(grid) == {str(lr) for lr in RATES["bert"]}
        runs = result["arms"][arm]["10"]
        assert len(runs) == 2 and all(r["updates"] == 4 and 0.0 <= r["accuracy"] <= 1.0 for r in runs)
        # seed 0's result is the run at the rate that won on validation, scored on test
        chosen = grid[str(result["rates"]["10"][arm])]
        assert runs[0]["valid_loss"] == chosen["valid_loss"] and runs[0]["seconds"] == chosen["seconds"]
    assert (tmp_path / "fewlabels-bert-testament-small.png").read_bytes()[:4] == b"\x89PNG"
    # early stopping: each run scored at its checkpoint of lowest validation loss, a result of its own
    subprocess.run([*few[:12], "0", *few[13:], "--checkpoint", "best"], check=True, capture_output=True, text=True,
                   timeout=900, cwd=ROOT)  # fmt: skip
    stopped = json.loads((tmp_path / "fewlabels-bert-testament-best-small.json").read_text())
    assert stopped["checkpoint"] == "best" and result["checkpoint"] == "last"
    for arm in ARMS:
        (run,) = stopped["arms"][arm]["10"]
        assert 1 <= run["scored_update"] <= 4 and run["scored_valid_loss"] <= run["valid_loss"]
        assert all(r["scored_update"] <= r["updates"] for r in stopped["tuning"]["10"][arm].values())
    bad = subprocess.run([*few[:-2], "--counts", "0"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert bad.returncode == 2 and "--counts must be >= 1 or 'all'" in bad.stderr
    # The budget question: the random arm trains for the pretraining's positions and the fine-tuning's
    spent = 4 * first["config"]["train"]["batch_tokens"]
    alone_updates = 4 + math.ceil(spent / 2048)
    subprocess.run([*few, "--budget", "--seeds", "0"], check=True, capture_output=True, text=True, timeout=900,
                   cwd=ROOT)  # fmt: skip
    budget = json.loads((tmp_path / "budget-bert-testament-small.json").read_text())
    (one,) = budget["runs"]
    assert budget["rates"] == result["rates"] and one["pretraining_positions"] == spent
    tuned, alone = (one["curves"][arm] for arm in ARMS)
    assert tuned[-1][:2] == [4 * 2048, 4] and alone[-1][:2] == [alone_updates * 2048, alone_updates]
    assert tuned[0][:2] == [0, 0]  # where fine-tuning starts: the pretraining's weights, scored
    assert one["best"] == {arm: min(loss for _, _, loss in one["curves"][arm]) for arm in ARMS}
    from benchmarks.crossing import crossing
    from benchmarks.fewlabels import best_so_far

    assert one["crossing_positions"] == crossing(best_so_far(tuned), best_so_far(alone), offset=spent)
    assert [loss for _, _, loss in best_so_far([(0, 0, 3.0), (1, 1, 2.0), (2, 2, 2.5), (3, 3, 1.0)])] == [3, 2, 2, 1]
    assert (tmp_path / "budget-bert-testament-small.png").read_bytes()[:4] == b"\x89PNG"
    untuned = subprocess.run([*few[:-1], str(tmp_path / "none"), "--budget"], capture_output=True, text=True,
                             timeout=600, cwd=ROOT)  # fmt: skip
    assert untuned.returncode == 2 and "--budget takes each arm's rate from" in untuned.stderr
    other = subprocess.run([*few, "--budget", "--counts", "20"], capture_output=True, text=True, timeout=600,
                           cwd=ROOT)  # fmt: skip
    assert other.returncode == 2 and "which has none at 20; run python -m benchmarks fewlabels" in other.stderr
    # another count is added to the result, and a run of other seeds is refused before it trains
    subprocess.run([*few[:10], "all", *few[11:]], check=True, capture_output=True, text=True, timeout=900, cwd=ROOT)
    both = json.loads((tmp_path / "fewlabels-bert-testament-small.json").read_text())
    assert list(both["steps"]) == ["10", "all"] and both["arms"][ARMS[0]]["10"] == result["arms"][ARMS[0]]["10"]
    assert both["tuning"]["10"] == result["tuning"]["10"] and both["measured"]["all"]["counts"] == ["all"]
    seeds = subprocess.run([*few[:12], "0", *few[13:]], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert seeds.returncode == 2 and "holds seeds [0, 1], this run [0]: not one table" in seeds.stderr
    assert json.loads((tmp_path / "fewlabels-bert-testament-small.json").read_text()) == both
    from benchmarks.fewlabels import figure

    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / "fewlabels-bert-testament.json").write_text(json.dumps(result))
    assert figure(committed, tmp_path / "all.png") == [committed / "fewlabels-bert-testament.json"]
    assert (tmp_path / "all.png").read_bytes()[:4] == b"\x89PNG"


def test_the_best_checkpoint_is_the_lowest_validation_loss_and_the_later_ones_go(tmp_path: Path) -> None:
    from attnkit.models.run_dir import MARKER, checkpoint_dir, complete_checkpoints, latest_checkpoint
    from benchmarks.fewlabels import keep_best

    def run_dir(name: str, last: float) -> Path:
        """Validation every 2 updates of 10, a checkpoint at each but update 0's (before
        fine-tuning, lowest here, and no candidate); update 10 scores ``last``, as the final
        evaluation does again."""
        root = tmp_path / name
        losses = {0: 0.1, 2: 3.0, 4: 2.5, 6: 2.5, 8: 2.7, 10: last}
        records = [{"split": "valid", "step": step, "loss": loss} for step, loss in losses.items()]
        records.insert(2, {"split": "train", "step": 2, "loss": 1.0, "seconds": 1.0})
        records.append({"split": "valid", "step": 10, "loss": last, "final": True})
        for step in (2, 4, 6, 8, 10):
            checkpoint_dir(root, step).mkdir(parents=True)
            (checkpoint_dir(root, step) / MARKER).write_text("")
        (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return root

    overfitted = run_dir("overfitted", 2.8)
    assert keep_best(overfitted) == (4, 2.5)  # the earliest of equals
    assert latest_checkpoint(overfitted) == checkpoint_dir(overfitted, 4)
    assert [c.name for c in complete_checkpoints(overfitted)] == ["step-00000002", "step-00000004"]
    assert keep_best(overfitted) == (4, 2.5)
    improving = run_dir("improving", 2.0)
    assert keep_best(improving) == (10, 2.0) and len(complete_checkpoints(improving)) == 5


def grammars(tmp_path: Path, flag: str, timeout: int) -> tuple[str, dict]:
    """``python -m benchmarks grammars FLAG``: its table and its results."""
    pytest.importorskip("llguidance")
    out = tmp_path / "grammars.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks", "grammars", flag, "--out", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, json.loads(out.read_text())


def test_grammars_walks_every_schema_with_each_engine_installed(smollm2_gguf: Path, tmp_path: Path) -> None:
    """``python -m benchmarks grammars --engines-only``: every committed schema compiled and
    walked by llguidance (attnkit's engine), each other engine measured or said missing."""
    stdout, numbers = grammars(tmp_path, "--engines-only", 300)
    schemas = numbers["schemas"]
    assert len(schemas) >= 30 and "validity" not in numbers
    walked = numbers["engines"]["llguidance"]["schemas"]
    assert set(walked) == set(schemas) and all("error" not in s and s["steps"] >= 1 for s in walked.values())
    for name in ("xgrammar", "outlines_core"):
        got = numbers["engines"][name]
        assert (
            got == {"missing": True} if importlib.util.find_spec(name) is None else set(got["schemas"]) == set(schemas)
        )
    assert f"| llguidance {numbers['engines']['llguidance']['version']} | {len(schemas)} of {len(schemas)} |" in stdout


@pytest.mark.slow
def test_grammars_small_answers_with_and_without_schemas_and_under_load(smollm2_gguf: Path, tmp_path: Path) -> None:
    """``python -m benchmarks grammars --small``: SmolLM2's answers in every mode, each judged by
    jsonschema; the step with masks and without; the server under load; all in the table."""
    pytest.importorskip("jsonschema")
    stdout, numbers = grammars(tmp_path, "--small", 600)
    modes = {f"{m}, {c}" for m in ("greedy", "sampled") for c in ("schema", "no schema", "bounded schema")}
    assert set(numbers["validity"]) == {*modes, "speed"}
    assert all(len(rows) == 3 and all(r["tokens"] <= 12 for r in rows) for m, rows in numbers["validity"].items()
               if m != "speed")  # fmt: skip
    assert all(len(runs) == 3 for runs in [*numbers["step"]["seconds"].values(), *numbers["load"]["rounds"].values()])
    assert "valid JSON" in stdout and "concurrent chat requests" in stdout and "rows, no row" in stdout
