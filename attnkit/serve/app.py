"""The ASGI app of ``attnkit serve`` (Starlette): the OpenAI-shaped completion endpoints with
server-sent events, translation, attention weights, health, Prometheus metrics and the page.

Every answer other than 200 is ``{"error": {"message", "type"}}``; a model error is a 500
with a one-line message, never a traceback, and the server goes on. The model runs on the
:class:`~attnkit.serve.engine.Engine` thread; handlers only check, tokenize and wait.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from attnkit.generation.text import TemplateRefusalError, TextStream, chat_prompt, prompt_ids, source_ids
from attnkit.models.core import Model
from attnkit.serve.engine import Engine, Job, QueueFullError
from attnkit.serve.metrics import Metrics
from attnkit.serve.schema import ApiError, Limits, fields, in_range, parse_json

log = logging.getLogger("attnkit.serve")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class State:
    """What the handlers share: the model, its engine, the limits, the shutdown flag."""

    model: Model
    name: str
    engine: Engine
    metrics: Metrics
    limits: Limits
    api_key: str | None = None
    draining: bool = False
    in_flight: int = 0

    @property
    def family(self) -> str:
        return self.model.config.family


# Sampling below this temperature is greedy in all but overflow: refused, 0 asks for greedy.
MIN_TEMPERATURE = 0.01
# Attention maps are layers x heads x queries x keys numbers: the endpoint reads at most this many tokens.
MAX_ATTENTION_TOKENS = 128
# The fields both completion endpoints take besides their prompt or messages (OpenAI's names).
SAMPLING = dict(max_tokens="int", temperature="number", top_p="number", stream="bool", seed="int", n="int",
                model="str", user="str")  # fmt: skip


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


class Guard:
    """ASGI middleware around every request: refuses new ones while draining (503), checks the
    API key (401) and the declared body size (413), counts what is in flight (the shutdown
    waits for it) and records each answer's status and latency."""

    OPEN = ("/", "/health")  # the page and the health check need no key

    def __init__(self, app: Callable, state: State) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, started, status = scope["path"], time.perf_counter(), 500

        async def record(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, record)
            self.state.metrics.observe_request(_endpoint(path), status, time.perf_counter() - started)
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, record)
        finally:
            self.state.in_flight -= 1
            self.state.metrics.observe_request(_endpoint(path), status, time.perf_counter() - started)

    def _refusal(self, scope: Scope) -> Response | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.state.draining and scope["path"] != "/health":
            return error_response(
                ApiError(503, "the server is shutting down; retry on another instance", "unavailable")
            )
        if self.state.api_key is not None and scope["path"] not in self.OPEN:
            given = headers.get("authorization", "")
            expected = f"Bearer {self.state.api_key}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                what = "missing" if not given else "wrong"
                return error_response(
                    ApiError(401, f"the API key is {what}; send Authorization: Bearer <key>", "authentication_error")
                )
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.state.limits.max_body_bytes:
            limit = self.state.limits.max_body_bytes
            return error_response(ApiError(413, f"the body is {length} bytes, over this server's limit of {limit}"))
        return None


def _endpoint(path: str) -> str:
    known = ("/", "/health", "/metrics", "/v1/completions", "/v1/chat/completions", "/v1/translate", "/v1/attention")
    return path if path in known else "other"


async def read_body(request: HttpRequest, limit: int) -> dict[str, Any]:
    """The JSON object of the body, read up to ``limit`` bytes (a body without a declared
    length is cut off there: 413)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
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


async def outcomes(jobs: list[Job], request: HttpRequest) -> list[Any]:
    """The jobs' results, waited for while listening for the client's disconnect: if it goes
    away, every job is cancelled (the model thread drops their rows at the next step)."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    listener = asyncio.ensure_future(gone())
    pending = {asyncio.ensure_future(_result(job)): n for n, job in enumerate(jobs)}
    results: list[Any] = [None] * len(jobs)
    try:
        while pending:
            done, _ = await asyncio.wait({*pending, listener}, return_when=asyncio.FIRST_COMPLETED)
            if listener in done:
                raise ApiError(499, "the client went away", "cancelled")
            for task in done:
                results[pending.pop(task)] = task.result()
        return results
    finally:
        listener.cancel()
        for task in pending:
            task.cancel()
        for job in jobs:
            job.cancelled.set()


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


class Api:
    """The endpoints, over one :class:`State`."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.tokenizer = getattr(state.model, "tokenizer", None)
        cfg = state.model.config
        self.context = cfg.max_len
        self.max_input = min(state.limits.max_input_tokens, cfg.max_len)

    # ---- shared checks -------------------------------------------------------------------
    def _need(self, *families: str, use: str) -> None:
        if self.state.family not in families:
            raise ApiError(400, f"this server's model is a {self.state.family} model; {use}")
        if self.tokenizer is None:
            raise ApiError(400, "this server's model has no tokenizer, so text cannot be read; serve one that has")

    def _model_field(self, body: dict[str, Any]) -> None:
        if "model" in body and body["model"] not in (self.state.name, None):
            raise ApiError(404, f"model {body['model']!r} is not served here; this server serves {self.state.name!r}")

    def _check_length(self, ids: list[int], what: str, new: int) -> None:
        if len(ids) > self.max_input:
            raise ApiError(413, f"{what} is {len(ids)} tokens, over this server's limit of {self.max_input}")
        if len(ids) + new > self.context and self.state.model.config.positional == "learned":
            raise ApiError(
                400,
                f"{what} ({len(ids)} tokens) + {new} new tokens exceeds the model's context of {self.context}; "
                "shorten it or ask for fewer tokens",
            )

    def _submit(self, *jobs: Job) -> None:
        try:
            self.state.engine.submit(*jobs)
        except QueueFullError as err:
            raise ApiError(429, str(err), "rate_limit_error") from None

    # ---- GET -----------------------------------------------------------------------------
    async def health(self, request: HttpRequest) -> Response:
        status = "draining" if self.state.draining else "ok"
        limits = {"max_new_tokens": self.state.limits.max_new_tokens, "max_beams": self.state.limits.max_beams}
        body = {"status": status, "model": self.state.name, "family": self.state.family, "limits": limits}
        return JSONResponse(body, status_code=503 if self.state.draining else 200)

    async def metrics(self, request: HttpRequest) -> Response:
        engine = self.state.engine
        text = self.state.metrics.render(
            {
                "attnkit_queue_length": ("Requests waiting for the model.", engine.pending),
                "attnkit_running_rows": ("Rows in the running batch.", lambda: len(engine.running)),
                "attnkit_in_flight_requests": ("Requests being answered.", lambda: self.state.in_flight),
            }
        )
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def page(self, request: HttpRequest) -> Response:
        return HTMLResponse(resources.files("attnkit.serve").joinpath("page.html").read_text(encoding="utf-8"))

    # ---- completions ---------------------------------------------------------------------
    def _sampling(self, body: dict[str, Any]) -> dict[str, Any]:
        max_new = body.get("max_tokens", 16)
        in_range("max_tokens", max_new, 1, self.state.limits.max_new_tokens, limit=True)
        temperature = body.get("temperature", 1.0)
        in_range("temperature", temperature, 0.0, 2.0)
        if 0 < temperature < MIN_TEMPERATURE:  # logits / 1e-40 overflow to inf
            raise ApiError(422, f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {temperature}")
        if "seed" in body:
            in_range("seed", body["seed"], 0, 2**63 - 1)
        top_p = body.get("top_p", 1.0)
        if not 0 < top_p <= 1:
            raise ApiError(422, f"top_p must be in (0, 1], got {top_p}")
        if body.get("n", 1) != 1:
            raise ApiError(422, f"n must be 1 (one choice per prompt), got {body['n']}")
        eos = self.state.model.config.eos_token_id
        return dict(max_new_tokens=max_new, temperature=float(temperature), top_p=float(top_p),
                    seed=body.get("seed"), eos=[] if eos is None else [eos])  # fmt: skip

    async def _completion_body(self, request: HttpRequest, field: str, kind: str, use: str) -> dict[str, Any]:
        """The body of a completion request: ``field`` (of ``kind``) and the sampling fields."""
        body = fields(await read_body(request, self.state.limits.max_body_bytes), {field: kind, **SAMPLING}, (field,))
        self._model_field(body)
        self._need("gpt", use=use)
        return body

    async def completions(self, request: HttpRequest) -> Response:
        use = "/v1/completions needs a GPT-family model; use /v1/translate or /v1/attention"
        body = await self._completion_body(request, "prompt", "prompt", use)
        options = self._sampling(body)
        prompt = body["prompt"]
        vocab = self.state.model.config.vocab_size
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise ApiError(400, f"token id {bad[0]} is out of range; ids are 0..{vocab - 1}")
            prompts = [list(prompt)]
        else:
            texts = [prompt] if isinstance(prompt, str) else prompt
            if not texts or len(texts) > self.state.limits.max_batch:
                raise ApiError(413 if texts else 422, f"prompt must hold 1 to {self.state.limits.max_batch} prompts")
            if any(not t.strip() for t in texts):
                raise ApiError(400, "a prompt is empty; send some text")
            prompts = prompt_ids(self.tokenizer, self.state.model.config, texts)
        for ids in prompts:
            self._check_length(ids, "the prompt", options["max_new_tokens"])
        return await self._complete(request, prompts, options, body.get("stream", False), chat=False)

    async def chat_completions(self, request: HttpRequest) -> Response:
        use = "/v1/chat/completions needs a GPT-family model with a chat template"
        body = await self._completion_body(request, "messages", "messages", use)
        template = getattr(self.state.model, "chat_template", None)
        if not template:
            raise ApiError(400, "this server's model has no chat template; use /v1/completions")
        messages = body["messages"]
        if not messages:
            raise ApiError(422, "messages is empty; send at least one message")
        for m in messages:
            if set(m) - {"role", "content", "name"} or m["role"] not in ("system", "user", "assistant"):
                raise ApiError(422, f'a message must be {{"role": system|user|assistant, "content"}}, got {m}')
        options = self._sampling(body)
        try:
            ids = chat_prompt(template, self.tokenizer, self.state.model.config, messages)
        except TemplateRefusalError as err:  # the template's own check of the conversation
            raise ApiError(400, f"the model's chat template refuses this conversation: {err}") from None
        except ValueError as err:
            raise ApiError(500, str(err), "server_error") from None
        self._check_length(ids, "the conversation", options["max_new_tokens"])
        return await self._complete(request, [ids], options, body.get("stream", False), chat=True)

    async def _complete(
        self, request: HttpRequest, prompts: list[list[int]], options: dict, stream: bool, chat: bool
    ) -> Response:
        loop = asyncio.get_running_loop()
        jobs = [Job("complete", loop, {**options, "ids": ids}) for ids in prompts]
        self._submit(*jobs)  # all or none: a full queue refuses the whole request
        ident, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time())
        head = {"id": ident, "created": created, "model": self.state.name}
        if stream:
            return stream_response(self._stream_completion(jobs, head, chat, sum(map(len, prompts))))
        results = await outcomes(jobs, request)
        choices, generated = [], 0
        for index, result in enumerate(results):
            text = self._text(result["tokens"])
            generated += len(result["tokens"])
            content = {"message": {"role": "assistant", "content": text}} if chat else {"text": text, "logprobs": None}
            choices.append({"index": index, **content, "finish_reason": result["finish_reason"]})
        prompt_tokens = sum(map(len, prompts))
        self.state.metrics.observe_tokens(prompt_tokens, generated)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": generated,
            "total_tokens": prompt_tokens + generated,
        }
        kind = "chat.completion" if chat else "text_completion"
        return JSONResponse({**head, "object": kind, "choices": choices, "usage": usage})

    def _text(self, tokens: list[int]) -> str:
        eos = self.state.model.config.eos_token_id
        return self.tokenizer.decode([t for t in tokens if t != eos], skip_special_tokens=True)

    async def _stream_completion(
        self, jobs: list[Job], head: dict, chat: bool, prompt_tokens: int
    ) -> AsyncIterator[bytes]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        eos = self.state.model.config.eos_token_id
        queue: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()

        async def pump(index: int, job: Job) -> None:
            try:
                async for event, value in events(job):
                    await queue.put((index, event, value))
            except ApiError as err:
                await queue.put((index, "error", err))

        def chunk(index: int, text: str | None, finish: str | None) -> bytes:
            if chat:
                delta = {} if text is None else {"content": text}
                choice = {"index": index, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}
            return sse({**head, "object": kind, "choices": [choice]})

        tasks = [asyncio.create_task(pump(i, job)) for i, job in enumerate(jobs)]
        streams = [TextStream(self.tokenizer) for _ in jobs]
        generated, open_jobs = 0, len(jobs)
        try:
            if chat:
                for i in range(len(jobs)):
                    yield sse({**head, "object": kind, "choices": [{"index": i, "delta": {"role": "assistant"},
                                                                    "finish_reason": None}]})  # fmt: skip
            while open_jobs:
                index, event, value = await queue.get()
                if event == "error":
                    raise value
                if event == "token":
                    generated += 1
                    delta = "" if value == eos else streams[index].push(value)
                    if delta:
                        yield chunk(index, delta, None)
                else:
                    rest = streams[index].finish()
                    if rest:
                        yield chunk(index, rest, None)
                    yield chunk(index, None, value["finish_reason"])
                    open_jobs -= 1
        finally:
            for task in tasks:
                task.cancel()
            for job in jobs:
                job.cancelled.set()
            self.state.metrics.observe_tokens(prompt_tokens, generated)

    # ---- translation ---------------------------------------------------------------------
    async def translate(self, request: HttpRequest) -> Response:
        body = await read_body(request, self.state.limits.max_body_bytes)
        body = fields(body, dict(text="texts", num_beams="int", max_new_tokens="int", stream="bool"), ("text",))
        self._need("transformer", "t5", use="/v1/translate needs an encoder-decoder model; use /v1/completions")
        limits = self.state.limits
        texts = [body["text"]] if isinstance(body["text"], str) else body["text"]
        if not texts:
            raise ApiError(422, "text is an empty list; send at least one text")
        if len(texts) > limits.max_batch:
            raise ApiError(413, f"{len(texts)} texts are over this server's limit of {limits.max_batch} per request")
        if any(not t.strip() for t in texts):
            raise ApiError(400, "a text is empty; send some text to translate")
        beams, new = body.get("num_beams"), body.get("max_new_tokens")
        if beams is not None:
            in_range("num_beams", beams, 1, limits.max_beams, limit=True)
        if new is not None:
            in_range("max_new_tokens", new, 1, limits.max_new_tokens, limit=True)
        else:
            new = min(limits.max_new_tokens, self.context)
        stream = body.get("stream", False)
        defaults = getattr(self.state.model, "generation_defaults", None) or {}
        if stream and (beams or defaults.get("num_beams", 1)) > 1:
            raise ApiError(422, "stream needs num_beams 1: beam search knows its best translation only at the end")
        cfg = self.state.model.config
        sources = source_ids(self.tokenizer, cfg.eos_token_id, texts)
        for ids in sources:
            self._check_length(ids, "a text", 0)
        options = dict(sources=sources, num_beams=1 if stream else beams, max_new_tokens=new, stream=stream)
        job = Job("translate", asyncio.get_running_loop(), options)
        self._submit(job)
        prompt_tokens = sum(map(len, sources))
        if stream:
            return stream_response(self._stream_translation(job, len(texts), prompt_tokens))
        (result,) = await outcomes([job], request)
        translations, generated = [], 0
        for tokens in result["tokens"]:
            new_tokens = self._until_eos(tokens)
            generated += len(new_tokens)
            translations.append(self.tokenizer.decode(new_tokens, skip_special_tokens=True))
        self.state.metrics.observe_tokens(prompt_tokens, generated)
        return JSONResponse({"translations": translations})

    def _until_eos(self, tokens: list[int]) -> list[int]:
        eos = self.state.model.config.eos_token_id
        return tokens[: tokens.index(eos)] if eos in tokens else tokens

    async def _stream_translation(self, job: Job, count: int, prompt_tokens: int) -> AsyncIterator[bytes]:
        streams = [TextStream(self.tokenizer) for _ in range(count)]
        ended = [False] * count
        eos, generated = self.state.model.config.eos_token_id, 0
        async for event, value in events(job):
            if event == "token":
                row, token = value
                if ended[row] or token == eos:
                    ended[row] = True
                    continue
                generated += 1
                delta = streams[row].push(token)
                if delta:
                    yield sse({"index": row, "delta": delta})
            else:
                translations = [
                    self.tokenizer.decode(self._until_eos(tokens), skip_special_tokens=True)
                    for tokens in value["tokens"]
                ]
                self.state.metrics.observe_tokens(prompt_tokens, generated)
                yield sse({"translations": translations})

    # ---- attention -----------------------------------------------------------------------
    async def attention(self, request: HttpRequest) -> Response:
        body = await read_body(request, self.state.limits.max_body_bytes)
        body = fields(body, dict(text="str", target="str"), ("text",))
        if self.tokenizer is None:
            raise ApiError(400, "this server's model has no tokenizer, so text cannot be read; serve one that has")
        if not body["text"].strip():
            raise ApiError(400, "text is empty; send some text")
        model, cfg = self.state.model, self.state.model.config
        if cfg.is_encoder_decoder:
            source = source_ids(self.tokenizer, cfg.eos_token_id, [body["text"]])[0]
            self._check_length(source, "the text", 0)
            target = None
            if body.get("target") is not None:
                target = [
                    cfg.decoder_start_token_id,
                    *self.tokenizer.encode(body["target"], add_special_tokens=False).ids,
                ]
                self._check_length(target, "the target", 0)
        else:
            text = body["text"] + (body.get("target") or "")
            source = (
                prompt_ids(self.tokenizer, cfg, [text])[0] if cfg.family == "gpt" else self.tokenizer.encode(text).ids
            )
            self._check_length(source, "the text", 0)
            target = None
        for what, ids in (("the text", source), ("the target", target or [])):
            if len(ids) > MAX_ATTENTION_TOKENS:
                raise ApiError(
                    413, f"{what} is {len(ids)} tokens; attention maps are drawn for at most {MAX_ATTENTION_TOKENS}"
                )
        limit = min(self.state.limits.max_new_tokens, MAX_ATTENTION_TOKENS)
        job = Job("call", asyncio.get_running_loop(), work=lambda: attention_of(model, source, target, limit))
        self._submit(job)
        (result,) = await outcomes([job], request)
        token = self._token_text
        tokens = {key: [token(i) for i in ids] for key, ids in result.pop("ids").items()}
        text = await asyncio.to_thread(json.dumps, {"tokens": tokens, **result})  # megabytes: not on the loop
        return Response(text, media_type="application/json")

    def _token_text(self, i: int) -> str:
        text = self.tokenizer.decode([i], skip_special_tokens=False)
        return text if text else (self.tokenizer.id_to_token(i) or str(i))


def attention_of(model: Model, source: list[int], target: list[int] | None, max_new_tokens: int) -> dict[str, Any]:
    """One forward pass recording every layer's attention weights, as nested lists indexed by
    layer, head, query and key, rounded to 4 decimals; an encoder–decoder model without a target
    translates greedily first."""
    cfg = model.config
    ids = torch.tensor([source])
    if cfg.is_encoder_decoder:
        if target is None:
            out = model.generate(ids, num_beams=1, max_new_tokens=max_new_tokens)[0].tolist()
            eos = cfg.eos_token_id
            target = out[: out.index(eos, 1)] if eos in out[1:] else out
        output = model(ids, decoder_input_ids=torch.tensor([target]), output_attentions=True)
        maps = {
            "encoder_self": output.attentions["encoder"]["self"],
            "decoder_self": output.attentions["decoder"]["self"],
            "cross": output.attentions["decoder"]["cross"],
        }
        token_ids = {"source": source, "target": target}
    else:
        output = model(ids, output_attentions=True)
        key = "decoder" if "decoder" in output.attentions else "encoder"
        maps = {f"{key}_self": output.attentions[key]["self"]}
        token_ids = {"target" if key == "decoder" else "source": source}
    weights = {
        name: [layer[0].float().mul(1e4).round().div(1e4).tolist() for layer in layers] for name, layers in maps.items()
    }
    return {"ids": token_ids, "layers": cfg.n_layers, "heads": cfg.n_heads, "attention": weights}


def create_app(
    model: Model, name: str, limits: Limits | None = None, api_key: str | None = None, own_thread: bool = True
) -> Starlette:
    """The app serving ``model`` (in eval mode, with its tokenizer) under ``name``. The model
    loop (:class:`~attnkit.serve.engine.Engine`) starts on a thread of its own with the app
    and stops with it; ``own_thread=False``: the caller runs ``app.state.attnkit.engine.run()``
    on a thread of its choosing (the app only stops it)."""
    limits = Limits() if limits is None else limits
    metrics = Metrics()
    engine = Engine(model.eval(), metrics, max_batch=limits.max_batch, max_queue=limits.max_queue)
    state = State(model, name, engine, metrics, limits, api_key)
    api = Api(state)

    def handled(endpoint: Callable[[HttpRequest], Awaitable[Response]]) -> Callable[[HttpRequest], Awaitable[Response]]:
        async def run(request: HttpRequest) -> Response:
            try:
                return await endpoint(request)
            except ApiError as err:
                return error_response(err)
            except Exception:
                log.exception("internal error on %s", request.url.path)
                return error_response(ApiError(500, "internal server error; see the server's log", "server_error"))

        return run

    routes = [
        Route("/", handled(api.page), methods=["GET"]),
        Route("/health", handled(api.health), methods=["GET"]),
        Route("/metrics", handled(api.metrics), methods=["GET"]),
        Route("/v1/completions", handled(api.completions), methods=["POST"]),
        Route("/v1/chat/completions", handled(api.chat_completions), methods=["POST"]),
        Route("/v1/translate", handled(api.translate), methods=["POST"]),
        Route("/v1/attention", handled(api.attention), methods=["POST"]),
    ]

    async def not_found(request: HttpRequest, exc: Exception) -> Response:
        return error_response(
            ApiError(404, f"no endpoint {request.url.path}; see GET / for the page", "not_found_error")
        )

    async def not_allowed(request: HttpRequest, exc: Exception) -> Response:
        return error_response(ApiError(405, f"{request.method} is not allowed on {request.url.path}"))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if own_thread:
            engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed}, lifespan=lifespan)
    app.state.attnkit = state
    app.add_middleware(Guard, state=state)
    return app
