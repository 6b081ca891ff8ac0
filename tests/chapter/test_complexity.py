"""Tests for attnkit.chapter.complexity: [tab:att-complexity] measured.

The quick experiment runs once; its time exponents are checked within wide bands (never absolute
times), its graph counts exactly: sequential operations constant for attention and convolution and
growing with n for the recurrence; maximum path length 1 for attention, n − 1 hand-offs for the
recurrence, ⌈log_k n⌉ dilated and ⌈(n − 1)/(k − 1)⌉ contiguous causal convolutions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attnkit.chapter.complexity import K, peak_bytes, unrolled_lstm
from attnkit.chapter.report import Section


@pytest.fixture(scope="module")
def section(sections: dict[str, Section]) -> Section:
    return sections["complexity"]


def _smallest_power_reaching(n: int) -> int:
    """The fewest L with K^L ≥ n: ⌈log_K n⌉ in integers."""
    layers = 0
    while K**layers < n:
        layers += 1
    return layers


def test_figures_are_written(section: Section, out: Path) -> None:
    assert len(section.figures) == 2
    for name in section.figures:
        assert (out / name).stat().st_size > 0


def test_numbers_are_json_and_in_the_text(section: Section) -> None:
    json.dumps(section.numbers)
    for key in ("time_exponent_n", "time_exponent_d", "memory_exponent_n"):
        assert set(section.numbers[key]) == {"attention", "recurrent", "convolution"}
    assert f"n^{section.numbers['time_exponent_n']['attention']:.2f}" in section.text
    assert "tab:att-complexity" in section.labels


def test_attention_time_is_quadratic_in_n(section: Section) -> None:
    assert 1.6 <= section.numbers["time_exponent_n"]["attention"] <= 2.4


def test_recurrent_and_convolution_times_are_linear_in_n(section: Section) -> None:
    for layer in ("recurrent", "convolution"):
        assert 0.7 <= section.numbers["time_exponent_n"][layer] <= 1.3, layer


def test_math_path_memory_is_quadratic_fused_is_not(section: Section) -> None:
    assert section.numbers["memory_exponent_n"]["attention"] > 1.6
    assert section.numbers["fused_attention"]["memory_exponent_n"] < 1.3


def test_attention_sequential_ops_are_constant_recurrent_grow(section: Section) -> None:
    seq = section.numbers["sequential_ops"]
    assert len(set(seq["attention"].values())) == 1
    assert len(set(seq["convolution"].values())) == 1
    counts = [seq["recurrent"][n] for n in sorted(seq["recurrent"], key=int)]  # JSON keys: strings
    assert counts == sorted(counts) and counts[-1] > counts[0]
    assert section.numbers["sequential_ops_growth"]["recurrent"]["form"] == "linear"


def test_attention_path_length_is_one(section: Section) -> None:
    assert set(section.numbers["path_length"]["attention"].values()) == {1}


def test_recurrent_path_length_is_n_minus_one(section: Section) -> None:
    assert all(count == int(n) - 1 for n, count in section.numbers["path_length"]["recurrent"].items())


def test_dilated_convolution_path_length_is_log_k_n(section: Section) -> None:
    path = section.numbers["path_length"]["convolution"]
    assert all(count == _smallest_power_reaching(int(n)) for n, count in path.items())
    assert section.numbers["path_length_growth"]["convolution"]["form"] == "logarithmic"


def test_contiguous_convolution_path_length_is_n_over_k(section: Section) -> None:
    path = section.numbers["path_length"]["convolution (contiguous)"]
    assert all(count == -(-(int(n) - 1) // (K - 1)) for n, count in path.items())


def test_unrolled_lstm_equals_nn_lstm() -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 5, batch_first=True)
    x = torch.randn(2, 7, 5)
    steps = unrolled_lstm(lstm)(list(x.unbind(1)))
    assert_close(torch.stack(steps, 1), lstm(x)[0])


def test_peak_bytes_sees_the_n_by_n_scores() -> None:
    n = 256
    x = torch.randn(1, n, 8)
    (peak,) = peak_bytes([(lambda t: (t @ t.transpose(1, 2)).softmax(-1) @ t, x)])
    assert peak >= 2 * n * n * 4  # the scores and their softmax, float32, alive together
