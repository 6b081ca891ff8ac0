"""What the interop tests share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch


def _saved_random(model_class: Any, config: Any, path: Path) -> Any:
    """A ``transformers`` model of ``model_class`` with weights drawn from N(0, 0.2) (seeded;
    larger than its own initialisation, so that every weight shows in the logits), saved to
    ``path`` and returned in eval mode."""
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(path)
    return model


@pytest.fixture
def saved_random() -> Callable[[Any, Any, Path], Any]:
    """:func:`_saved_random`, for the tests that compare a random ``transformers`` model's logits."""
    return _saved_random
