"""The ASGI app of ``attnkit serve`` (Starlette), assembled from one module per API over the
shared request handling (:mod:`attnkit.serve.handling`):

- OpenAI's: :mod:`~attnkit.serve.models`, :mod:`~attnkit.serve.completions`,
  :mod:`~attnkit.serve.chat` (decoder models), :mod:`~attnkit.serve.embeddings` (encoders);
- vLLM's :mod:`~attnkit.serve.tokenize`;
- attnkit's own: :mod:`~attnkit.serve.translate` (encoder–decoder models),
  :mod:`~attnkit.serve.attention`, and :mod:`~attnkit.serve.pages` (the page, health, metrics).

Every answer other than 200 is ``{"error": {"message", "type", "param", "code"}}``; a model
error is a 500 with a one-line message, never a traceback, and the server goes on. The model
runs on the :class:`~attnkit.serve.engine.Engine` thread; handlers only check, tokenize and wait.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Literal

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from attnkit.models.core import Model
from attnkit.serve.attention import Attention
from attnkit.serve.chat import Chat
from attnkit.serve.completions import Completions
from attnkit.serve.embeddings import Embeddings
from attnkit.serve.engine import Engine
from attnkit.serve.guard import Guard
from attnkit.serve.handling import State, error_response
from attnkit.serve.metrics import Metrics
from attnkit.serve.models import Models
from attnkit.serve.pages import Pages
from attnkit.serve.schema import ApiError, Limits
from attnkit.serve.tokenize import Tokenize
from attnkit.serve.translate import Translate

APIS = (Pages, Models, Completions, Chat, Embeddings, Tokenize, Translate, Attention)


def create_app(
    model: Model,
    name: str,
    limits: Limits | None = None,
    api_key: str | None = None,
    own_thread: bool = True,
    allowed_origins: Sequence[str] = (),
    compile: bool | Literal["auto"] = False,
) -> Starlette:
    """The app serving ``model`` (in eval mode, with its tokenizer) under ``name``. The model
    loop (:class:`~attnkit.serve.engine.Engine`) starts on a thread of its own with the app
    and stops with it; ``own_thread=False``: the caller runs ``app.state.attnkit.engine.run()``
    on a thread of its choosing (the app only stops it). ``allowed_origins``: the web origins
    whose pages may call the API (CORS; none by default, ``"*"`` for any). ``compile``: completions
    decode through a compiled step, ``"auto"`` once it is ready (:class:`~attnkit.serve.engine.Engine`)."""
    limits = Limits() if limits is None else limits
    metrics = Metrics()
    engine = Engine(model.eval(), metrics, limits.max_batch, limits.max_queue, compile)
    state = State(model, name, engine, metrics, limits, api_key, created=int(time.time()))
    routes = [route for api in APIS for route in api(state).routes()]

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
    if allowed_origins:  # outermost: refusals (401, 413) carry the CORS headers too
        app.add_middleware(
            CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )  # fmt: skip
    return app
