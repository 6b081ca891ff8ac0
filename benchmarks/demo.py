"""The demo end to end (issue: performance): ``make demo``'s job — train ``translate-en-fr`` for
its time budget, then score the held-out test chapters greedy and beam-4 — timed from start to
the last score. ``python -m benchmarks demo [--budget SECONDS]`` (default: the preset's 10
minutes; the whole run takes about 2 minutes more)."""

from __future__ import annotations

import tempfile
import time

from attnkit import from_pretrained
from attnkit.config import apply_overrides, run_preset
from attnkit.data.prepare import read_texts
from attnkit.training.report import translation_report
from attnkit.training.run import train


def run(budget: float | None = None) -> dict[str, float]:
    config = run_preset("translate-en-fr")
    if budget is not None:
        config = apply_overrides(config, {"train.time_budget": str(budget)})
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        progress, _ = train(config, run_dir, progress_bar=False)
        model = from_pretrained(run_dir)
        report = translation_report(model, model.tokenizer, read_texts(config).test, config.data.max_tokens)
    return {
        "seconds": time.perf_counter() - start,
        "training_seconds": progress.seconds,
        "steps": progress.step,
        "test_sentences": report.sentences,
        "bleu_greedy": report.greedy.bleu,
        "bleu_beam4": report.beam.bleu,
        "chrf_greedy": report.greedy.chrf,
        "chrf_beam4": report.beam.chrf,
        "bleu_tuned": report.tuned.bleu,
        "chrf_tuned": report.tuned.chrf,
    }
