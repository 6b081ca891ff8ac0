"""``python -m benchmarks SUITE [--small] [--out FILE]``: run a suite, print a Markdown table.

Suites: ``peak`` (the machine's fp32 and bf16 matmul FLOP/s, the limit for MFU), ``forward``
(forward pass), ``generation`` (greedy and beam-4), ``latency`` (ms per new token as the prefix
grows), ``training`` (train steps and MFU), ``attention`` (time and memory of the math and
fused paths as n grows to 16k), ``gpu`` (the bf16 suite on one accelerator: benchmarks/gpu.sh),
``translation`` (BLEU at equal wall time vs a MarianMT of the same size), ``lm`` (held-out
perplexity at equal wall time, gpt-bible's model vs a transformers GPT-2 of the same size), ``demo`` (make demo's
job end to end: time and BLEU), ``trainspeed`` (training throughput at the demo's shape against an
earlier commit, side by side), ``recipe`` (variants of a run preset over seeds and budgets, each
in a fresh process: ``python -m benchmarks recipe --help``), ``crossing`` (a family's own pretraining,
T5's span corruption or BERT's masked LM, then its task, against the task alone, as curves over
total training time: where they cross), ``pretrain`` (a family's own pretraining on every Bible, an hour,
resumable: ``python -m benchmarks pretrain --help``), ``fewlabels`` (fine-tuning on 100, 1,000 and all labels from
that pretraining and from random weights, over seeds), ``decoding`` (per weight
format against transformers and CTranslate2: batch-1 GPT-2 greedy with its bandwidth floor,
Marian-shaped batch-32 beam-4, and a trained translator's BLEU with ``--run DIR``),
``smollm2`` (the real SmolLM2-135M, batch-1 greedy per format), ``blocks`` (the block kernel
per product against fp32, by activation rows: where ``kernels.DENSE_ROWS`` comes from), ``embed`` (MiniLM sentence
embeddings against sentence-transformers' pooling on transformers), ``serve`` (``attnkit serve``
under 1, 8 and 32 concurrent clients against the same requests one at a time), ``data`` (preparing a corpus
of one's own into the dataset store and training from it, at 100 MB and 1 GB), ``grammars``
(the grammar engines constrained decoding could use, side by side on SmolLM2's tokenizer and
benchmarks/schemas.json), ``startup`` (the command
line's start-up:
``--help`` and one ``translate`` against ``import torch`` + the model load).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks import (
    attention,
    blocks,
    crossing,
    data,
    decoding,
    demo,
    embed,
    fastpaths,
    fewlabels,
    forward,
    generation,
    gpu,
    grammars,
    lm,
    pretrain,
    recipe,
    serve,
    startup,
    training,
    trainspeed,
    translation,
)
from benchmarks.common import machine, report

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
SUITES = {
    "blocks": (blocks.run, "The block kernel per product against fp32 F.linear, by rows (2 threads)"),
    "embed": (embed.run, "Sentence embeddings, real all-MiniLM-L6-v2 weights (2 threads)"),
    "fastpaths": (fastpaths.run, "Fast paths before they are built: attnkit's three projections vs one fused"),
    "forward": (forward.run, "Forward throughput, fp32, identical weights"),
    "generation": (generation.run, "Generation throughput, fp32, identical weights"),
    "training": (training.run, "Training step throughput (forward, backward, AdamW), fp32, identical weights"),
}


def _write(out: Path | None, payload: dict) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": machine(), **payload}, indent=2) + "\n")


def _latency(out: Path | None, repeats: int) -> str:
    table = generation.per_token_latency(repeats=repeats)
    lines = [
        "### Milliseconds per new token after a prefix (greedy, batch 1, d=256, 4 layers)",
        "",
        "| prefix | attnkit ms/token | transformers ms/token |",
        "|---|---|---|",
        *(f"| {p} | {row['attnkit']:.2f} | {row['transformers']:.2f} |" for p, row in table.items()),
    ]
    _write(out, {"ms_per_token": table})
    return "\n".join(lines)


def _peak(out: Path | None, repeats: int) -> str:
    from attnkit.machine import native_bf16

    # bf16 where the CPU computes it natively: elsewhere it is emulated, slower than fp32 (a 2048²
    # product takes seconds) and no path of attnkit's uses it.
    measured = {name: dtype for name, dtype in PRECISIONS.items() if name != "bf16" or native_bf16(torch.device("cpu"))}
    peaks = {name: training.matmul_peak(repeats=repeats, dtype=dtype) for name, dtype in measured.items()}
    read = decoding.bandwidth(repeats=repeats)
    _write(out, {"matmul_flops_per_second": peaks, "memory_read_bytes_per_second": read})
    return "\n".join([
        "### Matmul peak (2048² product, best of repeats) and memory read bandwidth", "",
        "| precision | GFLOP/s |", "|---|---|",
        *(f"| {name} | {flops / 1e9:,.0f} |" for name, flops in peaks.items()),
        *(["| bf16 | not native here: not measured |"] if "bf16" not in peaks else []),
        "", f"Memory read bandwidth (a sum over 512 MB, median): {read / 1e9:.1f} GB/s",
    ])  # fmt: skip


def _compile_seconds(floor: dict) -> str:
    return f"{floor['compile_seconds']:.1f}" if "compile_seconds" in floor else "—"


def _pays_off(floor: dict) -> str:
    if "compile_seconds" not in floor:
        return "—"
    tokens = floor.get("pays_off_after_tokens")
    return "never (not faster)" if tokens is None else f"{tokens:,.0f} tokens"


def _compiled(row: dict) -> str:
    return f"yes ({row['graphs']}, {row['compile_seconds']:.0f} s)" if row["compiled"] else "no"


def _floors(floors: dict) -> list[str]:
    """The table of each format's floor against its measured time per token (none without case 1)."""
    if not floors:
        return []
    return [
        f"### Batch-1 floors ({floors['bandwidth_gb_s']:.0f} GB/s read bandwidth)", "",
        "| format | weight bytes a token reads | floor ms/token | measured ms/token | × the floor | compile s "
        "| the compile pays off after |",
        "|---|---|---|---|---|---|---|",
        *(f"| {fmt} | {f['weight_bytes'] / 1e6:,.0f} MB | {f['floor_ms']:.2f} | {f['ms_per_token']:.2f} | "
          f"{f['ms_per_token'] / f['floor_ms']:.2f} | {_compile_seconds(f)} | {_pays_off(f)} |"
          for fmt, f in floors.items() if isinstance(f, dict) and "floor_ms" in f),
        *_default_path(floors.get("default path", {})),
    ]  # fmt: skip


def _default_path(paths: dict) -> list[str]:
    """How each default path reached its compiled step: eager calls first (compile="auto")."""
    if not paths:
        return []
    return [
        "", "### The default path: eager calls, then the kept step", "",
        "| path | eager calls before the step | their seconds | the step | a new process: import and load "
        "| its first call |",
        "|---|---|---|---|---|---|",
        *(f"| {name} | {p['calls_before_compiled']} | {sum(p['seconds_of_those_calls']):.1f} s | {p['step']} | "
          f"{p['new_process_import_and_load_s']:.2f} s | {p['new_process_first_call_s']:.2f} s |"
          for name, p in paths.items()),
    ]  # fmt: skip


def _smollm2(out: Path | None, repeats: int) -> str:
    results, floors, scores, skipped = decoding.smollm2(repeats)
    lines = [report("SmolLM2-135M batch-1 greedy, real weights (2 threads each)", results, None), "", *_floors(floors)]
    tokens = next(iter(scores.values()))["tokens"]
    lines += [
        "", f"### Quality per format: held-out King James ({tokens:,} tokens) and greedy tokens", "",
        "| format | perplexity | × fp32's | first greedy tokens equal to fp32's (of 32) |", "|---|---|---|---|",
        *(f"| {fmt} | {q['perplexity']:.3f} | {q['ratio']:.4f} | {q['greedy_equal_to_fp32']} |"
          for fmt, q in scores.items()),
    ]  # fmt: skip
    if "llama.cpp" in floors:
        built = floors["llama.cpp"]
        same = built.get("same_tokens_as_attnkit_gguf")
        lines += [
            "", f"- llama.cpp: llama-cpp-python {built['version']}, {built['ms_per_token']:.2f} ms/token"
            + (f", the same greedy tokens as attnkit gguf for {same} of {decoding.NEW}" if same is not None else "")
            + f"; {built['system']}"
        ]  # fmt: skip
    return _decoding_report(out, lines, results, floors, skipped, quality=scores)


def _decoding(out: Path | None, small: bool, repeats: int, run_dir: Path | None, cases: tuple[str, ...]) -> str:
    results, floors, demo, skipped = decoding.run(repeats=repeats, small=small, run_dir=run_dir, cases=cases)
    lines = [report("Decoding per weight format, side by side (2 threads each)", results, None), "", *_floors(floors)]
    if demo:
        lines += [
            "", f"### The trained translator over its {demo[0]['sentences']} held-out test sentences", "",
            "| format | beams | compiled step (graphs, compile s) | seconds | BLEU | chrF |",
            "|---|---|---|---|---|---|",
            *(f"| {r['format']} | {r['beams']} | {_compiled(r)} | {r['seconds']:.1f} | {r['bleu']:.2f} | "
              f"{r['chrf']:.2f} |" for r in demo),
        ]  # fmt: skip
    return _decoding_report(out, lines, results, floors, skipped, demo=demo)


def _decoding_report(
    out: Path | None, lines: list[str], results: list, floors: dict, skipped: dict[str, str], **extra: object
) -> str:
    """The decoding suites' tables with what was skipped and why; their numbers to ``out``."""
    lines = [*lines, *(f"- skipped {what}: {why}" for what, why in skipped.items())]
    payload = {"results": [asdict(r) | {"ratio": r.ratio} for r in results], "floors": floors, **extra}
    _write(out, payload | {"skipped": skipped})
    return "\n".join(lines)


def _attention(out: Path | None, small: bool, repeats: int) -> str:
    table = attention.run(small=small, repeats=repeats)
    _write(out, {"attention": table})
    lines = [
        "### Causal self-attention, 2 heads × 64, one call: math path vs fused (SDPA)",
        "",
        "| n | math ms | fused ms | math MiB | fused MiB | fused / math memory |",
        "|---|---|---|---|---|---|",
    ]
    for n, row in table.items():
        math, fused = row["math"], row["fused"]
        share = fused["extra_bytes"] / max(math["extra_bytes"], 1)
        lines.append(
            f"| {n} | {1e3 * math['seconds']:,.1f} | {1e3 * fused['seconds']:,.1f} | "
            f"{math['extra_bytes'] / 2**20:,.0f} | {fused['extra_bytes'] / 2**20:,.0f} | {share:.3f} |"
        )
    return "\n".join(lines)


def _gpu(out: Path | None, small: bool, repeats: int, device: str) -> str:
    result = gpu.run(device=device, small=small, repeats=repeats)
    comparison = result["training"]
    _write(out, {**result, "training": asdict(comparison) | {"ratio": comparison.ratio}})
    lines = [
        f"### On {result['device']}: bf16 matmul peak {result['bf16_matmul_peak'] / 1e12:,.1f} TFLOP/s",
        "",
        report("Training step, bf16 autocast, identical weights", [comparison], None),
    ]
    if result["attention_peak_bytes"]:
        lines += ["", "| n | math path MiB | fused path MiB |", "|---|---|---|"]
        for n, row in result["attention_peak_bytes"].items():
            lines.append(f"| {n} | {row['math'] / 2**20:,.0f} | {row['fused'] / 2**20:,.0f} |")
    return "\n".join(lines)


def _record_lines(record: dict | None) -> list[str]:
    from attnkit.training.fit import MachineRecord

    return [] if record is None else MachineRecord(**record).describe()


def _demo(out: Path | None, budget: float | None) -> str:
    result = demo.run(budget)
    _write(out, {"demo": result})
    return "\n".join([
        "### The demo end to end (translate-en-fr: train for the budget, score the test chapters)", "",
        *(f"{line}  " for line in _record_lines(result["machine_record"])), "",
        "| total s | training s | steps | BLEU greedy | BLEU beam-4 | BLEU tuned beam | chrF greedy | chrF beam-4 "
        "| chrF tuned beam |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {result['seconds']:.0f} | {result['training_seconds']:.0f} | {result['steps']} "
        f"| {result['bleu_greedy']:.2f} | {result['bleu_beam4']:.2f} | {result['bleu_tuned']:.2f} "
        f"| {result['chrf_greedy']:.1f} | {result['chrf_beam4']:.1f} | {result['chrf_tuned']:.1f} |",
    ])  # fmt: skip


def _trainspeed(out: Path | None, baseline: str, small: bool, repeats: int, precisions: str, steps: int) -> str:
    result = trainspeed.run(
        baseline, steps=steps, repeats=repeats, small=small, precisions=tuple(precisions.split(","))
    )
    _write(out, {"trainspeed": result})
    about = result["machine"]
    lines = [
        f"### Training throughput of the demo's model: this tree vs {baseline} (median of runs in turn; "
        f"CPU class {about['cpu_class']}, ATen {about['aten_cpu_capability']} kernels)", "",
        "| precision | tree | target tokens/s (median) | each run | MFU of the precision's matmul peak |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    for precision, numbers in result["precisions"].items():
        for side, median in numbers["median"].items():
            each = ", ".join(f"{r:,.0f}" for r in numbers["target_tokens_per_s"][side])
            lines.append(f"| {precision} | {side} | {median:,.0f} | {each} | {numbers['mfu'][side]:.0%} |")
    lines.append("")
    lines += [f"{precision} ratio: **{numbers['ratio']:.2f}×**" for precision, numbers in result["precisions"].items()]
    lines += [f"{precision}: not measured ({why})" for precision, why in result["skipped"].items()]
    return "\n".join(lines)


def _translation(out: Path | None, small: bool, budget: float | None) -> str:
    curves = translation.run(small=small, budget=budget)
    names = list(curves)
    lines = [
        "### Greedy BLEU on 200 held-out verses against minutes of training (same data, batches, budget)",
        "",
        "| minutes | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for points in zip(*curves.values(), strict=False):
        lines.append(f"| {points[0][0]:.1f} | " + " | ".join(f"{bleu:.2f}" for _, bleu in points) + " |")
    _write(out, {"curves": curves})
    return "\n".join(lines)


def _lm(out: Path | None, small: bool, budget: float | None) -> str:
    result = lm.run(small=small, budget=budget)
    names = list(result["curves"])
    steps = ", ".join(f"{name} {n:,} steps" for name, n in result["steps"].items())
    lines = [
        f"### Held-out perplexity against minutes of training (same data, batches, budget; {steps})",
        "",
        "| minutes | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for points in zip(*result["curves"].values(), strict=False):
        lines.append(f"| {points[0][0]:.1f} | " + " | ".join(f"{ppl:.1f}" for _, ppl in points) + " |")
    lines += ["", "Greedy continuations:", ""]
    for name, samples in result["samples"].items():
        lines += [f"- {name}: " + " / ".join(f"*{text}*" for text in samples.values())]
    _write(out, {"lm": result})
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["recipe"]:  # its own options: variants, seeds, budgets
        sys.exit(recipe.main(sys.argv[2:]))
    if sys.argv[1:2] == ["crossing"]:  # its own options: updates of each phase
        sys.exit(crossing.main(sys.argv[2:]))
    if sys.argv[1:2] == ["grammars"]:  # the engines constrained decoding could use, on SmolLM2's tokenizer
        sys.exit(grammars.main(sys.argv[2:]))
    if sys.argv[1:2] == ["fewlabels"]:  # its own options: the task, label counts, seeds
        sys.exit(fewlabels.main(sys.argv[2:]))
    if sys.argv[1:2] == ["pretrain"]:  # its own options: the family, its updates and run directory
        sys.exit(pretrain.main(sys.argv[2:]))
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    others = ["peak", "attention", "latency", "translation", "lm", "gpu", "demo", "recipe", "crossing", "trainspeed"]
    others += ["pretrain", "fewlabels", "grammars"]
    others += ["startup", "data"]
    others += ["decoding", "smollm2", "serve"]
    parser.add_argument("suite", choices=[*sorted(SUITES), *others])
    parser.add_argument("--small", action="store_true", help="tiny shapes (a quick check that it runs)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the raw numbers as JSON")
    parser.add_argument(
        "--compile", action="store_true",
        help="forward, training: torch.compile attnkit's model",
    )  # fmt: skip
    parser.add_argument(
        "--step", choices=list(serve.STEPS), default="auto",
        help="serve: the server's decoding step: its default (auto), --compile (compiled) or --no-compile (eager)",
    )  # fmt: skip
    parser.add_argument("--device", default="cuda", help="gpu: the device to run on (cpu with --small to try it)")
    parser.add_argument("--budget", type=float, help="translation, lm, demo: seconds of training (each side)")
    parser.add_argument("--baseline", default="d548709", help="trainspeed: the commit to compare with")
    parser.add_argument("--precision", default="fp32,bf16", help="trainspeed: precisions to train in (comma-separated)")
    parser.add_argument(
        "--steps", type=int, default=300, help="trainspeed: steps a run logs (the first 20 are left out of the rate)"
    )
    parser.add_argument("--sizes", help="data: corpus sizes in MB, comma-separated (default 100,1000)")
    parser.add_argument(
        "--dir", type=Path, help="data: where the generated corpora are kept (default: a temporary one)"
    )
    parser.add_argument("--run", type=Path, help="decoding: a trained translator's run directory, scored per format")
    parser.add_argument("--cases", default="gpt2,marian", help="decoding: the cases to run (gpt2, marian; both)")
    parser.add_argument("--model", type=Path, default=Path("runs/smollm2"), help="serve: the model (make smollm2)")
    parser.add_argument("--weights", default="fp32", help="serve: the weight format")
    args = parser.parse_args()
    if args.suite == "demo":
        print(_demo(args.out, args.budget))
        return
    if args.suite == "smollm2":
        print(_smollm2(args.out, args.repeats))
        return
    if args.suite == "decoding":
        print(_decoding(args.out, args.small, args.repeats, args.run, tuple(args.cases.split(","))))
        return
    if args.suite == "data":
        sizes = tuple(float(s) for s in args.sizes.split(",")) if args.sizes else None
        result = data.run(small=args.small, sizes=sizes, directory=args.dir)
        _write(args.out, {"data": result})
        print(data.table(result))
        return
    if args.suite == "serve":
        result = serve.run(args.model, weights=args.weights, small=args.small, step=args.step)
        _write(args.out, {"serve": result})
        print(serve.table(result))
        return
    if args.suite == "startup":
        results = startup.run(repeats=args.repeats)
        _write(args.out, {"startup": results})
        print(startup.table(results))
        return
    if args.suite == "trainspeed":
        print(_trainspeed(args.out, args.baseline, args.small, min(args.repeats, 3), args.precision, args.steps))
        return
    if args.suite == "gpu":
        print(_gpu(args.out, args.small, args.repeats, args.device))
        return
    if args.suite == "peak":
        print(_peak(args.out, args.repeats))
        return
    if args.suite == "attention":
        print(_attention(args.out, args.small, min(args.repeats, 3)))
        return
    if args.suite == "latency":
        print(_latency(args.out, args.repeats))
        return
    if args.suite == "translation":
        print(_translation(args.out, args.small, args.budget))
        return
    if args.suite == "lm":
        print(_lm(args.out, args.small, args.budget))
        return
    run, title = SUITES[args.suite]
    options = {"compile": True} if args.compile else {}
    if args.compile and args.suite not in ("forward", "training"):
        parser.error("--compile applies to the forward, training and serve suites")
    print(
        report(
            title + (", attnkit compiled" if args.compile else ""),
            run(repeats=args.repeats, small=args.small, **options),
            args.out,
        )
    )


if __name__ == "__main__":
    main()
