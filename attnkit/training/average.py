"""Checkpoint averaging: the Transformer paper evaluates "a single model obtained by averaging
the last 5 checkpoints"."""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit.models import Model, load_saved
from attnkit.models.run_dir import complete_checkpoints


def average_checkpoints(run_dir: str | Path, last: int) -> tuple[Model, list[Path]]:
    """A model whose every parameter is the mean over the run's last ``last`` complete
    checkpoints (fewer if the run has fewer); also returns which were used."""
    if last < 1:
        raise ValueError(f"--last must be >= 1, got {last}")
    used = complete_checkpoints(Path(run_dir))[-last:]
    if not used:
        raise FileNotFoundError(f"{run_dir} has no complete checkpoint to average")
    model = load_saved(used[0])
    params = dict(model.named_parameters())
    with torch.no_grad():
        sums = {name: p.detach().double().clone() for name, p in params.items()}
        for path in used[1:]:
            for name, p in load_saved(path).named_parameters():
                sums[name] += p.double()
        for name, p in params.items():
            p.copy_((sums[name] / len(used)).to(p.dtype))
    return model, used
