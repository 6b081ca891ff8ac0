"""The logit adjustments of OpenAI's sampling fields, applied before each choice: a frequency
and a presence penalty on the tokens generated so far, and a fixed bias per token."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from attnkit.generation.continuous import Adjust


def penalties(frequency: float = 0.0, presence: float = 0.0, bias: Mapping[int, float] | None = None) -> Adjust | None:
    """``logits[t] - frequency * c[t] - presence * [c[t] > 0] + bias[t]``, where ``c[t]`` counts
    token t among the tokens generated so far (the prompt's are not counted, as in vLLM and
    OpenAI's description); None when nothing would change."""
    if not frequency and not presence and not bias:
        return None
    bias_ids = torch.tensor(list(bias or {}), dtype=torch.long)
    bias_values = torch.tensor(list((bias or {}).values()), dtype=torch.float32)

    def adjust(logits: Tensor, tokens: Sequence[int]) -> Tensor:  # logits (vocab,)
        out = logits.float().clone()
        if tokens and (frequency or presence):
            seen, counts = torch.tensor(tokens, device=out.device).unique(return_counts=True)
            out[seen] -= frequency * counts.float() + presence
        if len(bias_ids):
            out[bias_ids.to(out.device)] += bias_values.to(out.device)
        return out

    return adjust
