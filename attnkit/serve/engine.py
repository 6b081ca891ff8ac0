"""The server's one model thread: every request becomes a job on its queue, and the thread
alone touches the model (``attnkit serve`` makes it the main thread, the HTTP side another).

Completions (decoder-only models) run as one continuous batch
(:class:`~attnkit.generation.continuous.ContinuousBatch`): a job joins the running batch at the
next step and leaves it when done or when its client has gone. Translations waiting together
with the same decoding settings are decoded as one batch by ``model.generate``. Results and
streamed tokens go back to the asyncio side through ``loop.call_soon_threadsafe``. A model
error fails the jobs it touched, with a message and no traceback, and the thread goes on.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from attnkit.generation.continuous import ContinuousBatch, Request, Scored
from attnkit.generation.greedy import sampler
from attnkit.models.core import Model
from attnkit.serve.metrics import Metrics

log = logging.getLogger("attnkit.serve")

# A job's events: ("token", value), ("done", result), ("error", message), and for a completion
# that scores its prompt ("prompt", scores) before any token. A completion's token value is
# (id, its score or None); a streamed translation's is (row, id).
Event = tuple[str, Any]


@dataclass(eq=False)
class Job:
    """One request's work. ``kind``: "complete" (ids, max_new_tokens, eos, temperature, top_p,
    seed, and optionally adjust, top_logprobs, prompt_logprobs: see
    :class:`~attnkit.generation.continuous.Request`), "translate" (sources, stream, and
    ``decoding``: its :class:`~attnkit.generation.options.DecodingOptions`, jobs with equal ones
    decoded as one batch) or "call" (``work``, run on the model thread: a forward pass for
    the attention and the embeddings endpoints)."""

    kind: str
    loop: asyncio.AbstractEventLoop
    options: dict[str, Any] = field(default_factory=dict)
    work: Callable[[], Any] | None = None
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    request: Request | None = None

    def emit(self, kind: str, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed (a shutdown past its deadline): nobody is listening
            self.cancelled.set()


class QueueFullError(Exception):
    """More jobs wait than the server takes."""


class Engine:
    """The model thread. ``max_batch``: rows decoded together; ``max_queue``: jobs waiting;
    ``compile``: completions' decoding step compiled, one graph per layout of the batch (True:
    each compiles at its first step, seconds to a minute, :meth:`warm` compiling the first before
    any request comes; ``"auto"``: a layout decodes eagerly until its step, compiled in the
    background, is on the disk, :class:`~attnkit.generation.continuous.ContinuousBatch`)."""

    def __init__(
        self,
        model: Model,
        metrics: Metrics,
        max_batch: int = 32,
        max_queue: int = 256,
        compile: bool | Literal["auto"] = False,
    ) -> None:
        self.model, self.metrics, self.compile = model, metrics, compile
        self.max_batch, self.max_queue = max_batch, max_queue
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.waiting: list[Job] = []  # taken from the queue, not yet in the batch
        self.running: dict[int, Job] = {}  # id(request) -> job, in the continuous batch
        self.batch = (
            None
            if model.config.is_encoder_decoder or model.config.family == "bert"
            else ContinuousBatch(model, compile)
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run the loop on a thread of its own (the app's default)."""
        self._thread = threading.Thread(target=self.run, name="attnkit-model", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def warm(self) -> None:
        """Compile the step of a one-row batch now (where completions are compiled), on the
        calling thread: the first request then does not wait for it."""
        if self.batch is None or self.compile is not True:
            return
        with torch.no_grad():
            self.batch.add([Request([self.model.config.bos_token_id or 0], 2)])
            while len(self.batch):
                self.batch.step()

    def pending(self) -> int:
        return self.jobs.qsize() + len(self.waiting)

    def submit(self, *jobs: Job) -> None:
        """Queue ``jobs``, all or none: refused whole when they would pass ``max_queue``."""
        if self.pending() + len(jobs) > self.max_queue:
            raise QueueFullError(f"{self.pending()} requests are waiting (--max-queue {self.max_queue}); retry later")
        for job in jobs:
            self.jobs.put(job)

    def run(self) -> None:
        """The loop, on the calling thread, until :meth:`stop`. ``attnkit serve`` runs it on the
        main thread, where the model was loaded: PyTorch's CPU kernels run their OpenMP team
        from the thread that calls them, and a second team (a model thread beside a main
        thread that already ran kernels) puts more OpenMP threads than cores on a 2-core
        machine, where libgomp stops spinning and every small kernel waits on a futex
        (measured: a bf16 matrix-vector product 37 -> 80 us, SmolLM2 decoding 1.5x slower)."""
        torch.set_grad_enabled(False)
        while not self._stop.is_set():
            idle = not self.running and not self.waiting
            try:
                self.waiting.append(self.jobs.get(timeout=0.05) if idle else self.jobs.get_nowait())
                while True:
                    self.waiting.append(self.jobs.get_nowait())
            except queue.Empty:
                pass
            try:
                self._serve_waiting()
                if self.running:
                    self._step()
            except Exception:  # a bug here must not leave every later request hanging
                log.exception("the model loop failed; its running requests are failed and it goes on")
                self._reset()

    def _reset(self) -> None:
        """Fail what runs and waits, and start from an empty batch."""
        jobs = [*self.running.values(), *self.waiting]
        self.running.clear()
        self.waiting = []
        if self.batch is not None:
            self.batch = ContinuousBatch(self.model, self.compile)
        for job in jobs:
            job.emit("error", "the model loop failed on this request; see the server's log")

    def _serve_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        joining: list[Job] = []
        for job in waiting:
            if job.cancelled.is_set():
                job.emit("error", "cancelled")
            elif job.kind == "call":
                self._guarded([job], lambda job=job: job.emit("done", job.work()))  # type: ignore[misc]
            elif job.kind == "complete":
                if len(self.running) + len(joining) < self.max_batch:
                    joining.append(job)
                else:
                    self.waiting.append(job)  # the batch is full: wait for a row to free up
            else:
                self.waiting.append(job)
        if joining:
            self._guarded(joining, lambda: self._join(joining))
        translations = [job for job in self.waiting if job.kind == "translate"]
        if translations:
            first = translations[0]
            group: list[Job] = []
            for job in translations:
                same = job.options["decoding"] == first.options["decoding"]
                if (
                    same
                    and sum(len(j.options["sources"]) for j in group) + len(job.options["sources"]) <= self.max_batch
                ):
                    group.append(job)
            self.waiting = [job for job in self.waiting if job not in group]
            self._guarded(group, lambda: self._translate(group))

    def _join(self, jobs: list[Job]) -> None:
        assert self.batch is not None
        requests = []
        for job in jobs:
            o = job.options
            choose = None
            if o["temperature"] > 0:
                generator = torch.Generator().manual_seed(o["seed"] if o["seed"] is not None else secrets.randbits(63))
                choose = sampler(o["temperature"], None, o["top_p"], generator)
            job.request = Request(
                o["ids"], o["max_new_tokens"], o["eos"], choose, on_token=_emitter(job),
                on_prompt=lambda scores, job=job: job.emit("prompt", scores), adjust=o.get("adjust"),
                top_logprobs=o.get("top_logprobs"), prompt_logprobs=o.get("prompt_logprobs"),
            )  # fmt: skip
            requests.append(job.request)
        started = time.perf_counter()
        finished = self.batch.add(requests)
        self.metrics.observe_step(len(requests), time.perf_counter() - started)
        for job in jobs:
            self.running[id(job.request)] = job
        self._finish(finished)

    def _step(self) -> None:
        assert self.batch is not None
        gone = [job.request for job in self.running.values() if job.cancelled.is_set()]
        if gone:
            self.batch.remove(gone)  # type: ignore[arg-type]
            for request in gone:
                self.running.pop(id(request)).emit("error", "cancelled")
            if not self.running:
                return
        jobs = list(self.running.values())
        started = time.perf_counter()
        try:
            finished = self.batch.step()
        except Exception as err:  # a model error fails this batch, not the server
            self.batch.remove([job.request for job in jobs])  # type: ignore[misc]
            self.running.clear()
            self._fail(jobs, err)
            return
        self.metrics.observe_step(len(jobs), time.perf_counter() - started)
        self._finish(finished)

    def _finish(self, finished: list[Request]) -> None:
        for request in finished:
            job = self.running.pop(id(request))
            if request.error is not None:  # its own failure; the batch goes on
                job.emit("error", request.error)
            else:
                job.emit("done", {"tokens": request.tokens, "finish_reason": request.finish_reason})

    def _translate(self, jobs: list[Job]) -> None:
        from attnkit.data.padding import pad_right

        sources = [source for job in jobs for source in job.options["sources"]]
        owners = [job for job in jobs for _ in job.options["sources"]]
        ids, mask = pad_right(sources, self.model.config.pad_token_id or 0)
        options = jobs[0].options
        streamer = None
        if any(job.options["stream"] for job in jobs):

            def streamer(tokens: torch.Tensor) -> None:
                for row, token in enumerate(tokens.tolist()):
                    if owners[row].options["stream"]:
                        owners[row].emit("token", (row - owners.index(owners[row]), token))

        started = time.perf_counter()
        out = self.model.generate(ids, mask, streamer=streamer, options=options["decoding"])
        self.metrics.observe_step(len(sources), time.perf_counter() - started)
        row = 0
        for job in jobs:
            n = len(job.options["sources"])
            job.emit("done", {"tokens": out[row : row + n, 1:].tolist()})  # the start token dropped
            row += n

    def _guarded(self, jobs: list[Job], work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as err:
            self._fail(jobs, err)

    def _fail(self, jobs: list[Job], err: Exception) -> None:
        log.exception("model error")
        message = f"the model failed on this request ({type(err).__name__}: {err})"
        for job in jobs:
            job.emit("error", message)


def _emitter(job: Job) -> Callable[[int, Scored | None], None]:
    return lambda token, scored: job.emit("token", (token, scored))
