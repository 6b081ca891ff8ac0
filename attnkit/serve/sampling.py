"""What OpenAI's two completion APIs (``/v1/completions``, ``/v1/chat/completions``) share: their
sampling fields checked and turned into model-thread jobs (``n`` choices per prompt, which
share one prefill), a ``response_format`` kept to (:mod:`attnkit.serve.structured`), the
choices run to their end (an end token, ``max_tokens``, a stop
sequence: held back while it may still begin one, never shown), answered whole or streamed,
with the scores of their tokens and the usage."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from attnkit.generation.continuous import Scored
from attnkit.generation.grammar import Compiled, Follow
from attnkit.generation.penalties import penalties
from attnkit.generation.text import TextStream
from attnkit.serve.engine import Job
from attnkit.serve.handling import Api, events, handled, sse, stream_response, watched
from attnkit.serve.schema import ApiError, fields, in_range
from attnkit.serve.stops import StopText
from attnkit.serve.structured import response_grammar

# Sampling below this temperature is greedy in all but overflow: refused, 0 asks for greedy.
MIN_TEMPERATURE = 0.01
# OpenAI's limits: stop sequences per request, and the bound of a penalty and of a bias.
MAX_STOPS, MAX_PENALTY, MAX_BIAS = 4, 2.0, 100.0

# The fields both completion APIs take besides their prompt or messages (OpenAI's names).
# Fields named here but not implemented are refused when they would change the answer.
SAMPLING = dict(
    max_tokens="int", temperature="number", top_p="number", n="int", seed="int", stop="texts", stream="bool",
    stream_options="object", frequency_penalty="number", presence_penalty="number", logit_bias="object",
    model="str", user="str", tools="any", tool_choice="any", functions="any", response_format="any",
)  # fmt: skip


@dataclass
class Sampling:
    """A request's checked sampling fields. ``max_tokens`` None: up to the context;
    ``top_logprobs`` None: no scores."""

    max_tokens: int | None
    temperature: float
    top_p: float
    n: int
    seed: int | None
    stops: list[str]
    frequency_penalty: float
    presence_penalty: float
    logit_bias: dict[int, float]
    stream: bool
    include_usage: bool
    top_logprobs: int | None = None
    echo: bool = False  # completions: the prompt comes first in the answer, with its scores
    grammar: Compiled | None = None  # response_format's or the tools': every choice's tokens kept inside it
    tool_calls: bool = False  # chat with tools: an answer that is calls is sent as tool_calls


@dataclass(eq=False)
class Choice:
    """One choice being generated: its job, its text so far and the tokens with their text
    offset and score."""

    index: int
    job: Job
    text: TextStream
    stop: StopText
    shown: str = ""
    tokens: list[tuple[int, int, Scored | None]] = field(default_factory=list)  # (id, offset, score)
    finish_reason: str | None = None
    prompt_scores: list[Scored | None] | None = None
    prompt_text: tuple[str, list[int]] | None = None  # the prompt's text and its tokens' offsets, once made
    grammar: Follow | None = None  # its grammar's state: an answer closed early for max_tokens ends for "length"


@dataclass
class Delta:
    """What a choice adds at one event: text, tokens (id, offset, score), and its finish reason
    once it has ended."""

    choice: Choice
    text: str
    tokens: list[tuple[int, int, Scored | None]]
    finish_reason: str | None = None


class CompletionApi(Api):
    """The part of both completion APIs between their prompts and their answers' shapes."""

    kind = ""  # "text_completion" or "chat.completion"
    endpoint = ""  # the path, in logs and errors

    def routes(self) -> list[Route]:
        return [Route(self.endpoint, handled(self.respond), methods=["POST"])]

    async def respond(self, request: HttpRequest) -> Response:
        """The endpoint: the request read into prompts and :class:`Sampling`, then :meth:`answer`."""
        raise NotImplementedError

    def read(self, body: dict[str, Any], spec: dict[str, str], required: str) -> dict[str, Any]:
        """The known fields of ``body`` (the others logged once and ignored), checked."""
        body = fields(body, {**spec, **SAMPLING}, (required,), endpoint=self.endpoint)
        self.model_field(body)
        self.need("gpt", use=f"{self.endpoint} needs a GPT-family model; use /v1/translate or /v1/embeddings")
        return body

    def sampling(self, body: dict[str, Any], max_tokens: int | None, prompts: int) -> Sampling:
        """The sampling fields of ``body`` (``max_tokens``: the request's, or its default),
        for ``prompts`` prompts."""
        limits = self.state.limits
        if max_tokens is not None:
            in_range("max_tokens", max_tokens, 0, self.max_new, limit=True)
        temperature = body.get("temperature", 1.0)
        in_range("temperature", temperature, 0.0, 2.0)
        if 0 < temperature < MIN_TEMPERATURE:  # logits / 1e-40 overflow to inf
            raise ApiError(
                422, f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {temperature}",
                param="temperature",
            )  # fmt: skip
        top_p = body.get("top_p", 1.0)
        if not 0 < top_p <= 1:
            raise ApiError(422, f"top_p must be in (0, 1], got {top_p}", param="top_p")
        if "seed" in body:
            in_range("seed", body["seed"], 0, 2**63 - 1)
        n = body.get("n", 1)
        in_range("n", n, 1, limits.max_batch, limit=True)
        if n * prompts > limits.max_batch:
            raise ApiError(
                413, f"{prompts} prompts x n={n} are {n * prompts} choices, over this server's limit of "
                f"{limits.max_batch} per request", param="n",
            )  # fmt: skip
        stops = body.get("stop", [])
        stops = [stops] if isinstance(stops, str) else stops
        if len(stops) > MAX_STOPS:
            raise ApiError(422, f"stop holds {len(stops)} sequences; give at most {MAX_STOPS}", param="stop")
        for name in ("frequency_penalty", "presence_penalty"):
            in_range(name, body.get(name, 0.0), -MAX_PENALTY, MAX_PENALTY)
        stream_options = body.get("stream_options") or {}
        if stream_options and not body.get("stream", False):
            raise ApiError(422, "stream_options is only for stream: true", param="stream_options")
        include_usage = stream_options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise ApiError(422, f"stream_options.include_usage must be true or false, got {include_usage}",
                           param="stream_options")  # fmt: skip
        config = self.state.model.config
        grammar = response_grammar(body.get("response_format"), self.tokenizer, config, limits.bound_schemas)
        return Sampling(
            max_tokens, float(temperature), float(top_p), n, body.get("seed"), stops,
            float(body.get("frequency_penalty", 0.0)), float(body.get("presence_penalty", 0.0)),
            self._logit_bias(body.get("logit_bias") or {}), body.get("stream", False), include_usage, grammar=grammar,
        )  # fmt: skip

    def _logit_bias(self, bias: dict[str, Any]) -> dict[int, float]:
        vocab, out = self.state.model.config.vocab_size, {}
        for key, value in bias.items():
            if not (key.isascii() and key.isdigit() and int(key) < vocab):
                raise ApiError(422, f"logit_bias key {key!r} is not a token id in 0..{vocab - 1}", param="logit_bias")
            if not isinstance(value, int | float) or isinstance(value, bool) or not -MAX_BIAS <= value <= MAX_BIAS:
                raise ApiError(
                    422, f"logit_bias[{key!r}] must be a number in -100..100, got {value}", param="logit_bias"
                )
            out[int(key)] = float(value)
        return out

    def choices(self, prompts: list[list[int]], s: Sampling, prompt_logprobs: int | None = None) -> list[Choice]:
        """``s.n`` choices for each prompt (index ``p * n + j``, as OpenAI numbers them), each
        a job for the model thread, submitted all together or not at all."""
        eos = self.state.model.config.eos_token_id
        adjust = penalties(s.frequency_penalty, s.presence_penalty, s.logit_bias)
        loop, seed = asyncio.get_running_loop(), s.seed if s.seed is not None else secrets.randbits(62)
        out = []
        for p, ids in enumerate(prompts):  # every prompt checked before any job is submitted
            what = "the prompt" if self.kind == "text_completion" else "the conversation"
            self.check_length(ids, what, s.max_tokens if s.max_tokens is not None else 1)
            new = s.max_tokens if s.max_tokens is not None else max(0, min(self.max_new, self.context - len(ids)))
            for j in range(s.n):
                grammar = None if s.grammar is None else Follow(s.grammar, adjust, new)  # a state per choice
                options = dict(
                    ids=ids, max_new_tokens=new, temperature=s.temperature, top_p=s.top_p, seed=seed + j,
                    eos=[] if eos is None else [eos], top_logprobs=s.top_logprobs,
                    adjust=adjust if grammar is None else grammar, prompt_logprobs=prompt_logprobs,
                )  # fmt: skip
                job = Job("complete", loop, options)
                out.append(Choice(p * s.n + j, job, TextStream(self.tokenizer), StopText(s.stops), grammar=grammar))
        self.submit(*(c.job for c in out))
        return out

    async def deltas(self, choices: list[Choice]) -> AsyncIterator[Delta]:
        """What each choice adds, event by event, until every choice has ended."""
        queue: asyncio.Queue[tuple[Choice, str, Any]] = asyncio.Queue()
        eos = self.state.model.config.eos_token_id

        async def pump(choice: Choice) -> None:
            try:
                async for event, value in events(choice.job):
                    await queue.put((choice, event, value))
            except ApiError as err:
                await queue.put((choice, "error", err))

        tasks = {c.index: asyncio.create_task(pump(c)) for c in choices}
        open_choices = len(choices)
        try:
            while open_choices:
                choice, event, value = await queue.get()
                if event == "prompt":  # before any token
                    choice.prompt_scores = value
                    continue
                if choice.finish_reason is not None:  # stopped at a stop sequence: its job is cancelled
                    continue
                if event == "error":
                    raise value
                if event == "token":
                    token, scored = value
                    offset = len(choice.text.text)  # in all the text so far, held back or not
                    piece = "" if token == eos else choice.stop.push(choice.text.push(token))
                    choice.shown += piece
                    choice.tokens.append((token, offset, scored))
                    if choice.stop.stopped:
                        choice.finish_reason = "stop"
                        choice.job.cancelled.set()
                        tasks[choice.index].cancel()
                        open_choices -= 1
                    yield Delta(choice, piece, choice.tokens[-1:], choice.finish_reason)
                else:
                    rest = choice.stop.push(choice.text.finish())
                    rest += choice.stop.finish()
                    choice.shown += rest
                    choice.finish_reason = "stop" if choice.stop.stopped else value["finish_reason"]
                    if choice.grammar is not None and choice.grammar.shortened:  # closed for max_tokens
                        choice.finish_reason = "length"
                    open_choices -= 1
                    yield Delta(choice, rest, [], choice.finish_reason)
        finally:
            for task in tasks.values():
                task.cancel()
            for choice in choices:
                choice.job.cancelled.set()

    def usage(self, prompts: list[list[int]], choices: list[Choice]) -> dict[str, int]:
        prompt_tokens, generated = sum(map(len, prompts)), sum(len(c.tokens) for c in choices)
        self.state.metrics.observe_tokens(prompt_tokens, generated)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": generated,
            "total_tokens": prompt_tokens + generated,
        }

    async def answer(
        self, request: HttpRequest, prompts: list[list[int]], choices: list[Choice], s: Sampling
    ) -> Response:
        """The answer: whole (once every choice has ended, unless the client leaves first) or
        streamed as server-sent events."""
        head = {"id": f"{'chatcmpl' if self.kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex[:24]}",
                "created": int(time.time()), "model": self.state.name}  # fmt: skip
        if s.stream:
            return stream_response(self._stream(head, prompts, choices, s))

        async def run() -> None:
            async for _ in self.deltas(choices):
                pass

        await watched(request, run(), [c.job for c in choices])
        body = [self.choice_body(Delta(c, c.shown, c.tokens, c.finish_reason), s, final=True) for c in choices]
        return JSONResponse({**head, "object": self.kind, "choices": body, "usage": self.usage(prompts, choices)})

    async def _stream(
        self, head: dict[str, Any], prompts: list[list[int]], choices: list[Choice], s: Sampling
    ) -> AsyncIterator[bytes]:
        kind = f"{self.kind}.chunk" if self.kind == "chat.completion" else self.kind
        extra = {"usage": None} if s.include_usage else {}
        try:
            for choice in choices:
                opening = self.opening(choice, s)
                if opening is not None:
                    yield sse({**head, "object": kind, "choices": [opening], **extra})
            async for delta in self.deltas(choices):
                scored = s.top_logprobs is not None and delta.tokens
                if delta.text or scored or delta.finish_reason:
                    body = self.choice_body(delta, s, final=False)
                    yield sse({**head, "object": kind, "choices": [body], **extra})
            usage = self.usage(prompts, choices)
            if s.include_usage:
                yield sse({**head, "object": kind, "choices": [], "usage": usage})
        finally:  # the client may leave at any chunk, the first ones included
            for choice in choices:
                choice.job.cancelled.set()

    def opening(self, choice: Choice, s: Sampling) -> dict[str, Any] | None:
        """A first streamed chunk of ``choice`` before any token (chat: the assistant's role)."""
        return None

    def choice_body(self, delta: Delta, s: Sampling, final: bool) -> dict[str, Any]:
        """A choice of the answer (``final``: ``delta`` holds all of it) or of a streamed chunk,
        in the API's shape."""
        raise NotImplementedError

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)
