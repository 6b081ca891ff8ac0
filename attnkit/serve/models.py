"""``GET /v1/models`` and ``GET /v1/models/{id}``, OpenAI's models API: the one model this
server serves, as clients (Open WebUI, the openai SDK) discover it."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from attnkit.serve.handling import Api, handled


class Models(Api):
    def routes(self) -> list[Route]:
        return [
            Route("/v1/models", handled(self.list), methods=["GET"]),
            Route("/v1/models/{model:path}", handled(self.one), methods=["GET"]),
        ]

    def card(self) -> dict[str, Any]:
        return {"id": self.state.name, "object": "model", "created": self.state.created, "owned_by": "attnkit",
                "family": self.state.family, "max_model_len": self.context}  # fmt: skip

    async def list(self, request: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [self.card()]})

    async def one(self, request: HttpRequest) -> Response:
        self.model_field({"model": request.path_params["model"]})
        return JSONResponse(self.card())
