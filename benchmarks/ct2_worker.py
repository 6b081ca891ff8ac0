"""CTranslate2 in a process of its own, driven by the decoding benchmark over a pipe.

Why not in the benchmark's process: once CTranslate2 has decoded there, PyTorch's kernels
run slower for the rest of the process (measured here, GPT-2 124M batch-1 greedy int8:
attnkit 135-150 tokens/s before CTranslate2's first call, 81-90 after it, even 5 s later;
CTranslate2's own speed is the same either way). Its bundled OpenMP runtime and PyTorch's
are two libraries in one process; with CTranslate2 in a separate process neither slows the
other, and the benchmark still times all systems in turn in one run.

Protocol: one JSON object per line on stdin, one ``{"ok": true}`` line back per object:
``{"op": "generator" | "translator", "name", "path", "compute_type", "inputs", "options"}``
loads a model and binds its inputs; ``{"op": "run", "name"}`` decodes them once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def main() -> None:
    import ctranslate2

    jobs: dict[str, Callable[[], object]] = {}
    for line in sys.stdin:
        message = json.loads(line)
        if message["op"] == "run":
            jobs[message["name"]]()
        else:
            kind = ctranslate2.Generator if message["op"] == "generator" else ctranslate2.Translator
            model = kind(message["path"], device="cpu", intra_threads=2, compute_type=message["compute_type"])
            decode = model.generate_batch if message["op"] == "generator" else model.translate_batch
            jobs[message["name"]] = lambda d=decode, m=message: d(m["inputs"], **m["options"])
        print(json.dumps({"ok": True}), flush=True)


class Worker:
    """The parent's end: load models in the worker, then call them as plain callables."""

    def __init__(self) -> None:
        root = Path(__file__).resolve().parent.parent
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.ct2_worker"], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip

    def _send(self, message: dict) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline()
        if not reply:
            raise RuntimeError(f"the CTranslate2 worker stopped (exit {self.process.wait()}) on {message['op']}")

    def load(
        self, op: str, name: str, path: Path, compute_type: str, inputs: list, options: dict
    ) -> Callable[[], None]:
        self._send({"op": op, "name": name, "path": str(path), "compute_type": compute_type, "inputs": inputs,
                    "options": options})  # fmt: skip
        return lambda: self._send({"op": "run", "name": name})

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


if __name__ == "__main__":
    main()
