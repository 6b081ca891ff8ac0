"""Causal LM batches: [bos] + x as input, x + [eos] as labels."""

from __future__ import annotations

from attnkit.data.specials import Specials
from attnkit.objectives import IGNORE_INDEX, CausalLM


def test_causal_lm_labels_are_inputs_shifted(specials: Specials) -> None:
    batch = CausalLM(specials).batch([[40, 41, 42], [43]])
    bos, eos, pad = specials.bos, specials.eos, specials.pad
    assert batch["input_ids"].tolist() == [[bos, 40, 41, 42], [bos, 43, pad, pad]]
    assert batch["labels"].tolist() == [[40, 41, 42, eos], [43, eos, IGNORE_INDEX, IGNORE_INDEX]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    # Next-token prediction: the label at t is the input at t + 1.
    real = batch["attention_mask"].bool()
    assert (batch["labels"][:, :-1][real[:, 1:]] == batch["input_ids"][:, 1:][real[:, 1:]]).all()


def test_padding_labels_are_ignored(specials: Specials) -> None:
    batch = CausalLM(specials).batch([[40] * 5, [41], []])
    assert ((batch["labels"] == IGNORE_INDEX) == (batch["attention_mask"] == 0)).all()
    assert batch["labels"][2, 0].item() == specials.eos  # an empty text still learns to end
