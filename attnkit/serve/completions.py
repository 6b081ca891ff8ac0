"""``POST /v1/completions``, OpenAI's completions API for GPT-family models: a prompt as text,
texts, token ids or lists of them; ``echo`` with the prompt's own log-probabilities (the first
null), as lm-evaluation-harness scores a continuation; ``logprobs`` in the API's legacy shape."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from attnkit.generation.continuous import Scored
from attnkit.generation.text import TextStream, prompt_ids
from attnkit.serve.sampling import Choice, CompletionApi, Delta, Sampling
from attnkit.serve.schema import ApiError, in_range

# OpenAI's bound on the likeliest tokens listed per token.
MAX_LOGPROBS = 5
# OpenAI's default number of new tokens of a completion.
DEFAULT_MAX_TOKENS = 16


class Completions(CompletionApi):
    kind = "text_completion"
    endpoint = "/v1/completions"

    async def respond(self, request: HttpRequest) -> Response:
        spec = dict(prompt="inputs", echo="bool", logprobs="int", best_of="int", suffix="str")
        body = self.read(await self.body(request), spec, "prompt")
        for name in ("tools", "functions"):
            if body.get(name):
                raise ApiError(400, f"{name}: the completions API has no tool calls; use /v1/chat/completions",
                               param=name)  # fmt: skip
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice: the completions API has no tool calls; use /v1/chat/completions",
                           param="tool_choice")  # fmt: skip
        if body.get("suffix"):
            raise ApiError(400, "suffix is not supported: attnkit's models complete text left to right", param="suffix")
        config, limit = self.state.model.config, self.state.limits.max_batch
        prompts = self.token_rows(
            body["prompt"], "prompt", limit, lambda texts: prompt_ids(self.tokenizer, config, texts)
        )
        s = self.sampling(body, body.get("max_tokens", DEFAULT_MAX_TOKENS), len(prompts))
        if body.get("best_of", s.n) != s.n:
            raise ApiError(400, f"best_of must equal n ({s.n}): attnkit returns every choice it makes", param="best_of")
        s.echo, s.top_logprobs = body.get("echo", False), body.get("logprobs")
        if s.top_logprobs is not None:
            in_range("logprobs", s.top_logprobs, 0, MAX_LOGPROBS)
        if s.echo and s.stream and s.top_logprobs is not None:
            raise ApiError(
                422, "echo with logprobs is answered whole: the prompt's scores come with the answer; "
                "set stream to false", param="echo",
            )  # fmt: skip
        choices = self.choices(prompts, s, prompt_logprobs=s.top_logprobs if s.echo else None)
        return await self.answer(request, prompts, choices, s)

    def opening(self, choice: Choice, s: Sampling) -> dict[str, Any] | None:
        if not s.echo:
            return None
        text, _ = self._prompt_text(choice)
        return {"index": choice.index, "text": text, "logprobs": None, "finish_reason": None}

    def choice_body(self, delta: Delta, s: Sampling, final: bool) -> dict[str, Any]:
        choice, text, tokens, finish = delta.choice, delta.text, delta.tokens, delta.finish_reason
        start = ""
        if s.echo:  # the prompt's text first: the new tokens' offsets move past it
            start, offsets = self._prompt_text(choice)
            tokens = [(t, o + len(start), sc) for t, o, sc in tokens]
            if final and s.top_logprobs is not None:
                assert choice.prompt_scores is not None
                tokens = [*zip(choice.job.options["ids"], offsets, choice.prompt_scores, strict=True), *tokens]
        logprobs = None if s.top_logprobs is None else self._logprobs(tokens)
        return {"index": choice.index, "text": start + text if final else text, "logprobs": logprobs,
                "finish_reason": finish}  # fmt: skip

    def _prompt_text(self, choice: Choice) -> tuple[str, list[int]]:
        """The prompt's text and each of its tokens' offset in it (made once per choice)."""
        if choice.prompt_text is None:
            stream, offsets = TextStream(self.tokenizer), []
            for token in choice.job.options["ids"]:
                offsets.append(len(stream.text))
                stream.push(token)
            choice.prompt_text = stream.text + stream.finish(), offsets
        return choice.prompt_text

    def _logprobs(self, tokens: list[tuple[int, int, Scored | None]]) -> dict[str, list]:
        text = self.token_text
        return {
            "tokens": [text(t) for t, _, _ in tokens],
            "token_logprobs": [None if sc is None else sc.logprob for _, _, sc in tokens],
            "top_logprobs": [None if sc is None else {text(i): v for i, v in sc.top} for _, _, sc in tokens],
            "text_offset": [o for _, o, _ in tokens],
        }
