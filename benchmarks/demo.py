"""The demo end to end (issue: performance): ``make demo``'s job — train ``translate-en-fr`` for
its time budget (the model fitted to the machine, as ``make demo`` fits it), then score the
held-out test chapters greedy and beam-4 — timed from start to the last score.
``python -m benchmarks demo [--budget SECONDS]`` (default: the preset's 10 minutes; the whole
run takes about 2 minutes more)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from attnkit import from_pretrained
from attnkit.config import apply_overrides, run_preset
from attnkit.data.prepare import read_texts
from attnkit.machine import keep_freed_memory
from attnkit.models.run_dir import read_run_config
from attnkit.training.fit import fit_for
from attnkit.training.report import translation_report
from attnkit.training.run import train


def run(budget: float | None = None) -> dict[str, Any]:
    keep_freed_memory()  # as attnkit train does
    config = run_preset("translate-en-fr")
    if budget is not None:
        config = apply_overrides(config, {"train.time_budget": str(budget)})
    table, no_fit = fit_for("translate-en-fr", [], config.train.fit, config.train.time_budget)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        progress, _ = train(config, run_dir, progress_bar=False, fit=table, no_fit=no_fit)
        model = from_pretrained(run_dir)
        report = translation_report(model, model.tokenizer, read_texts(config).test, config.data.max_tokens)
        _, record = read_run_config(Path(run_dir))  # the machine record as run.json holds it
    return {
        "machine_record": record,
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
