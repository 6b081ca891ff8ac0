"""What the server says about itself: the page at ``/`` (type a sentence, watch the output
stream in and its attention), ``/health`` and the Prometheus ``/metrics``."""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request as HttpRequest
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from attnkit.generation.compiled import COMPILES
from attnkit.serve.handling import Api, handled


class Pages(Api):
    def routes(self) -> list[Route]:
        return [
            Route("/", handled(self.page), methods=["GET"]),
            Route("/health", handled(self.health), methods=["GET"]),
            Route("/metrics", handled(self.metrics), methods=["GET"]),
        ]

    async def health(self, request: HttpRequest) -> Response:
        status = "draining" if self.state.draining else "ok"
        limits = {"max_new_tokens": self.max_new, "max_input_tokens": self.max_input,
                  "max_beams": self.state.limits.max_beams}  # fmt: skip
        body = {"status": status, "model": self.state.name, "family": self.state.family, "limits": limits}
        return JSONResponse(body, status_code=503 if self.state.draining else 200)

    async def metrics(self, request: HttpRequest) -> Response:
        engine = self.state.engine
        text = self.state.metrics.render(
            {
                "attnkit_queue_length": ("Requests waiting for the model.", engine.pending),
                "attnkit_running_rows": ("Rows in the running batch.", lambda: len(engine.running)),
                "attnkit_in_flight_requests": ("Requests being answered.", lambda: self.state.in_flight),
                "attnkit_compiled_steps": ("Decoding steps compiled (one per batch layout).", lambda: len(COMPILES)),
                "attnkit_compile_seconds": (
                    "Seconds spent compiling decoding steps.",
                    lambda: sum(c.seconds for c in COMPILES),
                ),
            }
        )
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def page(self, request: HttpRequest) -> Response:
        return HTMLResponse(resources.files("attnkit.serve").joinpath("page.html").read_text(encoding="utf-8"))
