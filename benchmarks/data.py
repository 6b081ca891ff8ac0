"""Training on a corpus of one's own as it grows: preparing the dataset store, starting again
from it, and training from it, on generated corpora of 100 MB and 1 GB (plain text for
gpt-bible's model, TSV pairs for the demo translator's), each step a fresh process as a user
runs it.

Per corpus: ``attnkit prepare`` (seconds, MB/s, peak RSS); then a training run on the prepared
store, in a new process: the seconds from its start to the end of its first step, its peak RSS,
and its target tokens per second over the steps after the first ``WARM`` (the trainer's own
log records). The corpora repeat shuffled Bible verses (generated, never committed); the
tokenizer's text is sampled from the corpus (``store.TOKENIZER_SAMPLE_BYTES``).

``python -m benchmarks data [--small] [--sizes 100,1000] [--dir DIR] [--out FILE]``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESETS = {"text": "gpt-bible", "pairs": "translate-en-fr"}
STEPS, WARM = 40, 10
SMALL_SIZES = (1.0, 10.0)

# A training run in a child process: the wall time from its start (passed in) to the end of its
# first step, then the run's counts, as one JSON line.
CHILD = r"""
import json, sys, time
start = float(sys.argv[1])
from attnkit.training import trainer
first = {}
step = trainer.Trainer.step
def timed(self, batches):
    out = step(self, batches)
    first.setdefault("first_step_seconds", time.time() - start)
    return out
trainer.Trainer.step = timed
from attnkit.config import apply_overrides, run_preset
from attnkit.training.run import train
run = apply_overrides(run_preset(sys.argv[2]), json.loads(sys.argv[3]))
progress, _ = train(run, sys.argv[4], progress_bar=False)
print(json.dumps(first | {"steps": progress.step}))
"""


def generate(path: Path, kind: str, megabytes: float, seed: int = 0) -> Path:
    """``megabytes`` of shuffled Bible verses: lines of English and French, or
    English<TAB>French pairs, written once (kept where it already has that size)."""
    size = int(megabytes * 1e6)
    if path.is_file() and path.stat().st_size >= size:
        return path
    from attnkit.data import corpora

    if kind == "pairs":
        rows = [f"{e}\t{f}" for part in corpora.bible_pairs("4", "l").__dict__.values() for e, f in part]
    else:
        rows = [text for code in ("k", "4", "l") for _, text in corpora.bible_verses(code)]
    rng = random.Random(seed)
    written = 0
    with path.open("w", encoding="utf-8") as file:
        while written < size:
            rng.shuffle(rows)
            for row in rows:
                file.write(row + "\n")
                written += len(row.encode()) + 1
                if written >= size:
                    break
    return path


def measured(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(seconds, peak RSS in MB, stdout) of ``command`` run to its end in a process of its own."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} ... failed:\n{err[-3000:]}")
    peak = peak_rss_mb(err)
    return seconds, peak, out


def peak_rss_mb(stderr: str) -> float:
    """The peak RSS that ``/usr/bin/time -f`` wrote last on stderr, in MB."""
    line = stderr.strip().splitlines()[-1]
    return int(line.removeprefix("peak_rss_kb=")) / 1000


def timed(command: list[str]) -> list[str]:
    """``command`` under GNU time, its peak RSS written last on stderr; Python's own counter
    where GNU time is not installed."""
    if shutil.which("time") and Path("/usr/bin/time").is_file():
        return ["/usr/bin/time", "-f", "peak_rss_kb=%M", *command]
    wrapper = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]).returncode; "
        "print(f'peak_rss_kb={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', file=sys.stderr); sys.exit(r)"
    )
    return [sys.executable, "-c", wrapper, *command]


def one(kind: str, corpus: Path, stores: Path, runs: Path, steps: int) -> dict:
    """Prepare ``corpus`` into a fresh store, then train from it in a new process."""
    env = os.environ | {"ATTNKIT_STORE": str(stores)}
    preset = PRESETS[kind]
    options = ["--data.corpus=files", f"--data.path={corpus}"]
    seconds, rss, out = measured(timed([sys.executable, "-m", "attnkit", "prepare", "--preset", preset, "--quiet",
                                        *options]), env)  # fmt: skip
    text_mb = corpus.stat().st_size / 1e6
    overrides = {"data.corpus": "files", "data.path": str(corpus), "train.max_steps": str(steps),
                 "train.time_budget": "null", "train.log_every": "5", "train.checkpoint_every": str(10 * steps),
                 "train.eval_batches": "2"}  # fmt: skip
    run_dir = runs / f"{kind}-{corpus.stat().st_size}"
    shutil.rmtree(run_dir, ignore_errors=True)
    child = [sys.executable, "-c", CHILD, str(time.time()), preset, json.dumps(overrides), str(run_dir)]
    train_seconds, train_rss, train_out = measured(timed(child), env)
    first = json.loads(train_out.strip().splitlines()[-1])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in records if r.get("split") == "train" and r["step"] > WARM]
    return {
        "kind": kind,
        "preset": preset,
        "text_mb": round(text_mb, 1),
        "prepare_seconds": round(seconds, 1),
        "prepare_mb_per_s": round(text_mb / seconds, 2),
        "prepare_peak_rss_mb": round(rss),
        "first_step_seconds": round(first["first_step_seconds"], 2),
        "train_peak_rss_mb": round(train_rss),
        "train_seconds": round(train_seconds, 1),
        "target_tokens_per_s": round(statistics.median(rates)) if rates else None,
        "store_mb": round(sum(f.stat().st_size for f in stores.rglob("*") if f.is_file()) / 1e6, 1),
        "prepare_output": out.strip().splitlines(),
    }


def run(small: bool = False, sizes: tuple[float, ...] | None = None, directory: Path | None = None) -> dict:
    """Every corpus kind at every size, in turn; corpora kept in ``directory`` (a temporary
    one by default), stores and runs in a temporary one."""
    from attnkit.machine import cpu_class

    sizes = sizes or (SMALL_SIZES if small else (100.0, 1000.0))
    steps = 12 if small else STEPS
    keep = directory is not None
    directory = Path(directory or tempfile.mkdtemp(prefix="attnkit-data-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for kind in PRESETS:
            for megabytes in sizes:
                corpus = generate(directory / f"{kind}-{megabytes:g}mb.txt", kind, megabytes)
                with tempfile.TemporaryDirectory(prefix="attnkit-data-bench-") as scratch:
                    rows.append(one(kind, corpus, Path(scratch) / "stores", Path(scratch) / "runs", steps))
    finally:
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)
    load = os.getloadavg()
    return {"rows": rows, "cpu_class": cpu_class("auto").name, "load_average": load, "steps": steps}


def table(result: dict) -> str:
    lines = [
        f"### Preparing and training on a corpus of one's own (2 cores, CPU class {result['cpu_class']}, "
        f"load {result['load_average'][0]:.2f} at the end)", "",
        "| corpus | text MB | prepare s | prepare MB/s | prepare peak RSS MB | store MB | second run: first step s "
        "| training peak RSS MB | target tokens/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in result["rows"]:
        lines.append(
            f"| {r['kind']} ({r['preset']}) | {r['text_mb']:,.0f} | {r['prepare_seconds']:.1f} | "
            f"{r['prepare_mb_per_s']:.2f} | {r['prepare_peak_rss_mb']:,} | {r['store_mb']:,.0f} | "
            f"{r['first_step_seconds']:.1f} | {r['train_peak_rss_mb']:,} | {r['target_tokens_per_s'] or 0:,} |"
        )
    return "\n".join(lines)
