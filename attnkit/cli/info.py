"""``attnkit info``: a run's or model's config, size and training summary."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "info",
        help="a run's or model's config, size and training summary",
        description="Print a model's shape and parameter count and, for a run directory, its objective, "
        "optimiser, checkpoints, training curve and last evaluation.",
        epilog="example: attnkit info runs/mt",
    )
    parser.add_argument("directory", metavar="DIR", help="a run directory or a model directory")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    import attnkit
    from attnkit.models.run_dir import RUN_CONFIG, complete_checkpoints, read_run_config
    from attnkit.training.trainer import METRICS

    directory = Path(args.directory)
    model = attnkit.from_pretrained(directory)
    cfg = model.config
    print(f"{directory}: {cfg.family}, {model.num_parameters():,} parameters")
    layers = f"{cfg.n_layers}+{cfg.decoder_layers}" if cfg.is_encoder_decoder else f"{cfg.n_layers}"
    norm = "pre" if cfg.norm_first else "post"
    print(f"  d_model {cfg.d_model}, d_ff {cfg.d_ff}, heads {cfg.n_heads}, layers {layers},")
    print(f"  vocabulary {cfg.vocab_size}, positions {cfg.positional}, {norm}-LN")
    if (directory / RUN_CONFIG).exists():
        run, machine = read_run_config(directory)
        train, data = run.train, run.data
        print(f"  objective {train.objective or 'the family default'}, data {data.corpus} {' '.join(data.path)}")
        optimiser = f"{train.optimizer} lr {train.lr} schedule {train.schedule} warmup {train.warmup}"
        print(f"  optimiser {optimiser}, batch {train.batch_tokens} tokens, precision {train.precision}")
        if machine is not None:  # what the run chose for the machine it started on
            from attnkit.training.fit import MachineRecord

            for line in MachineRecord(**machine).describe():
                print(f"  {line}")
        checkpoints = complete_checkpoints(directory)
        print(f"  checkpoints: {', '.join(p.name for p in checkpoints) or 'none'}")
    if (directory / METRICS).exists():
        records = [json.loads(line) for line in (directory / METRICS).read_text(encoding="utf-8").splitlines()]
        trained = [r for r in records if r["split"] == "train"]
        if trained:
            first, last = trained[0], trained[-1]
            print(f"  training: step {first['step']} loss {first['loss']:.3f} -> step {last['step']} loss "
                  f"{last['loss']:.3f}, {last.get('seconds', 0):.0f} s")  # fmt: skip
        valid = [r for r in records if r["split"] == "valid"]
        if valid:
            shown = {k: v for k, v in valid[-1].items() if k not in ("split", "final") and isinstance(v, float | int)}
            print("  last evaluation: " + ", ".join(f"{k} {v:.4g}" for k, v in shown.items()))
    return 0
