"""Start-up of the command line, each command in a fresh process as a user runs it: ``attnkit
--help``, ``attnkit train --help``, and ``attnkit translate`` of one sentence against its
floor, ``import torch`` plus loading the same model (``attnkit.from_pretrained``).

The commands alternate, ``repeats`` times each, so a busy machine slows them alike; the median
and the range of each are reported. Targets (issue 14): both ``--help`` <= 0.3 s; ``translate``
no slower than its floor.

``python -m benchmarks startup [--repeats N] [--out FILE]``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ATTNKIT = [sys.executable, "-m", "attnkit"]
SENTENCE = "In the beginning God created the heavens and the earth."


def _tiny_translator(directory: Path) -> Path:
    """A randomly initialised 3+3 d=256 translator (the demo's shape) with an 8k BPE
    tokenizer trained on a few lines: what loading and one decode cost, not what it says."""
    from attnkit.config import run_preset
    from attnkit.data.tokenizer import train_tokenizer
    from attnkit.models import build_model

    run = run_preset("translate-en-fr")
    tokenizer = train_tokenizer([SENTENCE, "Et Dieu dit: Que la lumière soit!"] * 50, 1000)
    model = build_model(run.model.replace(vocab_size=tokenizer.get_vocab_size(), pad_token_id=0, bos_token_id=1,
                                          eos_token_id=2, decoder_start_token_id=1))  # fmt: skip
    model.tokenizer = tokenizer
    model.save_pretrained(directory / "model")
    return directory / "model"


def _seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def run(repeats: int = 7) -> dict[str, dict[str, float]]:
    """Median, min and max seconds of each command."""
    with tempfile.TemporaryDirectory() as tmp:
        model = _tiny_translator(Path(tmp))
        commands = {
            "attnkit --help": [*ATTNKIT, "--help"],
            "attnkit train --help": [*ATTNKIT, "train", "--help"],
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
            "import torch + from_pretrained": [
                sys.executable, "-c", f"import torch, attnkit; attnkit.from_pretrained({str(model)!r})",
            ],
            "attnkit translate (one sentence, greedy)": [
                *ATTNKIT, "translate", "--model", str(model), "--num-beams", "1", "--max-new-tokens", "20", SENTENCE,
            ],
        }  # fmt: skip
        times: dict[str, list[float]] = {name: [] for name in commands}
        for argv in commands.values():  # warm the page cache once
            _seconds(argv)
        for _ in range(repeats):
            for name, argv in commands.items():
                times[name].append(_seconds(argv))
    return {
        name: {"median": statistics.median(t), "min": min(t), "max": max(t), "repeats": len(t)}
        for name, t in times.items()
    }


def table(results: dict[str, dict[str, float]]) -> str:
    lines = [
        "### Start-up: seconds per command, each in a fresh process (median, min-max)",
        "",
        "| command | seconds | min-max |",
        "|---|---|---|",
        *(f"| {name} | {r['median']:.3f} | {r['min']:.3f}-{r['max']:.3f} |" for name, r in results.items()),
    ]
    floor = results["import torch + from_pretrained"]["median"]
    translate = results["attnkit translate (one sentence, greedy)"]["median"]
    lines += ["", f"translate over its floor (import torch + load): **{translate / floor:.2f}x**"]
    return "\n".join(lines)
