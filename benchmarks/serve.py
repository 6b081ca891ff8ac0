"""``python -m benchmarks serve``: ``attnkit serve`` under 1, 8 and 32 concurrent clients
against the same requests made one at a time through ``model.generate``.

Every request is a greedy completion of one Bible verse's opening words, ``max_tokens`` new
tokens. The server runs in its own process (2 threads), the clients in this one (asyncio +
httpx, mostly waiting); the sequential baseline runs in this process once the server is gone.
Reported: requests/s, generated tokens/s, p50/p99 latency, and tokens/s against the baseline's;
the seconds from the server's start to its first answer, and its peak RSS. ``step``: the
server's decoding step as it runs by default (``auto``: each batch layout eager until its step,
compiled by a background process, is in the compile cache), ``compiled`` (``--compile``: each
layout compiled at its first step, which the timings then include) or ``eager``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import torch

CLIENTS = (1, 8, 32)


def _prompts(count: int) -> list[str]:
    from attnkit.data import corpora

    verses = corpora.bible_pairs("4", "l").test
    return [" ".join(english.split()[:6]) for english, _ in verses[:count]]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def sequential(directory: Path, prompts: list[str], max_tokens: int, weights: str) -> dict[str, float]:
    """The same requests one at a time through ``model.generate`` (batch 1, greedy)."""
    import attnkit
    from attnkit.generation.text import prompt_ids

    model = attnkit.from_pretrained(directory, weights=weights)
    eos = model.config.eos_token_id
    latencies, tokens = [], 0
    started = time.perf_counter()
    for ids in prompt_ids(model.tokenizer, model.config, prompts):
        begin = time.perf_counter()
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, compile=False)[0, len(ids) :].tolist()
        latencies.append(time.perf_counter() - begin)
        tokens += out.index(eos) if eos in out else len(out)
    seconds = time.perf_counter() - started
    return _summary(len(prompts), tokens, seconds, latencies)


def _summary(requests: int, tokens: int, seconds: float, latencies: list[float]) -> dict[str, float]:
    return {
        "requests": requests, "tokens": tokens, "seconds": seconds, "requests_per_s": requests / seconds,
        "tokens_per_s": tokens / seconds, "p50_s": statistics.median(latencies), "p99_s": _percentile(latencies, 0.99),
    }  # fmt: skip


async def _load(url: str, prompts: list[str], clients: int, max_tokens: int) -> dict[str, float]:
    import httpx

    latencies: list[float] = []
    tokens = 0
    work = list(prompts)

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while work:
            prompt = work.pop()
            begin = time.perf_counter()
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
            answer = (await http.post("/v1/completions", json=body)).raise_for_status().json()
            latencies.append(time.perf_counter() - begin)
            tokens += answer["usage"]["completion_tokens"]

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=64)) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        seconds = time.perf_counter() - started
    return _summary(len(prompts), tokens, seconds, latencies)


STEPS = {"auto": [], "compiled": ["--compile"], "eager": ["--no-compile"]}


def _peak_rss_mb(pid: int) -> float:
    """A process's peak resident memory so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmHWM for process {pid}")


def run(
    directory: Path, max_tokens: int = 32, weights: str = "fp32", small: bool = False, step: str = "auto"
) -> dict[str, Any]:
    """The table's numbers: per client count, the server's; the sequential baseline's; the
    server's first answer and peak RSS."""
    from attnkit.serve.server import spawn

    count = 8 if small else 64
    prompts = _prompts(count)
    served: dict[int, dict[str, float]] = {}
    flags = ["--weights", weights, "--max-batch", "32", "--max-new-tokens", str(max_tokens), *STEPS[step]]
    started = time.perf_counter()
    with spawn(directory, *flags, timeout=600) as (url, process, _):
        asyncio.run(_load(url, prompts[:1], 1, max_tokens))
        first_answer = time.perf_counter() - started
        asyncio.run(_load(url, prompts[:4], 4, max_tokens))  # warm-up
        for clients in CLIENTS:  # one client (as slow as the baseline) gets a quarter of the requests
            share = prompts[: count // 4] if clients == 1 else prompts
            served[clients] = asyncio.run(_load(url, share, clients, max_tokens))
        peak = _peak_rss_mb(process.pid)
    baseline = sequential(directory, prompts[: count // 4], max_tokens, weights)
    return {"model": str(directory), "weights": weights, "max_tokens": max_tokens, "step": step,
            "first_answer_s": first_answer, "peak_rss_mb": peak, "sequential": baseline,
            "served": served}  # fmt: skip


def table(result: dict[str, Any]) -> str:
    base = result["sequential"]
    lines = [
        f"### attnkit serve vs one request at a time through generate ({result['model']}, {result['weights']}, "
        f"greedy, {result['max_tokens']} new tokens a request, step {result['step']}: first answer "
        f"{result['first_answer_s']:.1f} s after the start, peak RSS {result['peak_rss_mb']:,.0f} MB)",
        "",
        "| clients | requests | requests/s | tokens/s | p50 latency s | p99 latency s | tokens/s vs sequential |",
        "|---|---|---|---|---|---|---|",
        f"| sequential generate | {base['requests']} | {base['requests_per_s']:.2f} | {base['tokens_per_s']:.1f} | "
        f"{base['p50_s']:.2f} | {base['p99_s']:.2f} | 1.00× |",
    ]
    for clients, row in result["served"].items():
        lines.append(
            f"| {clients} | {row['requests']} | {row['requests_per_s']:.2f} | {row['tokens_per_s']:.1f} | "
            f"{row['p50_s']:.2f} | {row['p99_s']:.2f} | {row['tokens_per_s'] / base['tokens_per_s']:.2f}× |"
        )
    return "\n".join(lines)
