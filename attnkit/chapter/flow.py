"""[fig:att-sdpa-flow], drawn from a real forward pass: the stages of [eq:att-sdpa] (Q Kᵀ,
the 1/√d_k scale, the optional mask [eq:att-masked], the row-wise softmax [eq:att-alpha], the
product with V), each box annotated with the shape of the tensor attnkit actually computed.

The tensors are read from :func:`attnkit.nn.attention.attention_math` while it runs (a
``TorchFunctionMode`` records the operations it calls), so the figure cannot drift from the
code; :func:`trace_attention` is shared with the other experiments that need the scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from attnkit.chapter.report import Context, Section, pyplot, save
from attnkit.nn.attention import MultiHeadAttention
from attnkit.nn.masks import causal_mask

# The chapter's labels this experiment shows (docs/chapter.md's figure column reads them).
LABELS = ("fig:att-sdpa-flow", "def:att-sdpa", "eq:att-sdpa", "eq:att-alpha")

T = TypeVar("T")
_RECORDED = frozenset({"matmul", "mul", "masked_fill", "softmax"})


@dataclass
class AttentionTrace:
    """The intermediate tensors of one [eq:att-sdpa], as the code computed them.

    ``scores`` = Q Kᵀ, ``scaled`` = Q Kᵀ/√d_k, ``masked`` = scaled + M [eq:att-masked] (None
    without a mask), ``weights`` = α [eq:att-alpha] (the matrix that multiplies V),
    ``heads`` = α V."""

    q: Tensor
    k_t: Tensor
    v: Tensor
    scores: Tensor
    scaled: Tensor
    masked: Tensor | None
    weights: Tensor
    heads: Tensor


class _Recorder(TorchFunctionMode):
    """Keep ``(name, args, output)`` of the tensor operations attention is made of."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[Any, ...], Any]] = []

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in _RECORDED:
            self.calls.append((name, args, out))
        return out


def _next(calls: list[tuple[str, tuple[Any, ...], Any]], start: int, name: str, source: Tensor | None) -> int | None:
    """Index of the first ``name`` call from ``start`` on (whose first argument is ``source``, if given)."""
    for i in range(start, len(calls)):
        if calls[i][0] == name and (source is None or calls[i][1][0] is source):
            return i
    return None


def trace_attention(fn: Callable[[], T]) -> tuple[T, AttentionTrace]:
    """Run ``fn`` (under ``torch.no_grad``) and return its result with the tensors of the first
    attention it computes through :func:`attnkit.nn.attention.attention_math` (the
    ``return_weights=True`` path; the fused kernel's insides cannot be read)."""
    with torch.no_grad(), _Recorder() as recorder:
        result = fn()
    calls = recorder.calls
    first = _next(calls, 0, "matmul", None)
    scale = None if first is None else _next(calls, first, "mul", calls[first][2])
    softmax = None if scale is None else _next(calls, scale, "softmax", None)
    product = None if softmax is None else _next(calls, softmax, "matmul", None)
    if first is None or scale is None or softmax is None or product is None:
        raise RuntimeError(
            "no Q Kᵀ -> scale -> softmax -> α V chain was recorded; run attention with "
            "return_weights=True, or update trace_attention to attention_math's operations"
        )
    fill = _next(calls, scale, "masked_fill", calls[scale][2])
    q, k_t = calls[first][1][:2]
    weights, v = calls[product][1][:2]
    return result, AttentionTrace(
        q=q,
        k_t=k_t,
        v=v,
        scores=calls[first][2],
        scaled=calls[scale][2],
        masked=None if fill is None or fill > softmax else calls[fill][2],
        weights=weights,
        heads=calls[product][2],
    )


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


# The figure's boxes and arrows, one matplotlib call each, bottom to top as the chapter's diagram:
# split, it would be a dozen one-use helpers passing the same axes around.
def _draw(trace: AttentionTrace, x: Tensor, out: Tensor, mask: Tensor, scale: float) -> Any:
    """The chapter's flow diagram (bottom to top), shapes from ``trace``, heatmaps of head 1."""
    from matplotlib.patches import FancyBboxPatch

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 8.5))
    ax.set_xlim(-7.6, 8.2)
    ax.set_ylim(-1.5, 8.4)
    ax.axis("off")

    def box(x0: float, y0: float, w: float, label: str, color: str, dashed: bool = False) -> None:
        ax.add_patch(
            FancyBboxPatch(
                (x0 - w / 2, y0 - 0.28),
                w,
                0.56,
                boxstyle="round,pad=0.04",
                facecolor=color,
                edgecolor="black",
                linestyle="--" if dashed else "-",
            )
        )
        ax.text(x0, y0, label, ha="center", va="center", fontsize=11)

    def arrow(start: tuple[float, float], end: tuple[float, float]) -> None:
        ax.annotate("", end, start, arrowprops={"arrowstyle": "-|>", "color": "black", "lw": 1.2})

    def note(y0: float, text: str) -> None:
        ax.text(1.6, y0, text, ha="left", va="center", fontsize=9, family="monospace")

    def shape(t: Tensor) -> str:
        return "(" + ", ".join(str(n) for n in t.shape) + ")"

    v_x = 6.4
    box(-1.4, 0.0, 1.2, "Q", "#cfe2f3")
    box(1.4, 0.0, 1.2, "K", "#cfe2f3")
    box(v_x, 0.0, 1.2, "V", "#cfe2f3")
    ax.text(-1.4, -0.55, shape(trace.q), ha="center", va="top", fontsize=9, family="monospace")
    ax.text(1.4, -0.55, f"Kᵀ {shape(trace.k_t)}", ha="center", va="top", fontsize=9, family="monospace")
    ax.text(v_x, -0.55, shape(trace.v), ha="center", va="top", fontsize=9, family="monospace")
    ax.text(
        0.0,
        -1.25,
        f"Q, K, V = x W^Q, x W^K, x W^V split into heads; x {shape(x)}",
        ha="center",
        fontsize=9,
        style="italic",
    )
    stages = [
        (1.5, "×", "white", f"Q Kᵀ {shape(trace.scores)}"),
        (2.7, "Scale by 1/√d_k", "white", f"× {scale:.4f} {shape(trace.scaled)}"),
        (3.9, "Mask (causal here)", "white", f"+ M {shape(trace.masked if trace.masked is not None else mask)}"),
        (5.1, "softmax (row-wise)", "#fce5cd", f"α {shape(trace.weights)}, rows sum to 1"),
        (6.4, "×", "white", f"α V {shape(trace.heads)}"),
        (7.6, "Attention(Q, K, V)", "#d9ead3", f"concat · W^O {shape(out)}"),
    ]
    for i, (y0, label, color, text) in enumerate(stages):
        box(0.0, y0, 0.7 if label == "×" else 2.7, label, color, dashed=label.startswith("Mask"))
        note(y0 - 0.35 if y0 == 6.4 else y0, text)  # below V's arrow into α V
        if i:
            arrow((0.0, stages[i - 1][0] + 0.32), (0.0, y0 - 0.32))
    arrow((-1.4, 0.32), (-0.3, 1.2))
    arrow((1.4, 0.32), (0.3, 1.2))
    ax.plot([v_x, v_x], [0.32, 6.4], color="black", lw=1.2)
    arrow((v_x, 6.4), (0.4, 6.4))

    # head 1 of the first sequence, beside the stage that produced it
    masked = trace.scaled if trace.masked is None else trace.masked
    shown = [
        (1.5, trace.scores[0, 0], "Q Kᵀ"),
        (2.7, trace.scaled[0, 0], "/ √d_k"),
        (3.9, masked[0, 0].masked_fill(~mask, float("nan")), "+ M (blocked: grey)"),
        (5.1, trace.weights[0, 0], "α (blocked: exactly 0)"),
    ]
    cmap = plt.get_cmap("viridis").with_extremes(bad="#dddddd")
    for y0, values, title in shown:
        inset = ax.inset_axes((-7.2, y0 - 0.4, 2.4, 0.8), transform=ax.transData)
        inset.imshow(values.numpy(), cmap=cmap, aspect="auto")
        inset.set_xticks([])
        inset.set_yticks([])
        inset.set_title(title, fontsize=7, pad=1)
        ax.plot([-4.7, -0.45 if y0 == 1.5 else -1.45], [y0, y0], color="grey", lw=0.6, ls=":")
    d_k = trace.q.shape[-1]
    ax.set_title(f"[fig:att-sdpa-flow] attention as measured (d_k = {d_k}; heatmaps: sequence 1, head 1)")
    return fig


def run(ctx: Context) -> Section:
    """One multi-head self-attention forward pass with the causal mask; record its stages."""
    B, H, T, d_model = (1, 2, 5, 16) if ctx.quick else (2, 4, 8, 64)
    with torch.random.fork_rng():  # the weights' initialisation draws from the global generator
        torch.manual_seed(ctx.seed)
        attention = MultiHeadAttention(d_model, H).eval()
    x = torch.randn(B, T, d_model, generator=torch.Generator().manual_seed(ctx.seed))
    (out, weights), trace = trace_attention(lambda: attention(x, return_weights=True, is_causal=True))
    mask = causal_mask(T)
    d_k = attention.d_k
    if weights is None or not torch.equal(weights, trace.weights):
        raise RuntimeError("the traced weights are not the ones MultiHeadAttention returned")

    shapes = {
        "x": _shape(x),
        "Q": _shape(trace.q),
        "K^T": _shape(trace.k_t),
        "V": _shape(trace.v),
        "QK^T": _shape(trace.scores),
        "scaled": _shape(trace.scaled),
        "masked": _shape(trace.masked) if trace.masked is not None else None,
        "weights": _shape(trace.weights),
        "heads": _shape(trace.heads),
        "output": _shape(out),
    }
    rows_err = float((trace.weights.sum(-1) - 1).abs().max())
    scale = float((trace.scaled * trace.scores).sum() / (trace.scores * trace.scores).sum())
    blocked = float(trace.weights[..., ~mask].abs().max())
    figures = [save(_draw(trace, x, out, mask, scale), ctx, "att-sdpa-flow.png")]
    numbers = {
        "batch": B,
        "heads": H,
        "seq_len": T,
        "d_model": d_model,
        "d_k": d_k,
        "shapes": shapes,
        "scale_measured": scale,
        "scale_expected": d_k**-0.5,
        "rows_sum_max_error": rows_err,
        "masked_weight_max": blocked,
    }
    text = f"""
One forward pass of attnkit's `MultiHeadAttention` (d_model = {d_model}, h = {H}, so d_k = {d_k}) on a
random input x of shape {tuple(x.shape)}, with the causal mask [eq:att-mask] so that every stage of the
chapter's figure runs. The tensors were recorded inside `attention_math` as it computed them:
Q {tuple(trace.q.shape)} and Kᵀ {tuple(trace.k_t.shape)} meet in the scores Q Kᵀ {tuple(trace.scores.shape)};
the scale stage multiplied them by {scale:.6f} (1/√{d_k} = {d_k**-0.5:.6f}); the softmax gave weights
α {tuple(trace.weights.shape)} whose rows sum to 1 within {rows_err:.1e} [eq:att-alpha], with the blocked
(future) entries at most {blocked:.1e}; α V gave {tuple(trace.heads.shape)}, and concatenating the heads and
applying W^O returned {tuple(out.shape)}.
"""
    return Section(
        title="The flow of scaled dot-product attention",
        labels=LABELS,
        text=text,
        figures=figures,
        numbers=numbers,
    )
