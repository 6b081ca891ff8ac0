"""A server's decoding steps compiled in the background, so that no request waits on a compile
([alg:att-decode]'s step, :mod:`attnkit.generation.compiled`).

A continuous batch under ``compile="auto"`` decodes a layout (rows × cache positions) eagerly
until its step is on the disk, and asks :class:`Precompiler` for it once. The precompiler
compiles the layouts asked, one at a time, each in a process of its own at the lowest priority
(``nice 19``): the process loads the model as the server did (its path and ``--weights``),
lays a batch out as asked and decodes one step, which compiles the step and keeps it where the
server finds it (the same key: the model's structure, the layout, torch, the CPU, the threads).
A compile in the server's own process would hold the model loop (dynamo traces on the
interpreter's lock) and start a second OpenMP team beside the loop's, which slowed every kernel
here (:meth:`attnkit.serve.engine.Engine.run`).

    python -m attnkit.serve.precompile MODEL WEIGHTS ROWS CAPACITY THREADS MODE
"""

from __future__ import annotations

import logging
import os
import queue
import subprocess
import sys
import threading
import time

import torch

log = logging.getLogger(__name__)


class Precompiler:
    """Compiles the steps of the layouts it is called with (``rows``, ``capacity``) for the
    model at ``model`` in ``weights`` format, in background processes, one after another."""

    def __init__(self, model: str, weights: str) -> None:
        self.model, self.weights = model, weights
        self.layouts: queue.Queue[tuple[int, int]] = queue.Queue()
        self.thread: threading.Thread | None = None

    def __call__(self, rows: int, capacity: int) -> None:
        self.layouts.put((rows, capacity))
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="attnkit-precompile", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            rows, capacity = self.layouts.get()
            self.compile(rows, capacity)

    def compile(self, rows: int, capacity: int) -> bool:
        """Compile one layout's step in a process of its own; whether it was kept (else one line
        in the log: the layout goes on decoding eagerly)."""
        from attnkit.generation.compiled import MODE

        # The step's key holds the threads and inductor's mode: the server's, not the process's defaults.
        layout, threads = [str(rows), str(capacity)], str(torch.get_num_threads())
        command = [sys.executable, "-m", __name__, self.model, self.weights, *layout, threads, MODE]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        what = f"{rows} row{'s' if rows > 1 else ''} x {capacity} positions"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            log.warning("compiling the decoding step for %s in the background failed (%s); it decodes eagerly",
                        what, last)  # fmt: skip
            return False
        log.info("the decoding step for %s compiled in the background in %.1f s", what, time.perf_counter() - start)
        return True


def main(argv: list[str]) -> int:
    from attnkit.generation import compiled
    from attnkit.generation.continuous import ContinuousBatch
    from attnkit.loading import from_pretrained

    model_path, weights, rows, capacity, threads, compiled.MODE = argv
    os.nice(19)  # behind the server's own work
    torch.set_num_threads(int(threads))
    torch.set_grad_enabled(False)
    model = from_pretrained(model_path, weights).eval()  # as the server loaded it ("auto" chooses alike)
    ContinuousBatch(model, compile=True).prepare(int(rows), int(capacity))  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
