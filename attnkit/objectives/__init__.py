"""The four pretraining objectives of [tab:att-families] (and translation, the paper's task):
each turns token sequences into a batch and a batch into a loss."""

from attnkit.objectives.base import IGNORE_INDEX, LossOutput, Objective, label_smoothed_nll, token_loss
from attnkit.objectives.causal_lm import CausalLM
from attnkit.objectives.masked_lm import MaskedLM
from attnkit.objectives.span_corruption import SpanCorruption
from attnkit.objectives.translation import Translation

__all__ = [
    "IGNORE_INDEX",
    "CausalLM",
    "LossOutput",
    "MaskedLM",
    "Objective",
    "SpanCorruption",
    "Translation",
    "label_smoothed_nll",
    "token_loss",
]
