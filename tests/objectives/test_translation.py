"""Translation batches: source + eos, the target shifted right behind bos, labels the target + eos."""

from __future__ import annotations

import pytest

from attnkit.data.specials import Specials
from attnkit.objectives import IGNORE_INDEX, Translation

PAIRS = [([40, 41, 42], [50, 51]), ([43], [52, 53, 54, 55])]


def test_translation_shifts_targets_right(specials: Specials) -> None:
    batch = Translation(specials).batch(PAIRS)
    bos, eos, pad = specials.bos, specials.eos, specials.pad
    assert batch["input_ids"].tolist() == [[40, 41, 42, eos], [43, eos, pad, pad]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["decoder_input_ids"].tolist() == [[bos, 50, 51, pad, pad], [bos, 52, 53, 54, 55]]
    assert batch["decoder_attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["labels"].tolist() == [[50, 51, eos, IGNORE_INDEX, IGNORE_INDEX], [52, 53, 54, 55, eos]]
    # Teacher forcing: the decoder reads at t what it had to predict at t - 1.
    real = batch["decoder_attention_mask"].bool()
    assert (batch["decoder_input_ids"][:, 1:][real[:, 1:]] == batch["labels"][:, :-1][real[:, 1:]]).all()


def test_padding_labels_are_ignored(specials: Specials) -> None:
    batch = Translation(specials).batch(PAIRS)
    assert ((batch["labels"] == IGNORE_INDEX) == (batch["decoder_attention_mask"] == 0)).all()


def test_max_len_truncates_each_side_and_keeps_eos(specials: Specials) -> None:
    batch = Translation(specials, max_len=3).batch([([40, 41, 42, 43], [50, 51, 52, 53])])
    assert batch["input_ids"].tolist() == [[40, 41, specials.eos]]
    assert batch["labels"].tolist() == [[50, 51, specials.eos]]
    assert batch["decoder_input_ids"].tolist() == [[specials.bos, 50, 51]]


def test_examples_with_specials_are_refused(specials: Specials) -> None:
    with pytest.raises(ValueError, match=r"special token id\(s\) \[2\]"):
        Translation(specials).batch([([40, specials.eos], [50])])


@pytest.mark.parametrize("kwargs", [{"label_smoothing": 1.0}, {"label_smoothing": -0.1}, {"max_len": 1}])
def test_bad_settings_are_refused(specials: Specials, kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Translation(specials, **kwargs)
