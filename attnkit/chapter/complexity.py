"""[tab:att-complexity] measured: time and peak memory of one self-attention, one recurrent and one
convolutional layer as n and d vary, with the fitted exponents beside the table's O(n²·d), O(n·d²) and
O(k·n·d²); and the sequential operations and maximum path length counted on the layers' autograd graphs.

The layers: :class:`~attnkit.nn.attention.MultiHeadAttention` (self-attention, d / 64 heads of width 64)
on its math path, which materialises the n×n scores Q·Kᵀ, and on its fused path;
``torch.nn.LSTM`` (hidden size d); ``torch.nn.Conv1d`` (d → d channels, kernel k = 3, 'same' padding).
Times are forward passes without autograd at batch 1 on one thread (so the fit sees the work, not how
well it parallelises), the sizes taking turns in every round so that a drift in the machine's load
touches them alike; each point is the median of the rounds. Peak memory is the allocator's:
``torch.profiler`` with ``profile_memory=True`` records every allocation and free of the forward pass
(intermediates and kernel workspaces included, the input and the weights not), and the peak is the
maximum of their running sum.

Sequential operations are the depth (the longest chain of autograd nodes) from the outputs back to the
n inputs, given as n leaf tensors. ``torch.nn.LSTM`` can run as one fused autograd node whatever n (it
does with oneDNN on CPU), so the recurrence is also unrolled over an ``nn.LSTMCell`` holding the same
weights (:func:`unrolled_lstm`). Maximum path length counts the hops a signal takes from x_0 to y_{n−1}:
for attention and convolutions the fewest stacked layers for which ∂y_{n−1}/∂x_0 ≠ 0, for the
recurrence the hand-offs from one cell step to the next on the shortest autograd path (n − 1). The
table's O(log_k n) is for dilated convolutions (dilation k^l in layer l); contiguous kernels need
O(n/k) layers. Both stacks are causal (left padding), so the receptive field of L layers is exactly
k^L, resp. L·(k−1) + 1, positions.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from itertools import pairwise
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile, record_function

from attnkit.chapter.report import Context, Section, pyplot, save
from attnkit.nn.attention import MultiHeadAttention

# The chapter's labels this experiment shows (docs/chapter.md's figure column reads them).
LABELS = ("sec:att-complexity", "tab:att-complexity")

K = 3  # convolution kernel size k of [tab:att-complexity]
D_K = 64  # head width (the base Transformer's): d / D_K heads, so the softmax's n² work per head grows with d too
D_GRAPH = 8  # width for counting on graphs: depth and reachability do not depend on it

Layer = Callable[[Tensor], Tensor]  # (B, n, d) -> (B, n, d)
Network = Callable[[Sequence[Tensor]], list[Tensor]]  # n × (B, d) -> n × (B, d), position by position

# [tab:att-complexity], row by row: complexity per layer, sequential operations, maximum path length
TABLE = {
    "attention": ("O(n²·d)", "O(1)", "O(1)"),
    "recurrent": ("O(n·d²)", "O(n)", "O(n)"),
    "convolution": ("O(k·n·d²)", "O(1)", "O(log_k n)"),
}


@dataclass(frozen=True)
class Sizes:
    """The shapes of one mode; each sweep starts where its layer's leading term dominates."""

    d: int  # width while n varies
    n_attention: tuple[int, ...]  # n ≥ 4·d: the scores' 4·n²·d flops outweigh the projections' 8·n·d² 2-fold
    n_linear: tuple[int, ...]  # recurrent and convolution: long enough to outweigh per-call overhead
    d_attention: tuple[int, ...]  # d while n = n_attention_at_d ≫ d
    n_attention_at_d: int
    d_linear: tuple[int, ...]  # recurrent and convolution: wide enough for the d² matrix products to dominate
    n_recurrent_at_d: int
    n_convolution_at_d: int
    n_graph: tuple[int, ...]  # sequence lengths whose graphs are counted
    repeats: int  # timing rounds; each point is their median
    seconds_per_round: float  # a round calls a layer as often as fills this


QUICK = Sizes(
    d=64,
    n_attention=(256, 512, 1024, 2048, 4096),
    n_linear=(1024, 2048, 4096, 8192),
    d_attention=(64, 128, 256),
    n_attention_at_d=1024,
    d_linear=(128, 256, 512, 1024),
    n_recurrent_at_d=64,
    n_convolution_at_d=1024,
    n_graph=(4, 8, 16, 32, 64, 128),
    repeats=7,
    seconds_per_round=0.02,
)
FULL = Sizes(
    d=64,
    n_attention=(256, 512, 1024, 2048, 4096, 8192),
    n_linear=(1024, 2048, 4096, 8192, 16384, 32768),
    d_attention=(64, 128, 256, 512),
    n_attention_at_d=2048,
    d_linear=(128, 256, 512, 1024),
    n_recurrent_at_d=128,
    n_convolution_at_d=2048,
    n_graph=(4, 8, 16, 32, 64, 128, 256, 512),
    repeats=9,
    seconds_per_round=0.05,
)


def attention_layer(d: int, fused: bool = False) -> Layer:
    """Multi-head self-attention over the n positions; the math path keeps the n×n weights."""
    mha = MultiHeadAttention(d, max(1, d // D_K))
    return (lambda x: mha(x)[0]) if fused else (lambda x: mha(x, return_weights=True)[0])


def recurrent_layer(d: int) -> Layer:
    lstm = nn.LSTM(d, d, batch_first=True)
    return lambda x: lstm(x)[0]


def convolution_layer(d: int) -> Layer:
    conv = nn.Conv1d(d, d, K, padding="same")
    return lambda x: conv(x.transpose(1, 2)).transpose(1, 2)  # (B, n, d) -> (B, d, n) -> (B, n, d)


def causal_convolution(d: int, dilation: int) -> Layer:
    """A kernel-K convolution whose output at position t reads t, t − dilation, …, t − (K−1)·dilation."""
    conv = nn.Conv1d(d, d, K, dilation=dilation)
    return lambda x: conv(F.pad(x.transpose(1, 2), ((K - 1) * dilation, 0))).transpose(1, 2)


def unrolled_lstm(lstm: nn.LSTM, unit_of: dict[Any, int] | None = None) -> Network:
    """``lstm`` (one layer, batch_first) as an explicit loop over an ``nn.LSTMCell`` holding its weights,
    so that the autograd graph shows the recurrence step by step. With ``unit_of``, step t labels the
    autograd nodes it creates (and its input's leaf) with t."""
    cell = nn.LSTMCell(lstm.input_size, lstm.hidden_size, dtype=lstm.weight_ih_l0.dtype)
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    cell.load_state_dict({name: getattr(lstm, f"{name}_l0") for name in names})

    def run(xs: Sequence[Tensor]) -> list[Tensor]:
        h = c = xs[0].new_zeros(xs[0].shape[0], lstm.hidden_size)
        outputs = []
        for t, x in enumerate(xs):
            h, c = cell(x, (h, c))  # (B, d): the state after position t
            if unit_of is not None:
                _label(h, t, unit_of)  # c_t lies behind h_t = o_t ⊙ tanh(c_t)
            outputs.append(h)
        return outputs

    return run


def whole_sequence(layer: Layer) -> Network:
    """``layer`` applied to the n positions stacked into one (B, n, d) tensor."""
    return lambda xs: list(layer(torch.stack(list(xs), 1)).unbind(1))  # n × (B, d) -> (B, n, d) -> n × (B, d)


def _leaves(n: int, d: int) -> list[Tensor]:
    """n separate leaf tensors x_0 … x_{n−1}, each (1, d)."""
    return [torch.randn(1, d, requires_grad=True) for _ in range(n)]


def _children(node: Any) -> list[Any]:
    return [child for child, _ in node.next_functions if child is not None]


def _label(t: Tensor, unit: int, unit_of: dict[Any, int]) -> None:
    """Give ``unit`` to every autograd node behind ``t`` that has none yet: the nodes it just created."""
    todo = [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in unit_of:
            continue
        unit_of[node] = unit
        todo.extend(_children(node))


def _fold(root: Any, leaf: Callable[[Any], float], combine: Callable[[Any, list[tuple[Any, float]]], float]) -> float:
    """A value for the autograd graph under ``root``, children first: ``leaf(node)`` at nodes without
    children, ``combine(node, [(child, value), …])`` elsewhere. Iterative: an unrolled recurrence is
    thousands of nodes deep."""
    values: dict[Any, float] = {}
    todo = [root]
    while todo:
        node = todo[-1]
        if node in values:
            todo.pop()
            continue
        children = _children(node)
        pending = [child for child in children if child not in values]
        if pending:
            todo.extend(pending)
            continue
        todo.pop()
        values[node] = combine(node, [(child, values[child]) for child in children]) if children else leaf(node)
    return values[root]


def _is_leaf_of(node: Any, inputs: Sequence[Tensor]) -> bool:
    variable = getattr(node, "variable", None)  # AccumulateGrad nodes hold their leaf tensor
    return any(variable is x for x in inputs)


def sequential_ops(network: Network, n: int) -> int:
    """[tab:att-complexity] sequential operations: the longest chain of autograd nodes from the
    network's outputs (stacked) back to any of its n inputs, operations that must run one after another."""
    xs = _leaves(n, D_GRAPH)
    y = torch.stack(network(xs), 1)
    return int(
        _fold(
            y.grad_fn,
            lambda node: 0.0 if _is_leaf_of(node, xs) else -math.inf,
            lambda node, children: 1 + max(value for _, value in children),
        )
    )


def recurrent_path_length(lstm: nn.LSTM, n: int) -> int:
    """[tab:att-complexity] maximum path length of the recurrence: the fewest hand-offs from one cell
    step to the next on any autograd path from x_0 to y_{n−1} (the graph is built position by
    position, so a path there is a path between those two positions)."""
    xs = _leaves(n, D_GRAPH)
    unit_of: dict[Any, int] = {}
    y = unrolled_lstm(lstm, unit_of)(xs)[n - 1]

    def combine(node: Any, children: list[tuple[Any, float]]) -> float:
        return min(value + (unit_of[node] != unit_of[child]) for child, value in children)

    return int(_fold(y.grad_fn, lambda node: 0.0 if _is_leaf_of(node, xs[:1]) else math.inf, combine))


def fewest_layers(make_layer: Callable[[int], Layer], n: int) -> int:
    """[tab:att-complexity] maximum path length of a stack: the fewest layers (layer l =
    ``make_layer(l)``) for which ∂y_{n−1}/∂x_0 ≠ 0; doubling, then bisection (a deeper stack reaches
    everything a shallower one does). A layer mixes the whole stacked sequence in one autograd node, so
    here reachability is read from the gradient, not from the graph."""

    def reaches(depth: int) -> bool:
        xs = _leaves(n, D_GRAPH)
        y = torch.stack(xs, 1)  # n × (1, d) -> (1, n, d)
        for layer in range(depth):
            y = make_layer(layer)(y)
        (grad,) = torch.autograd.grad(y[0, n - 1].sum(), xs[0])
        return bool(grad.abs().sum() > 0)

    low, high = 0, 1  # reaches(low) is False (or low = 0): the answer lies in (low, high]
    while not reaches(high):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if reaches(middle) else (middle, high)
    return high


def _median_times(jobs: Sequence[tuple[Layer, Tensor]], repeats: int, at_least: float) -> list[float]:
    """Median seconds of each job's forward pass over ``repeats`` rounds in which the jobs take turns.
    A round runs a job as many times as fill ``at_least`` seconds (short calls are timed in bulk, so
    that neither the clock nor a moment's load decides them) and divides."""
    rounds: list[list[float]] = [[] for _ in jobs]
    calls = []
    with torch.no_grad():
        for layer, x in jobs:
            layer(x)  # warm-up: first calls pay for allocation and kernel selection
            start = time.perf_counter()
            layer(x)
            calls.append(max(1, round(at_least / (time.perf_counter() - start))))
        for _ in range(repeats):
            for seconds, (layer, x), count in zip(rounds, jobs, calls, strict=True):
                start = time.perf_counter()
                for _ in range(count):
                    layer(x)
                seconds.append((time.perf_counter() - start) / count)
    return [statistics.median(seconds) for seconds in rounds]


def peak_bytes(jobs: Sequence[tuple[Layer, Tensor]]) -> list[int]:
    """Peak bytes each job's forward pass holds above its input and weights: the maximum running sum of
    the allocations and frees the profiler records within the job's span."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for i, (layer, x) in enumerate(jobs):
            with record_function(f"job {i}"):
                layer(x)  # the output is freed inside the span: the running sum ends at zero
    events = prof.profiler.kineto_results.events()
    spans = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name().startswith("job ")}
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    peaks = []
    for i in range(len(jobs)):
        start, end = spans[f"job {i}"]
        running = peak = 0
        for _, nbytes in (m for m in memory if start <= m[0] <= end):
            running += nbytes
            peak = max(peak, running)
        peaks.append(peak)
    return peaks


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log y against log x: the exponent a of y ∝ x^a."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def _growth(counts: dict[int, int]) -> dict[str, Any]:
    """Which of constant, a + b·log_k n and a + b·n fits ``counts`` (least squares), with its slope b."""
    ns, ys = np.array(list(counts), dtype=float), np.array(list(counts.values()), dtype=float)
    if np.ptp(ys) == 0:
        return {"form": "constant", "value": int(ys[0])}
    fits = {}
    for form, x in (("logarithmic", np.log(ns) / math.log(K)), ("linear", ns)):
        (b, a), residuals, *_ = np.polyfit(x, ys, 1, full=True)
        fits[form] = (float(residuals[0]) if len(residuals) else 0.0, float(b), float(a))
    form = min(fits, key=lambda f: fits[f][0])
    return {"form": form, "slope": fits[form][1], "intercept": fits[form][2]}


def _describe(growth: dict[str, Any]) -> str:
    if growth["form"] == "constant":
        return f"constant ({growth['value']})"
    per = "per log_k n" if growth["form"] == "logarithmic" else "per position"
    return f"{growth['form']} ({growth['slope']:.2f} {per})"


@contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _measure_scaling(sizes: Sizes) -> dict[str, dict[str, dict[int, float]]]:
    """Times in n, times in d and peak bytes in n of the four layers (attention on both paths)."""
    builders: dict[str, Callable[[int], Layer]] = {
        "attention": attention_layer,
        "fused attention": partial(attention_layer, fused=True),
        "recurrent": recurrent_layer,
        "convolution": convolution_layer,
    }
    at_d = {
        "attention": sizes.n_attention_at_d,
        "fused attention": sizes.n_attention_at_d,
        "recurrent": sizes.n_recurrent_at_d,
        "convolution": sizes.n_convolution_at_d,
    }
    in_n = [(name, n) for name in builders for n in (sizes.n_attention if "attention" in name else sizes.n_linear)]
    in_d = [(name, d) for name in builders for d in (sizes.d_attention if "attention" in name else sizes.d_linear)]
    layers_at_d = {name: builders[name](sizes.d) for name in builders}
    jobs_n = [(layers_at_d[name], torch.randn(1, n, sizes.d)) for name, n in in_n]
    jobs_d = [(builders[name](d), torch.randn(1, at_d[name], d)) for name, d in in_d]
    out: dict[str, dict[str, dict[int, float]]] = {"time_n": {}, "time_d": {}, "bytes_n": {}}
    times_n = _median_times(jobs_n, sizes.repeats, sizes.seconds_per_round)
    for (name, n), seconds, nbytes in zip(in_n, times_n, peak_bytes(jobs_n), strict=True):
        out["time_n"].setdefault(name, {})[n] = seconds
        out["bytes_n"].setdefault(name, {})[n] = nbytes
    for (name, d), seconds in zip(in_d, _median_times(jobs_d, sizes.repeats, sizes.seconds_per_round), strict=True):
        out["time_d"].setdefault(name, {})[d] = seconds
    return out


def _count_graphs(ns: Sequence[int]) -> tuple[dict[str, dict[int, int]], dict[str, dict[int, int]]]:
    """Sequential operations and path lengths of each layer at each n, counted on autograd graphs."""
    lstm = nn.LSTM(D_GRAPH, D_GRAPH, batch_first=True)
    networks: dict[str, Network] = {
        "attention": whole_sequence(attention_layer(D_GRAPH)),
        "recurrent": unrolled_lstm(lstm),
        "convolution": whole_sequence(convolution_layer(D_GRAPH)),
        "recurrent (torch.nn.LSTM)": whole_sequence(lambda x: lstm(x)[0]),
    }
    seq = {name: {n: sequential_ops(network, n) for n in ns} for name, network in networks.items()}
    recurrent = {n: recurrent_path_length(lstm, n) for n in ns}
    # float64: a gradient through hundreds of contiguous convolutions would underflow float32 to zero
    with _default_dtype(torch.float64):
        path = {
            "attention": {n: fewest_layers(lambda _: attention_layer(D_GRAPH), n) for n in ns},
            "recurrent": recurrent,
            "convolution": {n: fewest_layers(lambda layer: causal_convolution(D_GRAPH, K**layer), n) for n in ns},
            "convolution (contiguous)": {n: fewest_layers(lambda _: causal_convolution(D_GRAPH, 1), n) for n in ns},
        }
    return seq, path


# how the report and the figures name each measured layer, and how they draw it
NAMES = {
    "attention": "self-attention (math path)",
    "fused attention": "self-attention (fused path)",
    "recurrent": "recurrent (LSTM)",
    "recurrent (torch.nn.LSTM)": "recurrent (torch.nn.LSTM's own graph)",
    "convolution": f"convolutional (k = {K})",
    "convolution (contiguous)": f"convolutional, contiguous kernels (k = {K})",
}
STYLES = {
    "attention": ("C0", "-"),
    "fused attention": ("C1", "-"),
    "recurrent": ("C2", "-"),
    "recurrent (torch.nn.LSTM)": ("C2", "--"),
    "convolution": ("C3", "-"),
    "convolution (contiguous)": ("C3", "--"),
}


def _draw(ax: Any, points: dict[int, float], name: str, label: str) -> None:
    color, line = STYLES[name]
    ax.loglog(list(points), list(points.values()), marker="o", color=color, linestyle=line, label=label)


def _plot_scaling(ctx: Context, sizes: Sizes, scaling: dict[str, dict[str, dict[int, float]]]) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (
        ("time_n", "sequence length n", "forward time (s)", f"time vs n at d = {sizes.d}"),
        ("time_d", "width d", "forward time (s)", "time vs d at fixed n (see text)"),
        ("bytes_n", "sequence length n", "peak bytes allocated", f"peak memory vs n at d = {sizes.d}"),
    )
    for ax, (key, xlabel, ylabel, title) in zip(axes, panels, strict=True):
        for name, points in scaling[key].items():
            _draw(ax, points, name, f"{NAMES[name]}: slope {_slope(list(points), list(points.values())):.2f}")
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return save(fig, ctx, "att-complexity-scaling.png")


def _plot_graphs(ctx: Context, seq: dict[str, dict[int, int]], path: dict[str, dict[int, int]]) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    panels = (
        (seq, {}, "longest chain of autograd nodes", "sequential operations"),
        (
            path,
            {"convolution": f"convolutional, dilation ${K}^l$ (k = {K})", "recurrent": "recurrent (hand-offs)"},
            r"layers (cell hand-offs) from $x_0$ to $y_{n-1}$",
            "maximum path length",
        ),
    )
    for ax, (counts, names, ylabel, title) in zip(axes, panels, strict=True):
        for name, points in counts.items():
            _draw(ax, points, name, f"{names.get(name, NAMES[name])}: {_describe(_growth(points))}")
        ax.set(xlabel="sequence length n", ylabel=ylabel, title=title)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return save(fig, ctx, "att-complexity-graphs.png")


# One experiment, read top to bottom as its report section reads: measure, fit, count, draw, write.
# Its pieces are the functions above; what is left is the order and the prose, so it stays whole.
def run(ctx: Context) -> Section:
    """Measure [tab:att-complexity]: fitted time and memory exponents, graph-counted sequential
    operations and path lengths, two figures."""
    torch.manual_seed(ctx.seed)
    sizes = QUICK if ctx.quick else FULL
    with _one_thread():
        scaling = _measure_scaling(sizes)
        seq, path = _count_graphs(sizes.n_graph)
    exponents = {
        key: {name: _slope(list(points), list(points.values())) for name, points in scaling[key].items()}
        for key in scaling
    }
    seq_growth = {name: _growth(counts) for name, counts in seq.items()}
    path_growth = {name: _growth(counts) for name, counts in path.items()}
    figures = [_plot_scaling(ctx, sizes, scaling), _plot_graphs(ctx, seq, path)]

    def span(values: Sequence[int]) -> str:
        return f"{values[0]}–{values[-1]}"

    seq_cells = {name: f"{TABLE[name][1]} → {_describe(seq_growth[name])}" for name in TABLE}
    path_cells = {name: f"{TABLE[name][2]} → {_describe(path_growth[name])}" for name in TABLE}
    path_cells["convolution"] += f"; contiguous: {_describe(path_growth['convolution (contiguous)'])}"
    rows = "\n".join(
        f"| {NAMES[name]} | {TABLE.get(name, ('—',))[0]} | n^{exponents['time_n'][name]:.2f} "
        f"| d^{exponents['time_d'][name]:.2f} | n^{exponents['bytes_n'][name]:.2f} "
        f"| {seq_cells.get(name, '—')} | {path_cells.get(name, '—')} |"
        for name in scaling["time_n"]
    )
    math_n = scaling["time_n"]["attention"]
    local_slopes = [_slope([a, b], [math_n[a], math_n[b]]) for a, b in pairwise(math_n)]
    local = ", ".join(f"{slope:.2f}" for slope in local_slopes)
    cache_note = (
        ": the steps above 2 mark sizes where the n×n tensors leave a cache level" if max(local_slopes) > 2.2 else ""
    )
    n_max = sizes.n_graph[-1]
    fused_lstm = seq_growth["recurrent (torch.nn.LSTM)"]
    fused_note = (
        "its kernel runs the n steps inside one autograd node, so graph depth counts that loop as one operation"
        if fused_lstm["form"] == "constant"
        else "this build records it step by step"
    )
    text = f"""
One layer of each kind, forward only, batch 1, one thread; each time is the median of {sizes.repeats}
interleaved rounds. In n at d = {sizes.d}: attention over n = {span(sizes.n_attention)} (heads of width
{D_K}), the recurrent and convolutional layers over n = {span(sizes.n_linear)}. In d: attention over
d = {span(sizes.d_attention)} at n = {sizes.n_attention_at_d}, the LSTM over d = {span(sizes.d_linear)} at
n = {sizes.n_recurrent_at_d}, the convolution over the same d at n = {sizes.n_convolution_at_d}. Peak memory
is the allocator's peak during the forward pass (torch.profiler), input and weights excluded. Exponents are
least-squares slopes on log–log axes. Sequential operations and path lengths are counted on autograd graphs
for n = {span(sizes.n_graph)}, and their growth is the best of a constant, logarithmic and linear fit.

| layer | complexity | time in n | time in d | memory in n | sequential ops: table → measured | max path length: ditto |
| --- | --- | --- | --- | --- | --- | --- |
{rows}

The math path materialises the n×n weights: its memory grows as n^{exponents["bytes_n"]["attention"]:.2f}, the
fused kernel's as n^{exponents["bytes_n"]["fused attention"]:.2f}, while their times grow as
n^{exponents["time_n"]["attention"]:.2f} and n^{exponents["time_n"]["fused attention"]:.2f}. The math path's
slopes between consecutive n are {local}{cache_note}.

Sequential operations at n = {n_max}: attention {seq["attention"][n_max]}, convolution
{seq["convolution"][n_max]}, the unrolled LSTM {seq["recurrent"][n_max]} autograd nodes in a chain. The graph
of `torch.nn.LSTM` itself is {_describe(fused_lstm)} in n: {fused_note}. Maximum path length from x_0 to
y_{{n−1}} at n = {n_max}: {path["attention"][n_max]} attention layer, {path["recurrent"][n_max]} hand-offs
between LSTM cell steps, {path["convolution"][n_max]} causal convolutions with dilation {K}^l against
{path["convolution (contiguous)"][n_max]} with contiguous kernels.
"""
    numbers = {
        "time_exponent_n": {name: exponents["time_n"][name] for name in TABLE},
        "time_exponent_d": {name: exponents["time_d"][name] for name in TABLE},
        "memory_exponent_n": {name: exponents["bytes_n"][name] for name in TABLE},
        "fused_attention": {
            "time_exponent_n": exponents["time_n"]["fused attention"],
            "time_exponent_d": exponents["time_d"]["fused attention"],
            "memory_exponent_n": exponents["bytes_n"]["fused attention"],
        },
        "seconds_n": scaling["time_n"],
        "seconds_d": scaling["time_d"],
        "peak_bytes_n": scaling["bytes_n"],
        "sequential_ops": seq,
        "path_length": path,
        "sequential_ops_growth": seq_growth,
        "path_length_growth": path_growth,
        "k": K,
        "sizes": asdict(sizes),
    }
    return Section(
        title="Computational complexity, measured",
        labels=LABELS,
        text=text,
        figures=figures,
        numbers=numbers,
    )
