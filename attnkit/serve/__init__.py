"""``attnkit serve``: the model behind an HTTP API (OpenAI-shaped completions with server-sent
events, translation, attention weights, metrics) and a page that shows attention live.
Needs the ``serve`` extra (Starlette and uvicorn)."""

from attnkit.serve.app import create_app
from attnkit.serve.schema import Limits

__all__ = ["Limits", "create_app"]
