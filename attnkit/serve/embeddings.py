"""``POST /v1/embeddings``, OpenAI's embeddings API for encoder (BERT-family) models: the
sentence embeddings of ``model.encode`` (the real tokens' mean, unit length) for a text, texts,
token ids or lists of them, as floats or as base64 little-endian float32 (the openai SDK's
default)."""

from __future__ import annotations

import asyncio
import base64

import torch
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from attnkit.serve.engine import Job
from attnkit.serve.handling import Api, handled, outcomes
from attnkit.serve.schema import ApiError, fields

# OpenAI's bound on the inputs of one request.
MAX_INPUTS = 2048
FORMATS = ("float", "base64")


class Embeddings(Api):
    endpoint = "/v1/embeddings"

    def routes(self) -> list[Route]:
        return [Route(self.endpoint, handled(self.embed), methods=["POST"])]

    async def embed(self, request: HttpRequest) -> Response:
        spec = dict(input="inputs", model="str", encoding_format="str", dimensions="int", user="str")
        body = fields(await self.body(request), spec, ("input",), endpoint=self.endpoint)
        self.model_field(body)
        self.need(
            "bert", use=f"{self.endpoint} needs an encoder (BERT-family) model such as all-MiniLM-L6-v2; "
            "serve one of those for embeddings",
        )  # fmt: skip
        form = body.get("encoding_format", "float")
        if form not in FORMATS:
            message = f"encoding_format must be one of {', '.join(FORMATS)}, got {form!r}"
            raise ApiError(422, message, param="encoding_format")
        width = self.state.model.config.d_model
        if body.get("dimensions", width) != width:
            raise ApiError(
                422, f"dimensions must be this model's width {width} (its embeddings are not truncatable), "
                f"got {body['dimensions']}", param="dimensions",
            )  # fmt: skip
        model = self.state.model
        ids = self.token_rows(body["input"], "input", MAX_INPUTS, model.text_ids)
        job = Job("call", asyncio.get_running_loop(), work=lambda: model.embed_ids(ids))
        self.submit(job)
        (vectors,) = await outcomes([job], request)
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(vector, form)} for i, vector in enumerate(vectors)
        ]
        tokens = sum(map(len, ids))
        self.state.metrics.observe_tokens(tokens, 0)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": self.state.name, "usage": usage})


def _encoded(vector: torch.Tensor, form: str) -> list[float] | str:
    if form == "base64":
        return base64.b64encode(vector.float().numpy().astype("<f4").tobytes()).decode()
    return vector.tolist()
