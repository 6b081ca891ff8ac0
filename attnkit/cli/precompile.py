"""The background process that compiles one decoding step for
:mod:`attnkit.generation.background` (not a command of ``attnkit --help``):

    python -m attnkit.cli.precompile MODEL WEIGHTS KIND ROWS CAPACITY MASKED THREADS MODE

It loads the model as the asking process did, decodes one step of the layout, which compiles the
step into the compile cache, at the lowest priority, and ends with the process that started it.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import torch

from attnkit.generation import compiled
from attnkit.generation.background import KINDS
from attnkit.generation.continuous import ContinuousBatch
from attnkit.generation.incremental import prepare
from attnkit.loading import from_pretrained


def _exit_with(parent: int) -> None:
    """End this process when the one that started it has ended (a compile for a process that is
    gone would take the machine's cores for minutes, for nobody)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="attnkit-precompile-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    model_path, weights, kind, rows, capacity, masked, threads, compiled.MODE = argv
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    os.nice(19)  # behind the asking process's own work
    _exit_with(os.getppid())
    torch.set_num_threads(int(threads))
    torch.set_grad_enabled(False)
    model = from_pretrained(model_path, weights).eval()  # as the asking process loaded it
    if kind == "batch":
        ContinuousBatch(model, compile=True).prepare(int(rows), int(capacity))  # type: ignore[arg-type]
    else:
        prepare(model, int(rows), int(capacity), masked == "1")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
