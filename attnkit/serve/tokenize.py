"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's shape: a prompt (or a conversation,
through the chat template) to the token ids the completion endpoints would read, and ids back
to text."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from attnkit.generation.text import prompt_ids
from attnkit.serve.chat import conversation_ids
from attnkit.serve.handling import Api, handled
from attnkit.serve.schema import ApiError, fields


class Tokenize(Api):
    def routes(self) -> list[Route]:
        return [
            Route("/tokenize", handled(self.tokenize), methods=["POST"]),
            Route("/detokenize", handled(self.detokenize), methods=["POST"]),
        ]

    async def tokenize(self, request: HttpRequest) -> Response:
        spec = dict(prompt="str", messages="messages", add_special_tokens="bool", add_generation_prompt="bool",
                    return_token_strs="bool", model="str")  # fmt: skip
        body = fields(await self.body(request), spec, endpoint="/tokenize")
        self.model_field(body)
        self.need_tokenizer()
        if ("prompt" in body) == ("messages" in body):
            raise ApiError(422, "send either prompt (a text) or messages (a conversation)", param="prompt")
        if "messages" in body:
            ids = self._conversation(body)
        elif not body.get("add_special_tokens", True):
            ids = self.tokenizer.encode(body["prompt"], add_special_tokens=False).ids
        elif self.state.family == "gpt":  # the ids /v1/completions reads
            try:
                ids = prompt_ids(self.tokenizer, self.state.model.config, [body["prompt"]])[0]
            except ValueError as err:  # an empty prompt and no start token
                raise ApiError(422, str(err), param="prompt") from None
        else:
            ids = self.tokenizer.encode(body["prompt"]).ids
        strings = [self.tokenizer.id_to_token(i) for i in ids] if body.get("return_token_strs") else None
        return JSONResponse({"count": len(ids), "max_model_len": self.context, "tokens": ids, "token_strs": strings})

    def _conversation(self, body: dict[str, Any]) -> list[int]:
        template = getattr(self.state.model, "chat_template", None)
        if not template:
            raise ApiError(400, "this server's model has no chat template; send a prompt", param="messages")
        return conversation_ids(self, template, body["messages"], body.get("add_generation_prompt", True))

    async def detokenize(self, request: HttpRequest) -> Response:
        body = fields(await self.body(request), dict(tokens="ids", model="str"), ("tokens",), endpoint="/detokenize")
        self.model_field(body)
        self.need_tokenizer()
        self.check_ids(body["tokens"], "tokens", "tokens")
        return JSONResponse({"prompt": self.tokenizer.decode(body["tokens"], skip_special_tokens=False)})
