"""``POST /v1/chat/completions``, OpenAI's chat API for GPT-family models with a chat template:
messages whose content is text or a list of text parts, rendered by the model's template;
``tools`` called as :mod:`attnkit.serve.tools` says, their results carried back in;
``logprobs`` with up to 20 ``top_logprobs`` per token in the chat shape."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from attnkit.generation.continuous import Scored
from attnkit.generation.text import TemplateRefusalError, chat_prompt
from attnkit.serve.handling import Api
from attnkit.serve.sampling import Choice, CompletionApi, Delta, Sampling
from attnkit.serve.schema import ApiError, in_range
from attnkit.serve.structured import compiled_for
from attnkit.serve.tools import Tools, as_text, calls_of, read_tools, response

# OpenAI's bound on the likeliest tokens listed per token.
MAX_TOP_LOGPROBS = 20
# The roles a message may have; OpenAI's "developer" is the system's message of newer models.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "user"}


class Chat(CompletionApi):
    kind = "chat.completion"
    endpoint = "/v1/chat/completions"

    async def respond(self, request: HttpRequest) -> Response:
        spec = dict(messages="messages", max_completion_tokens="int", logprobs="bool", top_logprobs="int",
                    parallel_tool_calls="bool")  # fmt: skip
        body = self.read(await self.body(request), spec, "messages")
        tools = read_tools(body)
        template = getattr(self.state.model, "chat_template", None)
        if not template:
            raise ApiError(400, "this server's model has no chat template; use /v1/completions")
        if not body["messages"]:
            raise ApiError(422, "messages is empty; send at least one message", param="messages")
        messages = body["messages"] if tools is None else with_tools(body["messages"], tools)
        ids = conversation_ids(self, template, messages)
        s = self.sampling(body, body.get("max_completion_tokens", body.get("max_tokens")), 1)
        if tools is not None:
            grammar = tools.grammar(self.state.limits.bound_schemas)
            s.grammar, s.tool_calls = compiled_for(grammar, self.tokenizer, self.state.model.config, "tools"), True
        if body.get("logprobs", False):
            s.top_logprobs = body.get("top_logprobs", 0)
            in_range("top_logprobs", s.top_logprobs, 0, MAX_TOP_LOGPROBS)
        elif body.get("top_logprobs") is not None:
            raise ApiError(422, "top_logprobs needs logprobs: true", param="top_logprobs")
        choices = self.choices([ids], s)
        return await self.answer(request, [ids], choices, s)

    def opening(self, choice: Choice, s: Sampling) -> dict[str, Any] | None:
        return {"index": choice.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}  # fmt: skip

    def choice_body(self, delta: Delta, s: Sampling, final: bool) -> dict[str, Any]:
        choice, text, tokens, finish = delta.choice, delta.text, delta.tokens, delta.finish_reason
        logprobs = None
        if s.top_logprobs is not None:
            eos = self.state.model.config.eos_token_id  # the end of the turn is not content
            logprobs = {"content": [self._entry(t, sc) for t, _, sc in tokens if sc is not None and t != eos]}
        calls = calls_of(choice.shown) if s.tool_calls and finish is not None else None
        if calls is not None and finish == "stop":  # "length": whole calls, closed early for max_tokens
            finish = "tool_calls"
        if final:
            message = {"role": "assistant", "content": text} if calls is None else \
                {"role": "assistant", "content": None, "tool_calls": calls}  # fmt: skip
            return {"index": choice.index, "message": message, "logprobs": logprobs, "finish_reason": finish}
        if s.tool_calls and choice.shown[:1] in ("", "<"):  # may be calls: held back until they are whole
            text = ""
        delta: dict[str, Any] = {"content": text} if text else {}
        if calls is not None:  # each call whole in the last chunk, numbered as the SDK gathers them
            delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
        elif s.tool_calls and finish is not None and choice.shown.startswith("<"):  # cut calls: the text held back
            delta = {"content": choice.shown}
        return {"index": choice.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def _entry(self, token: int, scored: Scored) -> dict[str, Any]:
        def one(i: int, logprob: float) -> dict[str, Any]:
            text = self.token_text(i)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return {**one(token, scored.logprob), "top_logprobs": [one(i, v) for i, v in scored.top]}


def with_tools(messages: list[dict[str, Any]], tools: Tools) -> list[dict[str, Any]]:
    """``messages`` with the tools' system message: the conversation's own system message, if it
    opens with one, followed by it (templates take one system message, first)."""
    if messages and isinstance(messages[0], dict) and messages[0].get("role") in ("system", "developer"):
        first = message_of(0, messages[0])
        return [{"role": "system", "content": f"{first['content']}\n\n{tools.prompt()}"}, *messages[1:]]
    return [{"role": "system", "content": tools.prompt()}, *messages]


def conversation_ids(api: Api, template: str, messages: list[dict[str, Any]], open_turn: bool = True) -> list[int]:
    """``messages`` (as OpenAI's clients send them) through the served model's chat ``template``
    as ids, the assistant's turn opened (``open_turn``); a conversation the template refuses is
    a 400, a template that cannot be rendered a 500."""
    readable = [message_of(n, m) for n, m in enumerate(messages)]
    try:
        return chat_prompt(template, api.tokenizer, api.state.model.config, readable, open_turn)
    except TemplateRefusalError as err:  # the template's own check of the conversation
        raise ApiError(400, f"the model's chat template refuses this conversation: {err}", param="messages") from None
    except ValueError as err:
        raise ApiError(500, str(err), "server_error") from None


def message_of(n: int, message: dict[str, Any]) -> dict[str, str]:
    """A message as the chat template reads it: its role, its content as one text (text parts
    joined), its name if it has one."""
    where = f"messages[{n}]"
    role = message.get("role")
    if role not in ROLES:
        raise ApiError(
            422, f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param=f"{where}.role"
        )  # fmt: skip
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(
                    400, f"{where}.content[{k}] is a {kind!r} part; attnkit's models read text parts only "
                    '({"type": "text", "text": ...})', param=f"{where}.content",
                )  # fmt: skip
            texts.append(part["text"])
        content = "\n".join(texts)
    if role == "assistant" and message.get("tool_calls"):  # its calls as the model wrote them
        content = as_text({**message, "content": content})
    if not isinstance(content, str):
        raise ApiError(
            422, f"{where}.content must be a string or a list of text parts, got {content!r}"[:200],
            param=f"{where}.content",
        )  # fmt: skip
    if role == "tool":  # a tool's result, as the model reads one (attnkit.serve.tools)
        return {"role": "user", "content": response(content)}
    out = {"role": ROLES[role], "content": content}
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out
