"""Decoding steps compiled in the background, so that no decode waits on a compile
([alg:att-decode]'s step, :mod:`attnkit.generation.compiled`).

Under ``compile="auto"`` a layout whose step is not in the compile cache decodes eagerly and,
for a model :func:`~attnkit.loading.from_pretrained` loaded (it knows its path and weights),
asks its :class:`Precompiler` for the step once: ``generate``'s one-path step (rows, cache
capacity, a key mask or not) or a continuous batch's (rows, capacity). The precompiler
compiles the layouts asked, one at a time, each in a process of its own at the lowest priority
(``nice 19``): the process loads the model as it was loaded, decodes one step of that layout,
which compiles the step and keeps it where the asking process finds it (the same key: the
model's structure, the layout, torch, the CPU, the threads, inductor's mode), and ends with the
process that asked. A compile in the asking process would hold its decode for seconds to
minutes (SmolLM2's step, with its 934 weights as inputs, compiles for minutes) and, beside a
server's model loop, start a second OpenMP team, which slowed every kernel here
(:meth:`attnkit.serve.engine.Engine.run`).

The process runs ``python -m attnkit.cli.precompile MODEL WEIGHTS KIND ROWS CAPACITY MASKED
THREADS MODE`` (above generation, where models are loaded from their files).
"""

from __future__ import annotations

import logging
import queue
import subprocess
import sys
import threading
import time

import torch

from attnkit.models.core import Model
from attnkit.models.io import source

log = logging.getLogger(__name__)

KINDS = ("generate", "batch")  # generate's one-path step; a continuous batch's


class Precompiler:
    """Compiles the steps of the layouts it is called with (``kind``, ``rows``, ``capacity``,
    ``masked``) for the model at ``model`` loaded with ``weights``, in background processes, one
    after another, each layout once."""

    def __init__(self, model: str, weights: str) -> None:
        self.model, self.weights = model, weights
        self.layouts: queue.Queue[tuple[str, int, int, bool]] = queue.Queue()
        self.asked: set[tuple[str, int, int, bool]] = set()
        self.thread: threading.Thread | None = None

    def __call__(self, kind: str, rows: int, capacity: int, masked: bool = False) -> None:
        layout = (kind, rows, capacity, masked)
        if layout in self.asked:
            return
        self.asked.add(layout)
        self.layouts.put(layout)
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="attnkit-precompile", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            self.compile(*self.layouts.get())

    def compile(self, kind: str, rows: int, capacity: int, masked: bool = False) -> bool:
        """Compile one layout's step in a process of its own; whether it was kept (else one line
        in the log: the layout goes on decoding eagerly)."""
        from attnkit.generation.compiled import MODE

        # The step's key holds the threads and inductor's mode: the asking process's, not the child's defaults.
        layout = [kind, str(rows), str(capacity), str(int(masked))]
        settings = [str(torch.get_num_threads()), MODE]
        command = [sys.executable, "-m", "attnkit.cli.precompile", self.model, self.weights, *layout, *settings]
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        what = f"{rows} row{'s' if rows > 1 else ''} x {capacity} positions ({kind})"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            log.warning("compiling the decoding step for %s in the background failed (%s); it decodes eagerly",
                        what, last)  # fmt: skip
            return False
        log.info("the decoding step for %s compiled in the background in %.1f s", what, time.perf_counter() - start)
        return True


_precompilers: dict[tuple[str, str], Precompiler] = {}


def for_model(model: Model) -> Precompiler | None:
    """The process's precompiler for ``model``'s source (None: a model built in this process,
    which another cannot load)."""
    where = source(model)
    if where is None:
        return None
    if where not in _precompilers:
        _precompilers[where] = Precompiler(*where)
    return _precompilers[where]
