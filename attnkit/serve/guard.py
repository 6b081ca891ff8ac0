"""The ASGI middleware around every request of ``attnkit serve``: a draining server refuses new
requests (503), the API key is checked (401), a body declared over the limit is refused (413,
read and dropped first so that the client reads the answer), what is in flight is counted (the
shutdown waits for it), and each answer's status and latency are recorded."""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any

from attnkit.serve.handling import State, error_response, linger
from attnkit.serve.schema import ApiError

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

# Paths counted under their own name in the metrics; any other is "other".
KNOWN_PATHS = (
    "/", "/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings",
    "/tokenize", "/detokenize", "/v1/translate", "/v1/attention",
)  # fmt: skip


class Guard:
    """The middleware over ``app``, sharing ``state`` with the handlers."""

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
            error, headers = refusal
            if error.status == 413:
                await linger(receive)
            await error_response(error, headers)(scope, receive, record)
            self._observe(path, status, started)
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, record)
        finally:
            self.state.in_flight -= 1
            self._observe(path, status, started)

    def _observe(self, path: str, status: int, started: float) -> None:
        endpoint = path if path in KNOWN_PATHS else "/v1/models" if path.startswith("/v1/models/") else "other"
        self.state.metrics.observe_request(endpoint, status, time.perf_counter() - started)

    def _refusal(self, scope: Scope) -> tuple[ApiError, dict[str, str] | None] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.state.draining and scope["path"] != "/health":
            return ApiError(503, "the server is shutting down; retry on another instance", "unavailable"), None
        if self.state.api_key is not None and scope["path"] not in self.OPEN:
            given = headers.get("authorization", "")
            expected = f"Bearer {self.state.api_key}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                what = "missing" if not given else "wrong"
                message = f"the API key is {what}; send Authorization: Bearer <key>"
                return ApiError(401, message, "authentication_error"), None
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.state.limits.max_body_bytes:
            limit = self.state.limits.max_body_bytes
            message = f"the body is {length} bytes, over this server's limit of {limit}; send a smaller one"
            return ApiError(413, message), {"Connection": "close"}
        return None
