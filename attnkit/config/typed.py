"""Typed fields for the frozen config dataclasses: a value checked against its annotation (config
files and command lines are user input), a dataclass built from a mapping with a "did you mean"
on unknown keys, and a type described in words for the error messages."""

from __future__ import annotations

import dataclasses
import difflib
import math
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


def _matches(value: Any, hint: Any) -> bool:
    if hint is type(None):
        return value is None
    if get_origin(hint) is Literal:
        return not isinstance(value, bool) and value in get_args(hint)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if get_origin(hint) is tuple:
        args = get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args, strict=True))
    return isinstance(value, hint)


def describe(hint: Any) -> str:
    """An annotation in words: ``int`` -> "an int", ``Literal["a", "b"]`` -> "one of 'a', 'b'"."""
    if hint is type(None):
        return "null"
    if get_origin(hint) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if get_origin(hint) is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {describe(args[0])}s"
        return f"a list of {len(args)} {describe(args[0])}s"
    return "a number" if hint is float else f"a{'n' if hint is int else ''} {hint.__name__}"


def options(hint: Any) -> tuple[Any, ...]:
    """The alternatives of a union annotation (``int | None`` -> int, NoneType)."""
    return get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)


def check_types(config: Any) -> None:
    """Every field holds a value of its annotated type (config files are user input)."""
    hints = get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value, hint = getattr(config, field.name), hints[field.name]
        alternatives = options(hint)
        if not any(_matches(value, option) for option in alternatives):
            wanted = " or ".join(describe(option) for option in alternatives)
            raise ValueError(f"{field.name} must be {wanted}, got {value!r}")
        numbers = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            raise ValueError(f"{field.name} must be a finite number, got {value!r}")


def build(cls: type[T], data: Any, section: str) -> T:
    """``cls(**data)``, rejecting unknown keys with a "did you mean" and turning JSON lists
    into the tuples the dataclasses hold."""
    if not isinstance(data, dict):
        raise ValueError(f"the {section} config must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in data.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown {section} config key {key!r}{hint}")
        is_tuple = any(get_origin(o) is tuple for o in options(hints[key]))
        values[key] = tuple(value) if is_tuple and isinstance(value, list) else value
    try:
        return cls(**values)
    except TypeError as err:  # a required field is missing
        raise ValueError(f"{section} config: {err}") from None
