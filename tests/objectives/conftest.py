"""Shared fixtures: a 64-token vocabulary (ids 0..36 special, 37..63 ordinary) and tiny models
of each family whose special ids agree with :class:`Specials`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from attnkit.config import preset
from attnkit.data.specials import Specials
from attnkit.models import Model, build_model

VOCAB = 64


@pytest.fixture
def specials() -> Specials:
    return Specials(vocab_size=VOCAB)


@pytest.fixture
def ordinary(specials: Specials) -> list[int]:
    """The ids that are not special."""
    return [i for i in range(VOCAB) if i not in specials.all]


@pytest.fixture
def tiny_model() -> Callable[..., Model]:
    """``tiny_model("gpt-tiny", **changes)``: a seeded tiny model over the 64-token vocabulary."""

    def build(name: str, **changes: Any) -> Model:
        ids: dict[str, Any] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        if preset(name).is_encoder_decoder:
            ids["decoder_start_token_id"] = 1
        torch.manual_seed(0)
        return build_model(preset(name, vocab_size=VOCAB, **{**ids, **changes}))

    return build
