"""Tool calls in OpenAI's chat shape: ``tools`` (functions with JSON-schema parameters),
``tool_choice`` (``"none"``, ``"auto"``, ``"required"`` or a named function) and
``parallel_tool_calls``, read into a system message the model reads and a grammar its answer
is kept to, and the answer read back into ``tool_calls``.

The format is attnkit's documented default, the one Hermes and Qwen models are trained on,
rendered through the model's own chat template: the tools listed in a system message between
``<tools>`` tags, each call written as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
and a tool's result sent back as a user message between ``<tool_response>`` tags. The grammar
(:mod:`attnkit.generation.grammar`, Lark with llguidance's ``%json``) makes each call name one
of the tools and its arguments valid against that tool's parameters: ``"required"`` (or a named
function) allows calls only, ``"auto"`` calls or a text that does not begin with ``<``;
``parallel_tool_calls`` false allows one call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from attnkit.generation.grammar import JSON_FORMAT, Grammar, bounded
from attnkit.serve.schema import ApiError

OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>\n"
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
PROMPT = (
    "You may call one or more functions to assist with the user query.\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


@dataclass(frozen=True)
class Tools:
    """A request's checked tools: each function's name -> its parameters' schema, the
    ``tools`` as sent (for the prompt), which may be called (``choice``: "auto", "required" or
    a function's name) and whether more than one call may come."""

    parameters: dict[str, dict[str, Any]]
    listed: list[dict[str, Any]]
    choice: str
    parallel: bool

    def prompt(self) -> str:
        """The system message that lists the tools and how to call them."""
        return PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in self.listed))

    def grammar(self, bound: bool = False) -> Grammar:
        """What the answer may be: calls of the tools that may be called (their arguments
        valid; ``bound``: within :func:`~attnkit.generation.grammar.bounded`), or, with "auto", a
        text that does not begin with ``<``."""
        names = list(self.parameters) if self.choice in ("auto", "required") else [self.choice]
        arguments = {name: bounded(self.parameters[name]) if bound else self.parameters[name] for name in names}
        call = {"x-guidance": JSON_FORMAT, "anyOf": [
            {"type": "object", "properties": {"name": {"const": name}, "arguments": arguments[name]},
             "required": ["name", "arguments"], "additionalProperties": False} for name in names]}  # fmt: skip
        rules = [
            f"start: calls{' | text' if self.choice == 'auto' else ''}",
            f"calls: call{'+' if self.parallel else ''}",
            f"call: {json.dumps(OPEN)} %json {json.dumps(call)} {json.dumps(CLOSE)}",
            "text: TEXT?",
            r"TEXT: /[^<](.|\n)*/",
        ]
        return Grammar.lark("\n".join(rules) + "\n")


def read_tools(body: dict[str, Any]) -> Tools | None:
    """The checked ``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a chat request;
    None where no tool may be called (none given, or ``tool_choice`` "none")."""
    if body.get("functions"):
        raise ApiError(400, "functions is OpenAI's deprecated form; send tools", param="functions")
    listed = body.get("tools") or []
    choice = body.get("tool_choice", "auto" if listed else "none")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ApiError(422, f"parallel_tool_calls must be true or false, got {parallel!r}", param="parallel_tool_calls")
    if not isinstance(listed, list):
        raise ApiError(422, f"tools must be a list of functions, got {type(listed).__name__}", param="tools")
    parameters: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(listed):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise ApiError(422, f'{where} must be {{"type": "function", "function": {{...}}}}', param=where)
        name = function.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ApiError(422, f"{where}.function.name must be 1 to 64 letters, digits, _ or -, got {name!r}",
                           param=f"{where}.function.name")  # fmt: skip
        if name in parameters:
            raise ApiError(422, f"{where}.function.name {name!r} is given twice", param=f"{where}.function.name")
        schema = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            got = json.dumps(schema)[:80]
            raise ApiError(400, f"{where}.function.parameters must be a JSON schema of an object (arguments are "
                           f"an object), got {got}", param=f"{where}.function.parameters")  # fmt: skip
        parameters[name] = schema
    if isinstance(choice, dict):
        named = choice.get("function", {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(named, str):
            raise ApiError(422, 'tool_choice must be "none", "auto", "required" or {"type": "function", '
                           '"function": {"name": ...}}', param="tool_choice")  # fmt: skip
        if named not in parameters:
            raise ApiError(400, f"tool_choice names {named!r}, which is not among the tools "
                           f"({', '.join(parameters) or 'none given'})", param="tool_choice")  # fmt: skip
        choice = named
    elif choice not in ("none", "auto", "required"):
        raise ApiError(422, f'tool_choice must be "none", "auto", "required" or a function, got {choice!r}',
                       param="tool_choice")  # fmt: skip
    if choice != "none" and not parameters:
        raise ApiError(400, f"tool_choice {choice!r} needs tools; send tools or leave tool_choice out",
                       param="tool_choice")  # fmt: skip
    if choice == "none":
        return None
    if body.get("response_format") not in (None, {"type": "text"}):
        raise ApiError(400, "response_format with tools: an answer is either tool calls or the format; send one",
                       param="response_format")  # fmt: skip
    return Tools(parameters, listed, choice, parallel)


def calls_of(text: str) -> list[dict[str, Any]] | None:
    """An answer's tool calls in OpenAI's shape (ids, names, arguments as JSON text), None
    where it is not calls (a text, or calls cut short)."""
    if not text.startswith(OPEN):
        return None
    calls = []
    for block in text.split(OPEN)[1:]:
        try:
            call = json.loads(block.removesuffix(CLOSE)) if block.endswith(CLOSE) else None
        except ValueError:
            call = None
        if not isinstance(call, dict):  # cut short (max_tokens, a stop sequence)
            return None
        arguments = json.dumps(call["arguments"], ensure_ascii=False)
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"], "arguments": arguments}})  # fmt: skip
    return calls


def as_text(message: dict[str, Any]) -> str:
    """An assistant message's tool calls as the model wrote them (after its content, if any)."""
    calls = message.get("tool_calls") or []
    blocks = []
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        try:
            arguments = json.loads(function["arguments"]) if isinstance(function, dict) else None
        except (TypeError, ValueError, KeyError):
            arguments = None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or arguments is None:
            raise ApiError(422, f"tool_calls[{k}] must be a function with a name and JSON arguments",
                           param="messages")  # fmt: skip
        blocks.append(OPEN + json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False) + CLOSE)
    return (message.get("content") or "") + "".join(blocks)


def response(content: Any) -> str:
    """A tool's result as the model reads it."""
    return f"<tool_response>\n{content}\n</tool_response>"
