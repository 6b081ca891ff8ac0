"""Whether a fast path pays before it is built (issue: performance): the fused Q/K/V
projection — one (d_model → 3·d_model) matrix product instead of three (d_model → d_model)
ones, forward and backward — against attnkit's three projections, on the same weights."""

from __future__ import annotations

import torch

from benchmarks.common import Comparison, compare


def _projections(layers: list[torch.nn.Linear], x: torch.Tensor) -> None:
    """Q, K and V of ``x`` through ``layers`` (three, or one fused), forward and backward."""
    parts = [layer(x) for layer in layers]
    q, k, v = parts if len(parts) == 3 else parts[0].chunk(3, dim=-1)
    (q.sum() + k.sum() + v.sum()).backward()


def run(repeats: int = 7, small: bool = False, tokens: int = 1024) -> list[Comparison]:
    results = []
    for d_model in (128,) if small else (256, 512, 768):
        torch.manual_seed(0)
        w_q, w_k, w_v = (torch.nn.Linear(d_model, d_model) for _ in range(3))
        fused = torch.nn.Linear(d_model, 3 * d_model)
        with torch.no_grad():  # the same function: the three weights stacked
            fused.weight.copy_(torch.cat([w_q.weight, w_k.weight, w_v.weight]))
            fused.bias.copy_(torch.cat([w_q.bias, w_k.bias, w_v.bias]))
        x = torch.randn(tokens, d_model, requires_grad=True)
        results.append(
            compare(
                f"Q/K/V projections d={d_model}, {tokens} tokens, fwd+bwd",
                lambda layers=[w_q, w_k, w_v], x=x: _projections(layers, x),
                lambda layers=[fused], x=x: _projections(layers, x),
                work=tokens, peer_name="one fused projection", repeats=repeats,
            )
        )  # fmt: skip
    return results
