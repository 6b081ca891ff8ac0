"""Why the factor 1/√d_k (chapter §Scaled Dot-Product Attention): [prop:att-variance] measured.

For q, k with independent unit-variance components, Var(qᵀk) = d_k [eq:att-variance] and
qᵀk/√d_k has unit variance; the scores are read from attnkit's attention as it runs
(:func:`attnkit.chapter.flow.trace_attention`). Then the consequence the chapter draws:
without the factor the softmax saturates as d_k grows (its entropy falls towards 0) and the
gradient reaching a typical query row vanishes, while with it both stay put. (The mean
gradient does not vanish: the few rows whose two top scores nearly tie carry it.)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from attnkit.chapter.flow import trace_attention
from attnkit.chapter.report import Context, Section, pyplot, save
from attnkit.nn.attention import attention_math, scaled_dot_product_attention

# The chapter's labels this experiment shows (docs/chapter.md's figure column reads them).
LABELS = ("prop:att-variance", "eq:att-variance", "eq:att-alpha")

HIST_DIMS = (16, 64, 256)
N_KEYS = 32  # keys per query in the saturation experiment
D_V = 16


def dot_products(d_k: int, pairs: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``pairs`` independent (q, k) with N(0, 1) components -> (qᵀk, qᵀk/√d_k), each ``(pairs,)``,
    as attnkit's attention computes them (one query and one key per batch entry)."""
    q = torch.randn(pairs, 1, d_k, generator=generator)
    k = torch.randn(pairs, 1, d_k, generator=generator)
    v = torch.zeros(pairs, 1, 1)
    _, trace = trace_attention(lambda: attention_math(q, k, v))
    return trace.scores.flatten(), trace.scaled.flatten()  # (pairs, 1, 1) -> (pairs,)


def saturation(d_k: int, batches: int, generator: torch.Generator) -> dict[str, float]:
    """Mean softmax entropy, mean largest weight, the median and mean gradient norm per
    query/key row and the share of the query gradient held by its top 5% rows, with the 1/√d_k
    factor (``scale=None``) and without it (``scale=1.0``), for unit-variance queries and keys
    and a loss along a random direction of the output."""
    q = torch.randn(batches, 1, N_KEYS, d_k, generator=generator)  # (B, H, n, d_k), n queries = n keys
    k = torch.randn(batches, 1, N_KEYS, d_k, generator=generator)
    v = torch.randn(batches, 1, N_KEYS, D_V, generator=generator)
    direction = torch.randn(batches, 1, N_KEYS, D_V, generator=generator)
    result: dict[str, float] = {}
    for name, scale in (("scaled", None), ("unscaled", 1.0)):
        q_, k_ = q.clone().requires_grad_(), k.clone().requires_grad_()
        out, weights = scaled_dot_product_attention(q_, k_, v, scale=scale, return_weights=True)
        grad_q, grad_k = torch.autograd.grad((out * direction).sum(), (q_, k_))
        result[f"entropy_{name}"] = float(torch.special.entr(weights.detach()).sum(-1).mean())
        result[f"max_weight_{name}"] = float(weights.detach().amax(-1).mean())
        for part, grad in (("q", grad_q), ("k", grad_k)):
            norms = grad.norm(dim=-1)  # (B, 1, n, d) -> (B, 1, n)
            result[f"grad_{part}_{name}"] = float(norms.median())
            result[f"grad_{part}_mean_{name}"] = float(norms.mean())
        top = grad_q.norm(dim=-1).flatten().sort(descending=True).values  # (B·n,) largest first
        result[f"grad_q_top5_share_{name}"] = float(top[: max(1, len(top) // 20)].sum() / top.sum())
    return result


def _histograms(samples: dict[int, tuple[Tensor, Tensor]], pairs: int) -> Any:
    """Row 1: qᵀk with the N(0, d_k) density; row 2: qᵀk/√d_k with N(0, 1)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, len(samples), figsize=(4 * len(samples), 6.5), sharey="row")
    for col, (d_k, (raw, scaled)) in enumerate(samples.items()):
        for row, (values, std, label) in enumerate(((raw, math.sqrt(d_k), "qᵀk"), (scaled, 1.0, "qᵀk/√d_k"))):
            ax = axes[row, col]
            ax.hist(values.numpy(), bins=60, density=True, color="C0" if row == 0 else "C1", alpha=0.7)
            grid = torch.linspace(-4.5 * std, 4.5 * std, 200)
            density = torch.exp(-0.5 * (grid / std) ** 2) / (std * math.sqrt(2 * math.pi))
            ax.plot(grid.numpy(), density.numpy(), "k--", lw=1, label=f"N(0, {std**2:g})")
            ax.set_title(f"{label}, d_k = {d_k}: var {float(values.var()):.3g}", fontsize=10)
            ax.legend(fontsize=8)
        axes[1, col].set_xlim(-5, 5)
    axes[0, 0].set_ylabel("density")
    axes[1, 0].set_ylabel("density")
    fig.suptitle(f"[prop:att-variance] {pairs} independent pairs per d_k: Var(qᵀk) = d_k, Var(qᵀk/√d_k) = 1")
    fig.tight_layout()
    return fig


def _saturation_plot(dims: list[int], sat: dict[int, dict[str, float]]) -> Any:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, style in (("scaled", "o-"), ("unscaled", "s--")):
        left.plot(dims, [sat[d][f"entropy_{name}"] for d in dims], style, label=name)
        for part, color in (("q", "C2"), ("k", "C3")):
            values = [sat[d][f"grad_{part}_{name}"] for d in dims]
            right.plot(dims, values, style, color=color, label=f"median ‖∂L/∂{part}‖, {name}")
    means = [sat[d]["grad_q_mean_unscaled"] for d in dims]
    right.plot(dims, means, ":", color="grey", label="mean ‖∂L/∂q‖, unscaled")
    left.axhline(math.log(N_KEYS), color="grey", ls=":", label=f"uniform: log {N_KEYS}")
    left.set(xscale="log", xlabel="d_k", ylabel="mean entropy of a row of α (nats)", ylim=(0, None))
    left.set_title("softmax saturation")
    right.set(xscale="log", yscale="log", xlabel="d_k", ylabel="gradient norm per row")
    right.set_title("gradient reaching the queries and keys")
    for ax in (left, right):
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.legend(fontsize=8)
    fig.suptitle(f"unit-variance q, k; {N_KEYS} keys per query; scaled = ÷√d_k (attnkit's default), unscaled = ×1")
    fig.tight_layout()
    return fig


# One experiment, read top to bottom as its report section reads (histograms, saturation,
# gradients, their figures and prose); the measurements are the functions above.
def run(ctx: Context) -> Section:
    """Histograms of qᵀk for three d_k, then entropy and gradients against d_k."""
    pairs, batches = (4000, 16) if ctx.quick else (50_000, 128)
    dims = [4, 16, 64, 256, 1024] if ctx.quick else [2**e for e in range(2, 11)]
    generator = torch.Generator().manual_seed(ctx.seed)
    samples = {d: dot_products(d, pairs, generator) for d in HIST_DIMS}
    sat = {d: saturation(d, batches, generator) for d in dims}
    figures = [
        save(_histograms(samples, pairs), ctx, "att-variance-histograms.png"),
        save(_saturation_plot(dims, sat), ctx, "att-variance-saturation.png"),
    ]

    numbers: dict[str, Any] = {
        "pairs": pairs,
        "mean": {str(d): float(raw.mean()) for d, (raw, _) in samples.items()},
        "variance": {str(d): float(raw.var()) for d, (raw, _) in samples.items()},
        "variance_ratio": {str(d): float(raw.var()) / d for d, (raw, _) in samples.items()},
        "scaled_variance": {str(d): float(scaled.var()) for d, (_, scaled) in samples.items()},
        "n_keys": N_KEYS,
        "rows": batches * N_KEYS,
        "entropy_uniform": math.log(N_KEYS),
    }
    for key in sat[dims[0]]:
        numbers[key] = {str(d): sat[d][key] for d in dims}

    def listed(key: str, fmt: str) -> str:
        return ", ".join(f"{numbers[key][str(d)]:{fmt}} (d_k = {d})" for d in HIST_DIMS)

    small, large = str(dims[0]), str(dims[-1])

    def ratio(part: str, d: str, kind: str = "") -> float:
        return numbers[f"grad_{part}{kind}_unscaled"][d] / numbers[f"grad_{part}{kind}_scaled"][d]

    text = f"""
**Variance** [prop:att-variance]. Over {pairs} independent pairs (q, k) with N(0, 1) components, the
dot products attnkit's attention computed had mean {listed("mean", ".3f")} and variance
{listed("variance", ".4g")}, i.e. Var(qᵀk)/d_k = {listed("variance_ratio", ".3f")}, as [eq:att-variance]
predicts (Var = d_k). After the 1/√d_k factor the variance was {listed("scaled_variance", ".3f")}: unit
variance whatever the head width.

**Saturation.** With {N_KEYS} unit-variance keys per query ({batches * N_KEYS} query rows per d_k), the mean
entropy of a row of α was {numbers["entropy_scaled"][small]:.2f} nats at d_k = {small} and
{numbers["entropy_scaled"][large]:.2f} at d_k = {large} with scaling (uniform: log {N_KEYS} =
{math.log(N_KEYS):.2f}); without it it fell from {numbers["entropy_unscaled"][small]:.2f} to
{numbers["entropy_unscaled"][large]:.3f} nats, the largest weight of a row averaging
{numbers["max_weight_unscaled"][large]:.3f} at d_k = {large} (scaled: {numbers["max_weight_scaled"][large]:.3f}):
the softmax puts almost all its mass on one key.

Backpropagating a loss along a random direction of the output, the median gradient norm reaching a query row
was {numbers["grad_q_scaled"][small]:.3g} → {numbers["grad_q_scaled"][large]:.3g} with scaling and
{numbers["grad_q_unscaled"][small]:.3g} → {numbers["grad_q_unscaled"][large]:.3g} without (d_k = {small} →
{large}). At d_k = {small} the unscaled gradient is the larger ({ratio("q", small):.3g}×: it lacks the 1/√d_k
factor); at d_k = {large} a typical query row receives {ratio("q", large):.2g}× the scaled gradient — the
saturated softmax passes almost nothing back, as the chapter argues. For keys the median ratio is
{ratio("k", large):.2g}× at d_k = {large}: a key collects gradient from all {N_KEYS} queries, and from any
for which it nearly ties for the top score. The *mean* over rows does not collapse (query rows, unscaled:
{numbers["grad_q_mean_unscaled"][small]:.3g} → {numbers["grad_q_mean_unscaled"][large]:.3g}, scaled:
{numbers["grad_q_mean_scaled"][small]:.3g} → {numbers["grad_q_mean_scaled"][large]:.3g}) because a few rows
carry it: at d_k = {large} the 5% of query rows with the largest gradients hold
{numbers["grad_q_top5_share_unscaled"][large]:.0%} of the total unscaled
({numbers["grad_q_top5_share_scaled"][large]:.0%} scaled); a saturated softmax still passes gradient back in a
row whose two top scores nearly tie. Without the factor the learning signal concentrates on those rows while the typical
row stops learning.
"""
    return Section(
        title="Why the factor 1/√d_k",
        labels=LABELS,
        text=text,
        figures=figures,
        numbers=numbers,
    )
