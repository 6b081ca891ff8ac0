"""``POST /v1/translate`` for encoder–decoder models (the Transformer, T5): texts in, their
translations out, decoded greedily or with beams by ``model.generate``, or streamed token by
token (greedy); translations waiting together are decoded as one batch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from attnkit.generation.options import DecodingOptions
from attnkit.generation.text import TextStream, source_ids, until_eos
from attnkit.serve.engine import Job
from attnkit.serve.handling import Api, events, handled, outcomes, sse, stream_response
from attnkit.serve.schema import ApiError, fields, in_range


class Translate(Api):
    def routes(self) -> list[Route]:
        return [Route("/v1/translate", handled(self.translate), methods=["POST"])]

    async def translate(self, request: HttpRequest) -> Response:
        body = await self.body(request)
        body = fields(body, dict(text="texts", num_beams="int", max_new_tokens="int", stream="bool"), ("text",))
        self.need("transformer", "t5", use="/v1/translate needs an encoder-decoder model; use /v1/completions")
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
            in_range("max_new_tokens", new, 1, self.max_new, limit=True)
        else:
            new = min(self.max_new, self.context)
        stream = body.get("stream", False)
        given = {} if beams is None else {"num_beams": beams}
        decoding = DecodingOptions.over(self.state.model.generation_defaults, max_new_tokens=new, **given)
        if stream and decoding.num_beams > 1:
            raise ApiError(422, "stream needs num_beams 1: beam search knows its best translation only at the end")
        cfg = self.state.model.config
        sources = source_ids(self.tokenizer, cfg.eos_token_id, texts)
        for ids in sources:
            self.check_length(ids, "a text", 0)
        options = dict(sources=sources, decoding=decoding, stream=stream)
        job = Job("translate", asyncio.get_running_loop(), options)
        self.submit(job)
        prompt_tokens = sum(map(len, sources))
        ends = decoding.end_tokens(cfg.eos_token_id)  # the checkpoint's generation_config.json may list several
        if stream:
            return stream_response(self._stream_translation(job, len(texts), prompt_tokens, ends))
        (result,) = await outcomes([job], request)
        translations, generated = [], 0
        for tokens in result["tokens"]:
            new_tokens = until_eos(tokens, ends)
            generated += len(new_tokens)
            translations.append(self.tokenizer.decode(new_tokens, skip_special_tokens=True))
        self.state.metrics.observe_tokens(prompt_tokens, generated)
        return JSONResponse({"translations": translations})

    async def _stream_translation(
        self, job: Job, count: int, prompt_tokens: int, ends: tuple[int, ...]
    ) -> AsyncIterator[bytes]:
        streams = [TextStream(self.tokenizer) for _ in range(count)]
        ended = [False] * count
        generated = 0
        async for event, value in events(job):
            if event == "token":
                row, token = value
                if ended[row] or token in ends:
                    ended[row] = True
                    continue
                generated += 1
                delta = streams[row].push(token)
                if delta:
                    yield sse({"index": row, "delta": delta})
            else:
                translations = [
                    self.tokenizer.decode(until_eos(tokens, ends), skip_special_tokens=True)
                    for tokens in value["tokens"]
                ]
                self.state.metrics.observe_tokens(prompt_tokens, generated)
                yield sse({"translations": translations})
