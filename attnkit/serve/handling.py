"""What every API of ``attnkit serve`` shares: the state, reading a body, waiting for the model
thread's jobs while watching for the client to leave, server-sent events, errors as JSON, and
the checks each endpoint makes (the model's family, its name, a prompt's length)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from attnkit.models.core import Model
from attnkit.serve.engine import Engine, Job, QueueFullError
from attnkit.serve.metrics import Metrics
from attnkit.serve.schema import ApiError, Limits, parse_json

log = logging.getLogger("attnkit.serve")

T = TypeVar("T")

# An over-long body is read and dropped up to this many bytes (or seconds) before its 413, so
# that the client, still sending, reads the answer instead of a reset (a lingering close).
LINGER_BYTES = 64 << 20
LINGER_SECONDS = 5.0


@dataclass
class State:
    """What the handlers share: the model, its engine, the limits, the shutdown flag."""

    model: Model
    name: str
    engine: Engine
    metrics: Metrics
    limits: Limits
    api_key: str | None = None
    created: int = 0  # when the server started (seconds since the epoch), for /v1/models
    draining: bool = False
    in_flight: int = 0

    @property
    def family(self) -> str:
        return self.model.config.family


def error_response(err: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


async def linger(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Read and drop what is left of a request's body, up to :data:`LINGER_BYTES` or
    :data:`LINGER_SECONDS`."""

    async def drain() -> None:
        size = 0
        while size <= LINGER_BYTES:
            message = await receive()
            size += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(drain(), LINGER_SECONDS)


async def read_body(request: HttpRequest, limit: int) -> dict[str, Any]:
    """The JSON object of the body, read up to ``limit`` bytes (a body without a declared
    length is cut off there: 413, once the rest is drained)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            await linger(request.receive)
            raise ApiError(413, f"the body is over this server's limit of {limit} bytes")
        chunks.append(chunk)
    return parse_json(b"".join(chunks))


async def events(job: Job) -> AsyncIterator[tuple[str, Any]]:
    """The job's events until its end; the job is cancelled if the consumer stops early (the
    client went away: a completion's row leaves the batch at the next step; a translation,
    decoded by one ``generate`` call, runs to its end)."""
    try:
        while True:
            kind, value = await job.events.get()
            if kind == "error":
                raise ApiError(500, value, "server_error")
            yield kind, value
            if kind == "done":
                return
    finally:
        job.cancelled.set()


async def _result(job: Job) -> Any:
    """The job's result once it is done (its streamed tokens passed over)."""
    async for kind, value in events(job):
        if kind == "done":
            return value
    raise ApiError(500, "the job ended without a result", "server_error")


async def watched(request: HttpRequest, work: Coroutine[Any, Any, T], jobs: list[Job]) -> T:
    """``work``'s result, awaited while listening for the client's disconnect: if it goes away,
    ``work`` stops and every job is cancelled (the model thread drops their rows at the next step)."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    listener, task = asyncio.ensure_future(gone()), asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            raise ApiError(499, "the client went away", "cancelled")
        return task.result()
    finally:
        listener.cancel()
        task.cancel()
        for job in jobs:
            job.cancelled.set()


async def outcomes(jobs: list[Job], request: HttpRequest) -> list[Any]:
    """The jobs' results, waited for while watching for the client's disconnect."""

    async def results() -> list[Any]:
        return list(await asyncio.gather(*(_result(job) for job in jobs)))

    return await watched(request, results(), jobs)


def sse(data: Any) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def stream_response(chunks: AsyncIterator[bytes]) -> StreamingResponse:
    async def guarded() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield chunk
        except ApiError as err:  # the status is sent already: the error is the last event
            yield sse(err.body())
        yield sse("[DONE]")

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(guarded(), media_type="text/event-stream", headers=headers)


Endpoint = Callable[[HttpRequest], Awaitable[Response]]


def handled(endpoint: Endpoint) -> Endpoint:
    """``endpoint`` answering an :class:`ApiError` as its JSON, and anything else as a 500 line
    (the traceback goes to the log, never to the client)."""

    async def run(request: HttpRequest) -> Response:
        try:
            return await endpoint(request)
        except ApiError as err:
            return error_response(err)
        except Exception:
            log.exception("internal error on %s", request.url.path)
            return error_response(ApiError(500, "internal server error; see the server's log", "server_error"))

    return run


class Api:
    """One API of the server over the shared :class:`State`: its routes and the checks its
    endpoints share."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.tokenizer = state.model.tokenizer
        cfg = state.model.config
        self.context = cfg.max_len
        self.max_input = min(state.limits.max_input_tokens or self.context, self.context)
        self.max_new = state.limits.max_new_tokens or self.context

    def routes(self) -> list[Route]:
        raise NotImplementedError

    async def body(self, request: HttpRequest) -> dict[str, Any]:
        return await read_body(request, self.state.limits.max_body_bytes)

    def need(self, *families: str, use: str) -> None:
        """The model is of one of ``families`` (else a 400 saying what to ``use``) and has a tokenizer."""
        if self.state.family not in families:
            raise ApiError(400, f"this server's model is a {self.state.family} model; {use}", param="model")
        self.need_tokenizer()

    def need_tokenizer(self) -> None:
        if self.tokenizer is None:
            raise ApiError(400, "this server's model has no tokenizer, so text cannot be read; serve one that has")

    def model_field(self, body: dict[str, Any]) -> None:
        if body.get("model") not in (self.state.name, None):
            raise ApiError(
                404,
                f"model {body['model']!r} is not served here; this server serves {self.state.name!r} (GET /v1/models)",
                "not_found_error",
                param="model",
            )

    def check_ids(self, ids: list[int], what: str, param: str) -> None:
        vocab = self.state.model.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ApiError(422, f"{what} holds token id {bad[0]}, out of range; ids are 0..{vocab - 1}", param=param)

    def token_rows(
        self, given: str | list, name: str, limit: int, encode: Callable[[list[str]], list[list[int]]]
    ) -> list[list[int]]:
        """The token ids of the field ``name``: a text, texts (read by ``encode``), ids or lists of
        ids, at most ``limit`` of them; texts must not be blank, and given ids must be the
        vocabulary's and fit the input limit."""
        rows = [given] if isinstance(given, str) else given
        if not rows:
            raise ApiError(422, f"{name} is an empty list; send a text or token ids", param=name)
        if isinstance(rows[0], int):
            rows = [rows]
        if len(rows) > limit:
            raise ApiError(413, f"{name} holds {len(rows)} {name}s, over this server's limit of {limit}", param=name)
        one = f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
        if isinstance(rows[0], str):
            if any(not text.strip() for text in rows):
                raise ApiError(400, f"{one} is empty; send some text", param=name)
            return encode(rows)
        for ids in rows:
            if not ids:
                raise ApiError(422, f"{one} of token ids is empty; send at least one id", param=name)
            self.check_ids(ids, f"the {name}", name)
            self.check_length(ids, f"the {name}", 0, param=name)
        return [list(ids) for ids in rows]

    def check_length(self, ids: list[int], what: str, new: int, param: str | None = None) -> None:
        if len(ids) > self.max_input:
            raise ApiError(
                413, f"{what} is {len(ids)} tokens, over this server's limit of {self.max_input}", param=param
            )
        if len(ids) + new > self.context and self.state.model.config.positional == "learned":
            raise ApiError(
                400,
                f"{what} ({len(ids)} tokens) + {new} new tokens exceeds the model's context of {self.context}; "
                "shorten it or ask for fewer tokens",
                param=param,
            )

    def submit(self, *jobs: Job) -> None:
        try:
            self.state.engine.submit(*jobs)
        except QueueFullError as err:
            raise ApiError(429, str(err), "rate_limit_error") from None
