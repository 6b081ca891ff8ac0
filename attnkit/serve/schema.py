"""Request bodies checked field by field: a wrong type or a value out of range is an
:class:`ApiError` naming the field, the value and the fix, answered as OpenAI answers
``{"error": {"message", "type", "param", "code"}}``. A field an endpoint does not know is
refused where the API is attnkit's own and ignored (logged once) where it is OpenAI's, whose
clients send fields of their own."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("attnkit.serve")


class ApiError(Exception):
    """An answer other than 200: its status, message, OpenAI-style error type and the request
    field it is about (``param``)."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; over a limit is 413 (429 for a full queue). None: the
    model's context."""

    max_body_bytes: int = 1 << 20
    max_input_tokens: int | None = None
    max_new_tokens: int | None = None
    max_beams: int = 8
    max_batch: int = 32  # rows decoded together, and texts in one request
    max_queue: int = 256  # requests waiting for the model
    bound_schemas: bool = False  # structured outputs and tool arguments: a schema's open ends closed (bounded)


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise ApiError(400, f"the body is not valid JSON ({err or 'nested too deeply'}); send a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body is a JSON {type(body).__name__}; send a JSON object")
    return body


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# name -> (check, what it must be)
TYPES: dict[str, tuple[Any, str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (_is_int, "an integer"),
    "number": (_is_number, "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "texts": (
        lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(t, str) for t in v)),
        "a string or a list of strings",
    ),
    "inputs": (
        lambda v: (
            isinstance(v, str)
            or (isinstance(v, list) and (all(isinstance(t, str) for t in v) or all(_is_int(t) for t in v)))
            or (isinstance(v, list) and all(isinstance(t, list) and all(_is_int(i) for i in t) for t in v))
        ),
        "a string, a list of strings, a list of token ids or a list of token-id lists",
    ),
    "ids": (lambda v: isinstance(v, list) and all(_is_int(t) for t in v), "a list of token ids"),
    "messages": (
        lambda v: isinstance(v, list) and all(isinstance(m, dict) for m in v),
        'a list of {"role", "content"} objects',
    ),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "any": (lambda v: True, "anything"),
}

_ignored: set[str] = set()  # fields already logged as ignored


def fields(
    body: dict[str, Any], spec: dict[str, str], required: tuple[str, ...] = (), endpoint: str | None = None
) -> dict[str, Any]:
    """``body``'s fields, each of the type ``spec`` names; missing required ones are refused
    (422), as are nulls for fields that are not optional. Unknown fields are refused (422), or
    with ``endpoint`` (an OpenAI one) left out and logged the first time each is seen."""
    unknown = sorted(set(body) - set(spec))
    if unknown and endpoint is None:
        raise ApiError(
            422,
            f"unknown field(s) {', '.join(unknown)}; this endpoint takes {', '.join(sorted(spec))}",
            param=unknown[0],
        )
    for name in unknown:
        if f"{endpoint} {name}" not in _ignored:
            _ignored.add(f"{endpoint} {name}")
            log.warning("%s: the field %r is not used by attnkit and is ignored", endpoint, name)
    for name in required:
        if name not in body:
            raise ApiError(422, f"the field {name!r} is required", param=name)
    out = {}
    for name, value in body.items():
        if name not in spec or (value is None and name not in required):
            continue
        check, what = TYPES[spec[name]]
        if not check(value):
            raise ApiError(422, f"{name} must be {what}, got {json.dumps(value)[:80]}", param=name)
        out[name] = value
    return out


def in_range(name: str, value: float, low: float, high: float, limit: bool = False) -> None:
    """``low <= value <= high``; above a server limit (``limit``) is 413, else 422."""
    if value > high and limit:
        raise ApiError(413, f"{name}={value} is over this server's limit of {high}; ask for at most {high}", param=name)
    if not low <= value <= high:
        raise ApiError(422, f"{name} must be between {low} and {high}, got {value}", param=name)
