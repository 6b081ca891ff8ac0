"""Structured outputs: OpenAI's ``response_format`` read into a grammar that every token of the
answer is constrained to (:mod:`attnkit.generation.grammar`): ``{"type": "json_object"}`` any
JSON object, ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict":
true}}`` one valid against the schema, ``{"type": "text"}`` (the default) none. A schema the
engine cannot compile is a 400 naming the field and the engine's reason; a compiled one is
cached, so a schema sent again starts at once."""

from __future__ import annotations

from typing import Any

from attnkit.config import ModelConfig
from attnkit.generation.grammar import Compiled, Grammar, GrammarError, bounded, compile_grammar
from attnkit.serve.schema import ApiError

FORMATS = ("text", "json_object", "json_schema")


def compiled_for(grammar: Grammar, tokenizer: Any, config: ModelConfig, where: str) -> Compiled:
    """``grammar`` compiled for the served model; one it cannot keep to is a 400 naming ``where``."""
    if config.eos_token_id is None:
        raise ApiError(400, f"{where}: this server's model has no end token to end a structured answer with",
                       param=where)  # fmt: skip
    try:
        return compile_grammar(grammar, tokenizer, config.vocab_size, [config.eos_token_id])
    except GrammarError as e:
        raise ApiError(400, f"{where}: {e}", param=where) from None


def response_grammar(value: Any, tokenizer: Any, config: ModelConfig, bound: bool = False) -> Compiled | None:
    """The compiled grammar of a request's ``response_format`` (None: free text); ``bound``:
    its schema's open ends closed (:func:`~attnkit.generation.grammar.bounded`)."""
    if value is None:
        return None
    where = "response_format"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in FORMATS:
        raise ApiError(422, f"{where}.type must be one of {', '.join(FORMATS)}, got {kind!r}"[:200], param=where)
    if kind == "text":
        return None
    if kind == "json_object":
        grammar = Grammar.json_schema({"type": "object"})
    else:
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            got = f"{spec!r}"[:100]
            raise ApiError(422, f'{where}.json_schema must be an object with a "name" and a "schema", got {got}',
                           param=f"{where}.json_schema")  # fmt: skip
        if not isinstance(spec.get("strict", False), bool):
            raise ApiError(422, f"{where}.json_schema.strict must be true or false, got {spec['strict']!r}",
                           param=f"{where}.json_schema.strict")  # fmt: skip
        where = f"{where}.json_schema.schema"
        schema = spec.get("schema", {"type": "object"})  # OpenAI's default: any object
        if not isinstance(schema, dict):
            raise ApiError(400, f"{where} must be a JSON object, got {type(schema).__name__}", param=where)
        grammar = Grammar.json_schema(bounded(schema) if bound else schema)
    return compiled_for(grammar, tokenizer, config, where)
