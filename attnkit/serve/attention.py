"""``POST /v1/attention``: every layer's and head's attention weights for a text (and, for an
encoder–decoder model, its target: translated greedily when none is given), as the page at
``/`` draws them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import torch
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route

from attnkit.generation.text import prompt_ids, source_ids
from attnkit.models.core import Model
from attnkit.serve.engine import Job
from attnkit.serve.handling import Api, handled, outcomes
from attnkit.serve.schema import ApiError, fields

# Attention maps are layers x heads x queries x keys numbers: the endpoint reads at most this many tokens.
MAX_ATTENTION_TOKENS = 128


class Attention(Api):
    def routes(self) -> list[Route]:
        return [Route("/v1/attention", handled(self.attention), methods=["POST"])]

    async def attention(self, request: HttpRequest) -> Response:
        body = await self.body(request)
        body = fields(body, dict(text="str", target="str"), ("text",))
        if self.tokenizer is None:
            raise ApiError(400, "this server's model has no tokenizer, so text cannot be read; serve one that has")
        if not body["text"].strip():
            raise ApiError(400, "text is empty; send some text")
        model, cfg = self.state.model, self.state.model.config
        if cfg.is_encoder_decoder:
            source = source_ids(self.tokenizer, cfg.eos_token_id, [body["text"]])[0]
            self.check_length(source, "the text", 0)
            target = None
            if body.get("target") is not None:
                target = [
                    cfg.decoder_start_token_id,
                    *self.tokenizer.encode(body["target"], add_special_tokens=False).ids,
                ]
                self.check_length(target, "the target", 0)
        else:
            text = body["text"] + (body.get("target") or "")
            source = (
                prompt_ids(self.tokenizer, cfg, [text])[0] if cfg.family == "gpt" else self.tokenizer.encode(text).ids
            )
            self.check_length(source, "the text", 0)
            target = None
        for what, ids in (("the text", source), ("the target", target or [])):
            if len(ids) > MAX_ATTENTION_TOKENS:
                raise ApiError(
                    413, f"{what} is {len(ids)} tokens; attention maps are drawn for at most {MAX_ATTENTION_TOKENS}"
                )
        limit = min(self.max_new, MAX_ATTENTION_TOKENS)
        job = Job("call", asyncio.get_running_loop(), work=lambda: attention_of(model, source, target, limit))
        self.submit(job)
        (result,) = await outcomes([job], request)
        token = self._token_text
        tokens = {key: [token(i) for i in ids] for key, ids in result.pop("ids").items()}
        text = await asyncio.to_thread(json.dumps, {"tokens": tokens, **result})  # megabytes: not on the loop
        return Response(text, media_type="application/json")

    def _token_text(self, i: int) -> str:
        text = self.tokenizer.decode([i], skip_special_tokens=False)
        return text if text else (self.tokenizer.id_to_token(i) or str(i))


def attention_of(model: Model, source: list[int], target: list[int] | None, max_new_tokens: int) -> dict[str, Any]:
    """One forward pass recording every layer's attention weights, as nested lists indexed by
    layer, head, query and key, rounded to 4 decimals; an encoder–decoder model without a target
    translates greedily first."""
    cfg = model.config
    ids = torch.tensor([source])
    if cfg.is_encoder_decoder:
        if target is None:
            out = model.generate(ids, num_beams=1, max_new_tokens=max_new_tokens)[0].tolist()
            eos = cfg.eos_token_id
            target = out[: out.index(eos, 1)] if eos in out[1:] else out
        output = model(ids, decoder_input_ids=torch.tensor([target]), output_attentions=True)
        maps = {
            "encoder_self": output.attentions["encoder"]["self"],
            "decoder_self": output.attentions["decoder"]["self"],
            "cross": output.attentions["decoder"]["cross"],
        }
        token_ids = {"source": source, "target": target}
    else:
        output = model(ids, output_attentions=True)
        key = "decoder" if "decoder" in output.attentions else "encoder"
        maps = {f"{key}_self": output.attentions[key]["self"]}
        token_ids = {"target" if key == "decoder" else "source": source}
    weights = {
        name: [layer[0].float().mul(1e4).round().div(1e4).tolist() for layer in layers] for name, layers in maps.items()
    }
    return {"ids": token_ids, "layers": cfg.n_layers, "heads": cfg.n_heads, "attention": weights}
