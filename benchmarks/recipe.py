"""The recipe study: named variants of a run preset, each trained in a fresh process for the
same budget over several seeds, then scored on held-out verses (sacreBLEU greedy and beam-4,
chrF). ``python -m benchmarks recipe`` (or ``attnkit bench recipe``)::

    python -m benchmarks recipe --screen schedule --budget 150 --seeds 0
    python -m benchmarks recipe --name lr --budget 150 \\
        --variant "lr-2e-3:train.lr=2e-3" --variant "lr-4e-3:train.lr=4e-3"

A variant is ``NAME:key=value,key=value`` over ``--base`` (itself over the preset); the
screens of docs/translation.md are in :data:`SCREENS`. Each run is one process, one after the
other: wall-clock budgets are comparable only on a quiet machine, so the load average before
and after each run is recorded beside it. Results go to ``--out`` (default
benchmarks/results): ``recipe-NAME.json`` (every run, written as it finishes), ``.md`` (the
table) and ``.png`` (BLEU against minutes of training, per variant).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from attnkit.config import apply_overrides, run_preset
from attnkit.training.fit import FIT_TABLES
from attnkit.training.report import TUNED_BEAM, by_task, new_repeats, repeats_a_trigram

RESULTS = Path(__file__).parent / "results"

# Each screen builds on the best of the one before; docs/translation.md gives the reasons.
_PRE_LN = {"model.norm_first": "true", "model.dropout": "0", "train.warmup": "100", "train.batch_tokens": "1536"}
_COSINE = {**_PRE_LN, "train.schedule": "budget-cosine", "train.lr": "2e-3", "train.min_lr_ratio": "0"}
_NOAM = {**_PRE_LN, "train.schedule": "noam", "train.lr": "0.32"}  # Noam ×0.32: peak 2e-3 at step 100
_NO_SMOOTHING = {**_NOAM, "train.label_smoothing": "0"}
_BEST = {**_NO_SMOOTHING, "train.batch_tokens": "1024"}
SCREENS: dict[str, dict[str, dict[str, str]]] = {
    "schedule": {
        "today: post-LN, dropout 0.1, 3k batches, Noam x0.5": {},
        "pre-LN, dropout 0, 1.5k batches, Noam (peak 2e-3)": _NOAM,
        "... budget-cosine 2e-3": _COSINE,
        "... budget-linear 2e-3": {**_COSINE, "train.schedule": "budget-linear"},
    },
    "norm-lr": {
        "pre-LN 1e-3": {**_COSINE, "train.lr": "1e-3"},
        "pre-LN 4e-3": {**_COSINE, "train.lr": "4e-3"},
        "post-LN 1e-3": {**_COSINE, "model.norm_first": "false", "train.lr": "1e-3"},
    },
    "regularisation": {
        "label smoothing 0": _NO_SMOOTHING,
        "dropout 0.1": {**_NOAM, "model.dropout": "0.1"},
    },
    "batch": {
        "1k-token batches": _BEST,
        "3k-token batches": {**_NO_SMOOTHING, "train.batch_tokens": "3072"},
        "512-token batches": {**_NO_SMOOTHING, "train.batch_tokens": "512"},
    },
    "vocabulary": {
        "4k joint BPE": {**_BEST, "data.vocab_size": "4000"},
    },
    "shape": {
        "4+2 layers": {**_BEST, "model.n_layers": "4", "model.n_decoder_layers": "2"},
        "5+1 layers": {**_BEST, "model.n_layers": "5", "model.n_decoder_layers": "1"},
    },
    "engine": {
        "torch.compile (its compile time inside the budget)": {**_BEST, "train.compile": "true"},
    },
    # The best so far (the preset) measured again beside each of the last screens' variants.
    "curriculum": {
        "the preset (1k batches)": _BEST,
        "first epoch: verses of <= 32 positions": {**_BEST, "data.curriculum_max_tokens": "32"},
        "first epoch: verses of <= 40 positions": {**_BEST, "data.curriculum_max_tokens": "40"},
    },
    "embedding": {
        "no sqrt(d_model) scale (embeddings N(0, 1/d_model))": {**_BEST, "model.scale_embeddings": "false"},
    },
    # The machine fit's table (attnkit.training.fit): its candidates by steps, at several budgets
    # (--steps 500, 1000, 2000, 4000 into one --name fit-translate-en-fr); their scores are the table's.
    "fit": {c.name: c.changes for c in FIT_TABLES["translate-en-fr"].candidates},
    "width": {
        "the preset (d_model 256, 4 heads of 64, d_ff 1024)": _BEST,
        "d_model 192 (3 heads of 64, d_ff 768)": {
            **_BEST,
            "model.d_model": "192",
            "model.n_heads": "3",
            "model.d_ff": "768",
        },
        "d_model 384 (6 heads of 64, d_ff 1536)": {
            **_BEST,
            "model.d_model": "384",
            "model.n_heads": "6",
            "model.d_ff": "1536",
        },
    },
}


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:key=value,key=value`` -> (NAME, {key: value}); ``NAME`` alone has no changes."""
    name, _, changes = text.partition(":")
    if not name:
        raise ValueError(f"variant {text!r} has no name; write NAME:key=value,key=value")
    return name, parse_changes(changes, f"variant {name!r}")


def parse_changes(text: str, what: str) -> dict[str, str]:
    """``key=value,key=value`` -> {key: value}; an item after the first without ``=``, or whose
    key has no section, continues the value before it, a list (``data.tasks=modernize,translate
    English to French``, ``data.tokenizer_weights=fr=3,en=2``)."""
    changes: dict[str, str] = {}
    last = None
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, eq, value = item.partition("=")
        if (not eq or "." not in key) and last is not None:  # fr=3,en=2 continues tokenizer_weights
            changes[last] += f",{item}"
            continue
        if not eq or not key:
            raise ValueError(f"{what}: {item!r} is not key=value (e.g. train.lr=2e-3)")
        last = key.removeprefix("--")
        changes[last] = value
    return changes


def _budget_overrides(changes: dict[str, str], budget: float | None, steps: int | None) -> dict[str, str]:
    """The run's budget: seconds of training, or a number of steps (a budget schedule then
    decays over those steps: its time budget is made too large to bind)."""
    if steps is not None:
        timed = changes.get("train.schedule", "").startswith("budget-")
        return {"train.max_steps": str(steps), "train.time_budget": "1e9" if timed else "null"}
    return {} if budget is None else {"train.time_budget": str(budget)}


def plan(
    preset: str, base: dict[str, str], variants: dict[str, dict[str, str]], budget: float | None, steps: int | None
) -> dict[str, dict[str, str]]:
    """Each variant's complete overrides, every one checked against the config before any run
    starts (a typo is refused at once, with nothing written)."""
    runs = {}
    for name, changes in variants.items():
        merged = {**base, **changes}
        merged.update(_budget_overrides(merged, budget, steps))
        try:
            apply_overrides(run_preset(preset), merged)
        except ValueError as err:
            raise ValueError(f"variant {name!r}: {err}") from None
        runs[name] = merged
    return runs


# --------------------------------------------------------------------------- one run (child)


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one variant and score it: the body of the child process."""
    from attnkit import from_pretrained
    from attnkit.data.prepare import read_texts
    from attnkit.training.evaluate import BEAM
    from attnkit.training.report import score_translations
    from attnkit.training.run import train

    run = apply_overrides(run_preset(spec["preset"]), spec["overrides"])
    out = Path(spec["out"])
    progress, final = train(run, out, progress_bar=False)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    padding = [r["padding"] for r in records if r["split"] == "train" and "padding" in r]
    horizon = [r["horizon"] for r in records if r["split"] == "schedule"]
    model = from_pretrained(out)
    pairs = read_texts(run).get(spec["split"])[: spec.get("sentences")]
    scoring = time.perf_counter()
    greedy = score_translations(model, model.tokenizer, pairs, run.data.max_tokens, num_beams=1)
    beam = score_translations(model, model.tokenizer, pairs, run.data.max_tokens, **BEAM)
    tuned, tuned_hypotheses = {}, None
    if spec.get("tuned"):  # the demo's decoding too
        scores = score_translations(model, model.tokenizer, pairs, run.data.max_tokens, **TUNED_BEAM)
        tuned_hypotheses = scores.hypotheses
        tuned = {
            "bleu_tuned": scores.bleu,
            "chrf_tuned": scores.chrf,
            "outputs_repeating_a_3gram_tuned": new_repeats(scores.hypotheses, [r for _, r in pairs]),
            "samples": scores.hypotheses[:5],
        }
    return {
        "steps": progress.step,
        "horizon": horizon[0] if horizon else None,
        "training_seconds": progress.seconds,
        "target_tokens": progress.tokens,
        "target_tokens_per_s": progress.tokens / max(progress.seconds, 1e-9),
        "padding": statistics.fmean(padding) if padding else None,
        "valid_loss": final["loss"],
        "valid_nll": final.get("nll_rate"),
        "split": spec["split"],
        "sentences": len(pairs),
        "bleu_greedy": greedy.bleu,
        "bleu_beam4": beam.bleu,
        "chrf_greedy": greedy.chrf,
        "chrf_beam4": beam.chrf,
        "scoring_seconds": time.perf_counter() - scoring,
        "signature": greedy.signature,
        "valid_bleu_greedy_200": final.get("bleu_greedy"),  # the first 200 validation verses, as the trainer scores
        "outputs_repeating_a_3gram": new_repeats(greedy.hypotheses, [r for _, r in pairs]),
        "tasks": _per_task(pairs, greedy.hypotheses, beam.hypotheses, tuned_hypotheses) if run.data.tasks else {},
        **tuned,
    }


def _per_task(
    pairs: list[tuple[str, str]], greedy: list[str], beam: list[str], tuned: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """A text-to-text run's scores per task, beside the score of copying the source (and the
    tuned beam's, where it was scored)."""
    beams, tuned_beams = by_task(pairs, beam), by_task(pairs, tuned) if tuned is not None else {}
    extra = {
        task: {"bleu_tuned": s.bleu, "outputs_repeating_a_3gram_tuned": s.new_repeats}
        for task, s in tuned_beams.items()
    }
    return {
        task: {"sentences": s.sentences, "bleu_greedy": s.bleu, "bleu_beam4": beams[task].bleu, "chrf_greedy": s.chrf,
               "bleu_copy": s.copy_bleu, "outputs_repeating_a_3gram": s.new_repeats, **extra.get(task, {})}
        for task, s in by_task(pairs, greedy).items()
    }  # fmt: skip


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """``run_one(spec)`` in a fresh Python process (its own allocator, threads and caches)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = {**spec, "out": str(Path(tmp) / "run")}
        result_file = Path(tmp) / "result.json"
        code = (
            "import json, sys; from benchmarks.recipe import run_one; "
            "json.dump(run_one(json.loads(sys.argv[1])), open(sys.argv[2], 'w'))"
        )
        root = str(Path(__file__).parent.parent)  # the checkout, so that the child imports these benchmarks
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, "-c", code, json.dumps(spec), str(result_file)], env=env)
        if done.returncode != 0:
            raise RuntimeError(f"the run of {spec['overrides']} failed (exit {done.returncode}); its error is above")
        return json.loads(result_file.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- the study (parent)


def study(
    name: str,
    preset: str,
    runs: dict[str, dict[str, str]],
    seeds: list[int],
    split: str,
    out: Path,
    tuned: bool = False,
    sentences: int | None = None,
) -> dict[str, Any]:
    """Run every variant for every seed, one process at a time; ``recipe-NAME.json`` is
    rewritten after each run, so a study cut short keeps what it measured."""
    path = out / f"recipe-{name}.json"
    payload: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"name": name, "runs": []}
    payload.update(preset=preset)
    from attnkit.machine import machine

    for variant, overrides in runs.items():
        budget_label = label(preset, overrides)
        for seed in seeds:
            load_before = os.getloadavg()[0]
            start = time.perf_counter()
            spec = {
                "preset": preset,
                "overrides": {**overrides, "train.seed": str(seed)},
                "split": split,
                "tuned": tuned,
                "sentences": sentences,
            }
            result = _child(spec)
            row = {
                "variant": variant, "seed": seed, "budget": budget_label, "overrides": overrides, **result,
                "wall_seconds": time.perf_counter() - start, "load_before": load_before,
                "load_after": os.getloadavg()[0], "machine": machine(),
            }  # fmt: skip
            payload["runs"] = [
                r for r in payload["runs"] if (r["variant"], r["seed"], r["budget"]) != (variant, seed, budget_label)
            ] + [row]
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
            tasks = "".join(
                f"; {task} {s['bleu_greedy']:.2f} (copy {s['bleu_copy']:.2f})" for task, s in result["tasks"].items()
            )
            print(
                f"{variant} seed {seed} ({budget_label}): {result['steps']} steps, "
                f"{result['target_tokens_per_s']:,.0f} target tok/s, BLEU {result['bleu_greedy']:.2f} greedy / "
                f"{result['bleu_beam4']:.2f} beam-4 on {split}{tasks}; load {load_before:.2f} -> "
                f"{row['load_after']:.2f}",
                flush=True,
            )
    return payload


def label(preset: str, overrides: dict[str, str]) -> str:
    """A run's budget as the table shows it: ``"600 s"``, or ``"2328 steps"`` where its time
    budget is unset or too large to bind."""
    train = apply_overrides(run_preset(preset), overrides).train
    if train.time_budget is None or train.time_budget >= 1e9:
        return f"{train.max_steps} steps"
    return f"{train.time_budget:.0f} s"


def _spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ± {statistics.stdev(values):.2f}"


def table(payload: dict[str, Any]) -> str:
    """The markdown table: one row per (variant, budget), means ± standard deviation over seeds."""
    lines = [
        f"### Recipe study `{payload['name']}` on `{payload['preset']}`",
        "",
        "| variant | budget | seeds | steps | target tok/s | padding | valid NLL | BLEU greedy | BLEU beam-4 "
        "| chrF greedy | chrF beam-4 | split | load before |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in payload["runs"]:
        groups.setdefault((r["variant"], r["budget"]), []).append(r)
    for (variant, budget), rows in groups.items():

        def col(key: str, rows: list[dict[str, Any]] = rows) -> list[Any]:
            return [r[key] for r in rows if r.get(key) is not None]

        cells = [
            variant, budget, ",".join(str(s) for s in col("seed")), f"{statistics.fmean(col('steps')):.0f}",
            f"{statistics.fmean(col('target_tokens_per_s')):,.0f}",
            f"{statistics.fmean(col('padding')):.1%}" if col("padding") else "–",
            _spread(col("valid_nll")) if col("valid_nll") else "–",
            *(_spread(col(key)) for key in ("bleu_greedy", "bleu_beam4", "chrf_greedy", "chrf_beam4")),
            rows[0]["split"], f"{max(col('load_before')):.2f}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(payload: dict[str, Any], path: Path) -> Path:
    """BLEU (the better of greedy and beam-4, mean over seeds) against minutes of training, or
    against updates when every run was budgeted in steps (their minutes depend on the load)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    by_steps = all(r["budget"].endswith(" steps") for r in payload["runs"])
    by_variant: dict[str, dict[float, list[float]]] = {}
    for r in payload["runs"]:
        x = r["steps"] if by_steps else round(r["training_seconds"] / 60, 1)
        by_variant.setdefault(r["variant"], {}).setdefault(x, []).append(max(r["bleu_greedy"], r["bleu_beam4"]))
    for variant, points in by_variant.items():
        xs = sorted(points)
        ys = [statistics.fmean(points[x]) for x in xs]
        errs = [statistics.stdev(points[x]) if len(points[x]) > 1 else 0.0 for x in xs]
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=variant)
    ax.set_xlabel("updates (log scale)" if by_steps else "minutes of training")
    if by_steps:
        ax.set_xscale("log")
    ax.set_ylabel("BLEU (better of greedy, beam-4)")
    ax.set_title(f"recipe study {payload['name']} ({payload['preset']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# Decoding settings measured on a trained run: (name, generate options).
DECODINGS: list[tuple[str, dict[str, Any]]] = [
    ("greedy", {"num_beams": 1}),
    ("greedy, no 3-gram twice", {"num_beams": 1, "no_repeat_ngram_size": 3}),
    *(
        (f"beam 4, α={alpha}" + (f", no {n}-gram twice" if n else ""),
         {"num_beams": 4, "length_penalty": alpha, "length_penalty_style": "gnmt", "no_repeat_ngram_size": n})
        for alpha in (0.6, 1.0)
        for n in (None, 3)
    ),
    ("beam 4, α=1.0, no 3-gram of words twice (the tuned beam)", {**TUNED_BEAM}),
]  # fmt: skip


def decoding_study(run_dir: Path, split: str, out: Path) -> str:
    """Score one trained run's ``split`` with each of :data:`DECODINGS`; write
    ``recipe-decoding.json`` and ``.md``; return the table."""
    from attnkit import from_pretrained
    from attnkit.config import run_from_dict
    from attnkit.data.prepare import read_texts
    from attnkit.machine import machine
    from attnkit.training.report import score_translations

    run = run_from_dict(json.loads((run_dir / "run.json").read_text(encoding="utf-8")))
    model = from_pretrained(run_dir)
    pairs = read_texts(run).get(split)
    rows = []
    for name, options in DECODINGS:
        start = time.perf_counter()
        scores = score_translations(model, model.tokenizer, pairs, run.data.max_tokens, **options)
        repeats = sum(repeats_a_trigram(h) for h in scores.hypotheses)
        rows.append({"decoding": name, "options": options, "bleu": scores.bleu, "chrf": scores.chrf,
                     "outputs_repeating_a_3gram": repeats, "seconds": time.perf_counter() - start})  # fmt: skip
        print(f"{name}: BLEU {scores.bleu:.2f}, chrF {scores.chrf:.2f}, {repeats} outputs repeat a 3-gram", flush=True)
    payload = {"run": str(run_dir), "split": split, "sentences": len(pairs), "rows": rows, "machine": machine()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe-decoding.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    lines = [
        f"### Decoding settings on one trained run ({split}, {len(pairs)} verses)", "",
        "| decoding | BLEU | chrF | outputs repeating a 3-gram | seconds |", "|---|---|---|---|---|",
        *(f"| {r['decoding']} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['outputs_repeating_a_3gram']} "
          f"| {r['seconds']:.0f} |" for r in rows),
    ]  # fmt: skip
    table = "\n".join(lines)
    (out / "recipe-decoding.md").write_text(table + "\n", encoding="utf-8")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks recipe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="translate-en-fr", help="the run preset (default translate-en-fr)")
    parser.add_argument("--screen", choices=sorted(SCREENS), help="a screen of docs/translation.md")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:k=v,...", help="a variant (repeat)")
    parser.add_argument("--base", default="", metavar="k=v,...", help="changes under every variant")
    parser.add_argument("--name", help="the study's name, in the file names (default: the screen's, or 'recipe')")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--budget", type=float, help="seconds of training per run (default: the preset's)")
    budget.add_argument("--steps", type=int, help="optimiser steps per run instead of a time budget")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--split", choices=["valid", "test"], default="valid", help="scored split (default valid)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory (default benchmarks/results)")
    parser.add_argument(
        "--tuned", action="store_true", help="also score the demo's beam (α=1.0, no 3-gram of words twice)"
    )
    parser.add_argument("--sentences", type=int, metavar="N", help="score the split's first N pairs only (default all)")
    parser.add_argument("--decoding", type=Path, metavar="RUN", help="score a trained run's decoding settings instead")
    args = parser.parse_args(argv)
    if args.decoding is not None:
        if not (args.decoding / "run.json").is_file():
            print(f"python -m benchmarks recipe: error: {args.decoding} is not a run directory", file=sys.stderr)
            return 2
        print(decoding_study(args.decoding, args.split, args.out))
        return 0
    try:
        variants = dict(SCREENS[args.screen]) if args.screen else {}
        variants.update(parse_variant(v) for v in args.variant)
        if not variants:
            raise ValueError("no variant to run: pass --screen NAME or --variant NAME:key=value,...")
        if args.sentences is not None and args.sentences < 1:
            raise ValueError(f"--sentences must be >= 1, got {args.sentences}")
        if (args.budget is not None and not args.budget > 0) or (args.steps is not None and args.steps < 1):
            raise ValueError(f"--budget must be > 0 seconds and --steps >= 1, got {args.budget} and {args.steps}")
        try:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"--seeds must be integers separated by commas, got {args.seeds!r}") from None
        if not seeds or min(seeds) < 0:
            raise ValueError(f"--seeds must name at least one seed >= 0, got {args.seeds!r}")
        runs = plan(args.preset, parse_changes(args.base, "--base"), variants, args.budget, args.steps)
    except ValueError as err:
        print(f"python -m benchmarks recipe: error: {err}", file=sys.stderr)
        return 2
    name = args.name or args.screen or "recipe"
    payload = study(name, args.preset, runs, seeds, args.split, args.out, args.tuned, args.sentences)
    markdown = table(payload)
    (args.out / f"recipe-{name}.md").write_text(markdown + "\n", encoding="utf-8")
    print(markdown)
    print(f"plot: {plot(payload, args.out / f'recipe-{name}.png')}")
    return 0
