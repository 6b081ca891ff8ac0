"""Request bodies checked field by field: a wrong type, an unknown field or a value out of
range is an :class:`ApiError` naming the field, the value and the fix, answered as
``{"error": {"message", "type"}}``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class ApiError(Exception):
    """An answer other than 200: its status, message and OpenAI-style error type."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind}}


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; over a limit is 413 (429 for a full queue)."""

    max_body_bytes: int = 1 << 20
    max_input_tokens: int = 512
    max_new_tokens: int = 256
    max_beams: int = 8
    max_batch: int = 32  # rows decoded together, and texts in one request
    max_queue: int = 256  # requests waiting for the model


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
    "prompt": (
        lambda v: (
            isinstance(v, str)
            or (isinstance(v, list) and (all(isinstance(t, str) for t in v) or all(_is_int(t) for t in v)))
        ),
        "a string, a list of strings or a list of token ids",
    ),
    "messages": (
        lambda v: (
            isinstance(v, list)
            and all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str) for m in v
            )
        ),
        'a list of {"role": string, "content": string} objects',
    ),
}


def fields(body: dict[str, Any], spec: dict[str, str], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """``body``'s fields, each of the type ``spec`` names; unknown fields and missing required
    ones are refused (422), as are nulls for fields that are not optional."""
    unknown = sorted(set(body) - set(spec))
    if unknown:
        raise ApiError(422, f"unknown field(s) {', '.join(unknown)}; this endpoint takes {', '.join(sorted(spec))}")
    for name in required:
        if name not in body:
            raise ApiError(422, f"the field {name!r} is required")
    out = {}
    for name, value in body.items():
        if value is None and name not in required:
            continue
        check, what = TYPES[spec[name]]
        if not check(value):
            raise ApiError(422, f"{name} must be {what}, got {json.dumps(value)[:80]}")
        out[name] = value
    return out


def in_range(name: str, value: float, low: float, high: float, limit: bool = False) -> None:
    """``low <= value <= high``; above a server limit (``limit``) is 413, else 422."""
    if value > high and limit:
        raise ApiError(413, f"{name}={value} is over this server's limit of {high}; ask for at most {high}")
    if not low <= value <= high:
        raise ApiError(422, f"{name} must be between {low} and {high}, got {value}")
