"""The sinusoidal positional encoding (chapter §Positional Encoding): [eq:att-pe-sin]
[eq:att-pe-cos] drawn from attnkit's table, its wavelengths measured, and
[prop:att-pe-linear] checked: moving every position by k rotates each (2i, 2i+1) pair by an
angle k·ω_i that depends on k and i alone.

The table is :class:`attnkit.nn.positional.SinusoidalPositionalEncoding`'s, in the chapter's
interleaved layout (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos), the one the models use with
``positional="sinusoidal"``; the rotation is built from the chapter's formula for ω_i, the
independent check.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from attnkit.chapter.report import Context, Section, pyplot, save
from attnkit.nn.positional import SinusoidalPositionalEncoding

# The chapter's labels this experiment shows (docs/chapter.md's figure column reads them).
LABELS = ("eq:att-pe-sin", "eq:att-pe-cos", "prop:att-pe-linear")

BASE = 10000.0
OFFSETS = (1, 5, 25, 100)
TRACED_PAIRS = (0, 4, 16, 32)  # pair indices i whose sin component is plotted


def frequencies(d_model: int) -> Tensor:
    """ω_i = 1 / 10000^(2i/d_model) for i = 0 .. d_model/2 - 1, from the chapter's formula (float64)."""
    two_i = 2 * torch.arange(d_model // 2, dtype=torch.float64)
    return BASE ** (-two_i / d_model)


def measured_wavelengths(table: Tensor) -> Tensor:
    """2π/ω_i with ω_i read off the table: the angle of the pair (sin, cos) at position 1."""
    pair = table[1].double().unflatten(-1, (-1, 2))  # (d,) -> (d/2, 2): (PE(1, 2i), PE(1, 2i+1))
    return 2 * math.pi / torch.atan2(pair[:, 0], pair[:, 1])


def rotation_errors(table: Tensor, offset: int) -> Tensor:
    """For each pair i, the largest |R(k·ω_i) PE_pair(pos) - PE_pair(pos + k)| over positions and
    the pair's two components, where R(θ) maps (sin a, cos a) to (sin(a + θ), cos(a + θ)):
    [prop:att-pe-linear] with k = ``offset``. Returns ``(d_model/2,)``."""
    pairs = table.double().unflatten(-1, (-1, 2))  # (T, d) -> (T, d/2, 2): (sin, cos) of pair i
    angle = offset * frequencies(table.shape[-1])  # (d/2,), from k and i only
    cos, sin = angle.cos(), angle.sin()
    now_sin, now_cos = pairs[:-offset, :, 0], pairs[:-offset, :, 1]  # (T - k, d/2) each
    # sin(a + θ) = sin a cos θ + cos a sin θ;  cos(a + θ) = cos a cos θ - sin a sin θ
    predicted = torch.stack([now_sin * cos + now_cos * sin, now_cos * cos - now_sin * sin], dim=-1)
    return (predicted - pairs[offset:]).abs().amax(dim=(0, 2))  # (T - k, d/2, 2) -> (d/2,)


def _table_figure(table: Tensor, measured: Tensor, expected: Tensor) -> Any:
    plt = pyplot()
    fig, (heat, waves, traces) = plt.subplots(1, 3, figsize=(16, 4.6), gridspec_kw={"width_ratios": [1.1, 1, 1.3]})
    shown = table[:128]
    image = heat.imshow(shown.numpy(), cmap="RdBu_r", aspect="auto", vmin=-1, vmax=1, interpolation="nearest")
    heat.set(xlabel="dimension (2i: sin, 2i+1: cos)", ylabel="position", title=f"PE, {tuple(shown.shape)}")
    fig.colorbar(image, ax=heat, fraction=0.046)
    pairs = torch.arange(len(measured))
    waves.semilogy(pairs.numpy(), expected.numpy(), "k-", lw=1, label="2π·10000^(2i/d)")
    waves.semilogy(pairs.numpy(), measured.numpy(), ".", color="C1", ms=4, label="measured from the table")
    waves.set(xlabel="pair index i", ylabel="wavelength (positions)", title="wavelength of pair i")
    waves.legend(fontsize=8)
    positions = torch.arange(table.shape[0])
    for i in TRACED_PAIRS:
        traces.plot(positions.numpy(), table[:, 2 * i].numpy(), lw=1, label=f"PE(pos, {2 * i}), i = {i}")
    traces.set(xlabel="position", ylabel="value", title="sin component of a few pairs")
    traces.legend(fontsize=8, loc="lower left")
    fig.suptitle(f"[eq:att-pe-sin] [eq:att-pe-cos] attnkit's sinusoidal table, d_model = {table.shape[1]}")
    fig.tight_layout()
    return fig


def _rotation_figure(table: Tensor, errors: dict[int, Tensor]) -> Any:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [1.6, 1]})
    for k, err in errors.items():
        left.semilogy(err.clamp_min(1e-18).numpy(), lw=1, label=f"k = {k}")
    left.axhline(torch.finfo(torch.float32).eps, color="grey", ls=":", label="float32 eps")
    left.set(xlabel="pair index i", ylabel="max error over positions", title="|R(k·ω_i) PE(pos) − PE(pos + k)|")
    left.legend(fontsize=8)
    i, k, shown = table.shape[1] // 16, 3, 21  # ω_i = 10^(-1/2): about one turn over the positions shown
    pair = table[:shown, 2 * i : 2 * i + 2].double()  # (shown, 2): (sin, cos) of pair i
    right.plot(pair[:, 1].numpy(), pair[:, 0].numpy(), "o", ms=3, color="C0", label=f"positions 0..{shown - 1}")
    for pos in range(shown):
        right.annotate(str(pos), pair[pos, [1, 0]].numpy() * 1.08, fontsize=7, ha="center", va="center")
    for pos in range(0, shown - k, 4):
        right.annotate("", pair[pos + k, [1, 0]].numpy(), pair[pos, [1, 0]].numpy(), arrowprops={"arrowstyle": "->"})
    right.set(xlabel=f"PE(pos, {2 * i + 1}) = cos", ylabel=f"PE(pos, {2 * i}) = sin", aspect="equal")
    right.set(xlim=(-1.25, 1.25), ylim=(-1.25, 1.25))
    right.set_title(f"pair i = {i}: pos → pos + {k} is one rotation by {k}·ω_{i}", fontsize=10)
    right.legend(fontsize=8)
    fig.suptitle("[prop:att-pe-linear] a fixed offset is a rotation of every (2i, 2i+1) pair")
    fig.tight_layout()
    return fig


def run(ctx: Context) -> Section:
    """The table, its wavelengths, and the rotation property over every position and pair."""
    n_positions, d_model = (256, 128) if ctx.quick else (2048, 512)
    encoding = SinusoidalPositionalEncoding(d_model, BASE, layout="interleaved")
    table = encoding(n_positions)  # (T, d_model), float32 as the models add it
    expected = 2 * math.pi / frequencies(d_model)
    measured = measured_wavelengths(table)
    errors = {k: rotation_errors(table, k) for k in OFFSETS}
    by_offset = {str(k): float(err.max()) for k, err in errors.items()}
    worst = max(by_offset.values())
    eps = torch.finfo(table.dtype).eps
    figures = [
        save(_table_figure(table, measured, expected), ctx, "att-positional-table.png"),
        save(_rotation_figure(table, errors), ctx, "att-positional-rotation.png"),
    ]
    numbers = {
        "n_positions": n_positions,
        "d_model": d_model,
        "layout": encoding.layout,
        "dtype": str(table.dtype),
        "wavelength_min": float(measured.min()),
        "wavelength_max": float(measured.max()),
        "wavelength_max_expected": 2 * math.pi * BASE ** ((d_model - 2) / d_model),
        "wavelength_max_rel_error": float(((measured - expected) / expected).abs().max()),
        "offsets": list(OFFSETS),
        "rotation_max_error": worst,
        "rotation_max_error_by_offset": by_offset,
        "dtype_eps": eps,
    }
    listed = ", ".join(f"{err:.1e} (k = {k})" for k, err in by_offset.items())
    text = f"""
attnkit's `SinusoidalPositionalEncoding` (d_model = {d_model}, layout "{encoding.layout}": PE(pos, 2i) = sin,
PE(pos, 2i+1) = cos, as [eq:att-pe-sin] [eq:att-pe-cos] write it) gave a {tuple(table.shape)} {table.dtype}
table for positions 0..{n_positions - 1}. Reading each pair's frequency off the table (the angle of the pair at
position 1), the wavelengths run from {numbers["wavelength_min"]:.4f} (2π = {2 * math.pi:.4f}) to
{numbers["wavelength_max"]:.1f} positions (2π·10000^((d−2)/d) = {numbers["wavelength_max_expected"]:.1f}; the
chapter's "up to 10000·2π" is the limit of large d_model), within a relative {numbers["wavelength_max_rel_error"]:.1e}
of 2π·10000^(2i/d) for every i.

[prop:att-pe-linear]: for each offset k and each of the {d_model // 2} pairs (2i, 2i+1), rotating the pair at
position pos by the angle k·ω_i, ω_i = 10000^(−2i/d), built from k and i alone, predicted the pair at pos + k
for every position with a largest error of {listed}: {worst:.1e} overall, {worst / eps:.1f}× the {table.dtype}
machine epsilon ({eps:.1e}), i.e. the rounding of the stored table. A shift in position is the same linear map
at every position.
"""
    return Section(
        title="Sinusoidal positions and the rotation property",
        labels=LABELS,
        text=text,
        figures=figures,
        numbers=numbers,
    )
