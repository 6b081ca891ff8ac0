"""The server's counters, written in the Prometheus text exposition format (version 0.0.4):
requests by endpoint and status, tokens in and out, rows per decoding step and request
latency as histograms, and what waits and runs now."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, value: float) -> None:
        i = bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            running += n
            out.append(f'{name}_bucket{{{labels}le="{bound:g}"}} {running}')
        out.append(f'{name}_bucket{{{labels}le="+Inf"}} {self.count}')
        plain = f"{{{labels.rstrip(',')}}}" if labels else ""
        return [*out, f"{name}_sum{plain} {self.sum:.6f}", f"{name}_count{plain} {self.count}"]


class Metrics:
    """Thread-safe: the model thread and the request handlers both write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.latency: dict[str, Histogram] = {}
        self.batch_rows = Histogram(BATCH_BUCKETS)
        self.step_seconds = Histogram(STEP_BUCKETS)

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            self.latency.setdefault(endpoint, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def observe_tokens(self, prompt: int, generated: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.generated_tokens += generated

    def observe_step(self, rows: int, seconds: float) -> None:
        with self._lock:
            self.batch_rows.observe(rows)
            self.step_seconds.observe(seconds)

    def render(self, gauges: dict[str, tuple[str, Callable[[], float]]]) -> str:
        """The exposition text; ``gauges``: name -> (help, current value)."""
        with self._lock:
            lines = [
                "# HELP attnkit_requests_total Requests answered, by endpoint and HTTP status.",
                "# TYPE attnkit_requests_total counter",
            ]
            for (endpoint, status), n in sorted(self.requests.items()):
                lines.append(f'attnkit_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            lines += [
                "# HELP attnkit_prompt_tokens_total Prompt and source tokens read.",
                "# TYPE attnkit_prompt_tokens_total counter",
                f"attnkit_prompt_tokens_total {self.prompt_tokens}",
                "# HELP attnkit_generated_tokens_total Tokens generated.",
                "# TYPE attnkit_generated_tokens_total counter",
                f"attnkit_generated_tokens_total {self.generated_tokens}",
                "# HELP attnkit_request_duration_seconds Time from a request's arrival to its last byte.",
                "# TYPE attnkit_request_duration_seconds histogram",
            ]
            for endpoint, histogram in sorted(self.latency.items()):
                lines += histogram.lines("attnkit_request_duration_seconds", f'endpoint="{endpoint}",')
            lines += [
                "# HELP attnkit_batch_rows Rows decoded together in one model call.",
                "# TYPE attnkit_batch_rows histogram",
                *self.batch_rows.lines("attnkit_batch_rows"),
                "# HELP attnkit_step_seconds Time of one model call (a decoding step or a whole batch).",
                "# TYPE attnkit_step_seconds histogram",
                *self.step_seconds.lines("attnkit_step_seconds"),
            ]
        for name, (text, value) in gauges.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {value():g}"]
        return "\n".join(lines) + "\n"
