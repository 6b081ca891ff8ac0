"""The chapter experiments that check a stated property against attnkit's own code: the flow of
[fig:att-sdpa-flow], [prop:att-variance], [prop:att-pe-linear] and the causal mask [eq:att-mask].
Each runs once in quick mode; the tests read its figures and measured numbers."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from attnkit.chapter import flow, masking, positions, variance
from attnkit.chapter.report import Section
from attnkit.nn.attention import attention_math
from attnkit.nn.masks import causal_mask
from attnkit.nn.positional import sinusoidal_table

MODULES = {"flow": flow, "variance": variance, "positions": positions, "masking": masking}


# --- [fig:att-sdpa-flow] -----------------------------------------------------------------


def test_flow_shapes_follow_the_stages(sections: dict[str, Section]) -> None:
    n = sections["flow"].numbers
    B, H, T, d_model, d_k = n["batch"], n["heads"], n["seq_len"], n["d_model"], n["d_k"]
    assert d_k == d_model // H
    assert n["shapes"] == {
        "x": [B, T, d_model],
        "Q": [B, H, T, d_k],
        "K^T": [B, H, d_k, T],
        "V": [B, H, T, d_k],
        "QK^T": [B, H, T, T],
        "scaled": [B, H, T, T],
        "masked": [B, H, T, T],
        "weights": [B, H, T, T],
        "heads": [B, H, T, d_k],
        "output": [B, T, d_model],
    }


def test_flow_measures_the_scale_the_rows_and_the_mask(sections: dict[str, Section]) -> None:
    n = sections["flow"].numbers
    assert n["scale_measured"] == pytest.approx(1 / math.sqrt(n["d_k"]), rel=1e-6)
    assert n["rows_sum_max_error"] < 1e-6
    assert n["masked_weight_max"] == 0.0


def test_trace_records_the_stages_attention_computed() -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g) for _ in range(3))
    mask = causal_mask(6)
    (out, weights), trace = flow.trace_attention(lambda: attention_math(q, k, v, mask))
    assert trace.q is q and torch.equal(trace.k_t, k.transpose(-2, -1)) and trace.v is v
    torch.testing.assert_close(trace.scores, q @ k.transpose(-2, -1))
    torch.testing.assert_close(trace.scaled, q @ k.transpose(-2, -1) / 2.0)  # √d_k = 2
    assert trace.masked is not None and bool((trace.masked[..., ~mask] < -1e30).all())
    assert torch.equal(trace.weights, weights) and torch.equal(trace.heads, out)
    _, unmasked = flow.trace_attention(lambda: attention_math(q, k, v))
    assert unmasked.masked is None


def test_trace_refuses_a_call_without_attention() -> None:
    with pytest.raises(RuntimeError, match="no Q Kᵀ"):
        flow.trace_attention(lambda: torch.ones(3).sum())


# --- [prop:att-variance] -----------------------------------------------------------------


def test_dot_product_variance_is_d_k(sections: dict[str, Section]) -> None:
    n = sections["variance"].numbers
    assert set(n["variance_ratio"]) == {str(d) for d in variance.HIST_DIMS}
    for d in variance.HIST_DIMS:
        key = str(d)
        assert 0.85 < n["variance_ratio"][key] < 1.15, (d, n["variance_ratio"][key])
        assert n["variance"][key] == pytest.approx(d * n["variance_ratio"][key])
        assert 0.85 < n["scaled_variance"][key] < 1.15
        assert abs(n["mean"][key]) < 5 * math.sqrt(d / n["pairs"])  # 5 standard errors


def test_without_the_factor_the_softmax_saturates(sections: dict[str, Section]) -> None:
    n = sections["variance"].numbers
    dims = sorted(int(d) for d in n["entropy_scaled"])
    assert dims[0] <= 4 and dims[-1] == 1024
    scaled = [n["entropy_scaled"][str(d)] for d in dims]
    unscaled = [n["entropy_unscaled"][str(d)] for d in dims]
    assert min(scaled) > 2.5 and max(scaled) < n["entropy_uniform"]  # responsive at every width
    assert all(a > b for a, b in itertools.pairwise(unscaled))  # falls as d_k grows
    assert unscaled[-1] < 0.25 * scaled[-1]
    assert n["max_weight_unscaled"]["1024"] > 0.8 > 0.3 > n["max_weight_scaled"]["1024"]


def test_without_the_factor_the_typical_gradient_vanishes(sections: dict[str, Section]) -> None:
    n = sections["variance"].numbers
    small, large = min(n["grad_q_scaled"], key=int), "1024"
    assert n["grad_q_unscaled"][small] > n["grad_q_scaled"][small]  # no 1/√d_k: larger while responsive
    assert n["grad_q_unscaled"][large] < 0.1 * n["grad_q_scaled"][large]
    assert n["grad_k_unscaled"][large] < n["grad_k_scaled"][large]
    assert n["grad_q_scaled"][large] == pytest.approx(n["grad_q_scaled"][small], rel=0.5)  # scaled: flat
    assert n["grad_q_top5_share_unscaled"][large] > 2 * n["grad_q_top5_share_scaled"][large]


# --- [prop:att-pe-linear] ----------------------------------------------------------------


def test_wavelengths_run_from_two_pi(sections: dict[str, Section]) -> None:
    n = sections["positions"].numbers
    d = n["d_model"]
    assert n["layout"] == "interleaved"
    assert n["wavelength_min"] == pytest.approx(2 * math.pi, rel=1e-5)
    assert n["wavelength_max"] == pytest.approx(2 * math.pi * 10000 ** ((d - 2) / d), rel=1e-5)
    assert n["wavelength_max_rel_error"] < 1e-5


def test_relative_offset_is_a_rotation_of_every_pair(sections: dict[str, Section]) -> None:
    n = sections["positions"].numbers
    assert set(n["rotation_max_error_by_offset"]) == {str(k) for k in positions.OFFSETS}
    assert max(n["rotation_max_error_by_offset"].values()) == n["rotation_max_error"]
    assert n["rotation_max_error"] < 1e-5


def test_rotation_check_rejects_the_wrong_pairing() -> None:
    """The check is sharp: on the "halves" layout, (2i, 2i+1) are not (sin, cos) pairs."""
    halves = sinusoidal_table(256, 128, layout="halves")
    assert float(positions.rotation_errors(halves, 5).max()) > 0.1
    interleaved = sinusoidal_table(256, 128)
    assert float(positions.rotation_errors(interleaved, 5).max()) < 1e-5


# --- [eq:att-mask] -----------------------------------------------------------------------


def test_masked_weights_are_exact_zeros(sections: dict[str, Section]) -> None:
    n = sections["masking"].numbers
    assert n["tokens"] == masking.words(masking.SENTENCE) and len(n["tokens"]) == 11
    assert n["above_diagonal_max"] == 0.0
    assert n["rows_sum_max_error"] < 1e-5


def test_future_tokens_do_not_change_past_outputs(sections: dict[str, Section]) -> None:
    n = sections["masking"].numbers
    assert n["future_change_max"] < 1e-6  # exactly 0.0 on the CPU kernels
    assert n["future_change_max_math_path"] < 1e-6
    assert n["replaced_change_min"] > 1e-3  # the replacements did reach the model
    assert n["future_change_max_without_mask"] > 1e-3  # and without the mask the past sees them
