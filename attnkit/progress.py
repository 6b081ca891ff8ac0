"""Progress of a long command: on a terminal, a redrawn bar (tqdm); anywhere else (a pipe, a
file, a CI log), one plain line every ``every`` seconds with the same fields, and one at the
end, so that a log holds lines rather than hundreds of kilobytes of redrawn frames."""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from tqdm import tqdm


class ProgressReport:
    """Progress towards ``total`` (steps, seconds with ``unit="s"``, or bytes with ``unit="B"``,
    shown in MB with the rate in MB/s and the time left), from ``initial``."""

    def __init__(
        self,
        total: float,
        desc: str,
        unit: str = "step",
        initial: float = 0,
        enabled: bool = True,
        every: float = 30.0,
        stream: IO[str] | None = None,
    ) -> None:
        if not every > 0:
            raise ValueError(f"the progress interval must be > 0 seconds, got {every}")
        self.stream = sys.stderr if stream is None else stream
        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.n = initial
        self.fields: dict[str, Any] = {}
        self.enabled = enabled
        terminal = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = None
        if terminal:
            bar_format = "{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]" if unit == "s" else None
            self.bar = tqdm(
                total=total, initial=initial, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True,
                bar_format=bar_format, unit_scale=unit == "B", unit_divisor=1000,
            )  # fmt: skip
        self.start = self.last = time.perf_counter()

    def update(self, n: float) -> None:
        """Move to position ``n``."""
        if self.bar is not None:
            self.bar.update(n - self.n)
        self.n = n
        if self.enabled and self.bar is None and time.perf_counter() - self.last >= self.every:
            self._line()

    def set_fields(self, **fields: Any) -> None:
        """The figures shown beside the position (step, loss, ...)."""
        self.fields = fields
        if self.bar is not None:
            self.bar.set_postfix(**fields)

    def line(self) -> str:
        shown = "".join(f", {k} {v}" for k, v in self.fields.items())
        elapsed = time.perf_counter() - self.start
        if self.unit == "B":  # bytes: MB, MB/s and the time left at that rate
            rate = self.n / elapsed if elapsed > 0 else 0.0
            left = f", {(self.total - self.n) / rate:.0f} s left" if rate > 0 and self.n < self.total else ""
            share = f" ({self.n / self.total:.0%})" if self.total else ""
            return (f"{self.desc}: {self.n / 1e6:.1f}/{self.total / 1e6:.1f} MB{share}, {rate / 1e6:.1f} MB/s{left}"
                    f"{shown} [{elapsed:.0f} s]")  # fmt: skip
        unit = " s" if self.unit == "s" else f" {self.unit}s"
        share = f" ({self.n / self.total:.0%})" if self.total else ""
        return f"{self.desc}: {self.n:.0f}/{self.total:.0f}{unit}{share}{shown} [{elapsed:.0f} s]"

    def _line(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self.last = time.perf_counter()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            self._line()
