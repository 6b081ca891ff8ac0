"""Continuous batching: the greedy loop of [alg:att-decode] run for many requests at once, a
new request joining the running batch at the next step instead of waiting for it to end.

Every row is one request (a decoder-only model, greedy or sampled, no beams). A request that
joins is prefilled on its own, then its keys and values are put beside the others' in one
cache, right-aligned (:meth:`~attnkit.nn.cache.DecoderCache.join`): every row's newest key
sits at the same position, the shorter rows padded on the left and the padding masked. Each
row keeps its own positions, so a row's logits are those of its prompt decoded alone. A row
that ends leaves the batch at once, and padding that no row reads any more is cut off.
Requests that join together with the same prompt (an API's ``n`` choices) share one prefill.

A request may ask for scores: each chosen token's log-probability under the model (the raw
softmax of its logits, before any penalty, bias or temperature) with the k likeliest tokens',
and the same for its prompt's tokens (the first has none).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.generation.batches import pad_left
from attnkit.generation.batches import positions as row_positions
from attnkit.generation.greedy import argmax
from attnkit.generation.incremental import decoder_only_step
from attnkit.models.core import DecoderOnlyModel
from attnkit.nn.cache import DecoderCache

# Room for this many new positions beyond a cache's filled part (it doubles beyond that).
HEADROOM = 32
# Leading padding is cut once it is at least this many positions: the cut copies every cache.
TRIM_AT = 16


@dataclass(frozen=True)
class Scored:
    """A token's log-probability under the model and the k likeliest tokens' (id, log-probability)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


# A row's logits (vocab,) and its new tokens so far -> the logits to choose from.
Adjust = Callable[[Tensor, Sequence[int]], Tensor]


@dataclass(eq=False)
class Request:
    """One sequence of a continuous batch: its prompt (token ids), at most ``max_new_tokens``
    new ones (0: the prompt is only scored), ending at any of ``eos`` (ids). ``adjust`` changes
    the logits before a choice (penalties, a bias); ``choose`` picks a token from next-token
    logits (1, vocab): greedy where None. ``top_logprobs``: score each new token with the k
    likeliest (None: no scores); ``prompt_logprobs``: score the prompt's tokens too, handed to
    ``on_prompt`` before any token. ``on_token`` is called with each new token and its score as
    it is chosen."""

    prompt: Sequence[int]
    max_new_tokens: int
    eos: Sequence[int] = ()
    choose: Callable[[Tensor], Tensor] | None = None
    on_token: Callable[[int, Scored | None], None] | None = None
    on_prompt: Callable[[list[Scored | None]], None] | None = None
    adjust: Adjust | None = None
    top_logprobs: int | None = None
    prompt_logprobs: int | None = None
    tokens: list[int] = field(default_factory=list)
    scores: list[Scored] = field(default_factory=list)
    prompt_scores: list[Scored | None] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (an end token) or "length", once finished

    def add(self, token: int, scored: Scored | None = None) -> bool:
        """Record ``token`` (and its score); True when the request is finished with it."""
        self.tokens.append(token)
        if scored is not None:
            self.scores.append(scored)
        if self.on_token is not None:
            self.on_token(token, scored)
        if token in self.eos:
            self.finish_reason = "stop"
        elif len(self.tokens) >= self.max_new_tokens:
            self.finish_reason = "length"
        return self.finish_reason is not None


class ContinuousBatch:
    """The running batch of a decoder-only ``model``: :meth:`add` requests at any time,
    :meth:`step` all of them by one token, :meth:`remove` the ones no longer wanted."""

    def __init__(self, model: DecoderOnlyModel) -> None:
        if model.config.is_encoder_decoder:
            raise ValueError("continuous batching decodes decoder-only (GPT-family) models")
        self.model = model
        self.requests: list[Request] = []
        self.cache: DecoderCache | None = None
        self.key_mask: Tensor | None = None  # (N, len(cache)): the keys each row may read
        self.last: Tensor | None = None  # (N,): each row's newest token, fed at the next step
        self.next_position: Tensor | None = None  # (N, 1)

    def __len__(self) -> int:
        return len(self.requests)

    @torch.no_grad()
    def add(self, requests: Sequence[Request]) -> list[Request]:
        """Prefill ``requests`` (left-padded together, equal prompts once), choose each one's
        first token and join them to the batch; returns those already finished by it (they do
        not join)."""
        if not requests:
            return []
        for request in requests:
            if not request.prompt:
                raise ValueError("a request needs a prompt of at least one token")
            if request.max_new_tokens < 0:
                raise ValueError(f"max_new_tokens must be >= 0, got {request.max_new_tokens}")
        device = self.model.embeddings.token.weight.device
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(r.prompt), len(distinct)) for r in requests]  # request -> prefill row
        ids, real = pad_left(list(distinct), 0, device)  # (u, P)
        real = real.bool()
        positions = row_positions(real)  # (u, P): each row counts from its first token
        cache = self.model.decoder.new_cache(capacity=ids.shape[1] + HEADROOM)
        mask = None if bool(real.all()) else real
        logits = self.model(ids, mask, cache=cache, position_ids=positions).logits  # (u, P, vocab)
        for request, row in zip(requests, rows, strict=True):
            if request.prompt_logprobs is not None:
                scored = _prompt_scores(logits[row], ids[row], len(request.prompt), request.prompt_logprobs)
                request.prompt_scores = [None, *scored]
                if request.on_prompt is not None:
                    request.on_prompt(request.prompt_scores)
        index = torch.tensor(rows, device=device)
        tokens, scores = self._choose(logits[:, -1].index_select(0, index), list(requests))
        finished = []
        for request, token, scored in zip(requests, tokens.tolist(), scores, strict=True):
            if request.max_new_tokens == 0:
                request.finish_reason = "length"
            else:
                request.add(token, scored)
            if request.finish_reason is not None:
                finished.append(request)
        keep = [n for n, r in enumerate(requests) if r.finish_reason is None]
        if not keep:
            return finished
        select = index[keep]  # the prefill row of each request that joins
        if select.tolist() != list(range(len(distinct))):
            cache.reorder(select)
        joined, real = [requests[n] for n in keep], real.index_select(0, select)
        last, next_position = tokens[keep], positions[select, -1:] + 1
        if self.cache is None:
            self.cache, self.key_mask, self.last, self.next_position = cache, real, last, next_position
        else:
            assert self.key_mask is not None and self.last is not None and self.next_position is not None
            length = max(len(self.cache), len(cache))
            key_mask = torch.cat(
                [F.pad(self.key_mask, (length - self.key_mask.shape[1], 0)), F.pad(real, (length - real.shape[1], 0))]
            )
            self.cache.join(cache)  # the batch's state changes only once this has succeeded
            self.key_mask = key_mask
            self.last = torch.cat([self.last, last])
            self.next_position = torch.cat([self.next_position, next_position])
        self.requests += joined
        return finished

    @torch.no_grad()
    def step(self) -> list[Request]:
        """Feed every row its newest token and choose the next; returns the requests that
        finished at this step (they have left the batch)."""
        if not self.requests:
            return []
        assert self.cache is not None and self.key_mask is not None and self.last is not None
        assert self.next_position is not None
        self.key_mask = F.pad(self.key_mask, (0, 1), value=True)  # the new position is real for every row
        mask = None if bool(self.key_mask.all()) else self.key_mask
        logits = decoder_only_step(self.model, self.last[:, None], self.cache, mask, self.next_position)
        self.next_position = self.next_position + 1
        self.last, scores = self._choose(logits, self.requests)
        finished = [r for r, t, s in zip(self.requests, self.last.tolist(), scores, strict=True) if r.add(t, s)]
        self.remove(finished)
        return finished

    def remove(self, requests: Sequence[Request]) -> None:
        """Take ``requests`` out of the batch (finished, or their client went away)."""
        gone = {id(r) for r in requests}
        keep = [row for row, r in enumerate(self.requests) if id(r) not in gone]
        if len(keep) == len(self.requests):
            return
        if not keep:
            self.__init__(self.model)  # type: ignore[misc]
            return
        assert self.cache is not None and self.key_mask is not None and self.last is not None
        assert self.next_position is not None
        index = torch.tensor(keep, device=self.last.device)
        self.cache.reorder(index)
        self.requests = [self.requests[row] for row in keep]
        self.key_mask, self.last = self.key_mask.index_select(0, index), self.last.index_select(0, index)
        self.next_position = self.next_position.index_select(0, index)
        unread = int(self.key_mask.any(dim=0).long().argmax())  # leading positions no row reads
        if unread >= TRIM_AT:
            self.cache.trim(unread)
            self.key_mask = self.key_mask[:, unread:]

    def _choose(self, logits: Tensor, requests: Sequence[Request]) -> tuple[Tensor, list[Scored | None]]:
        """Each row's next token (N,) from its ``logits`` (N, vocab): greedy rows together,
        sampled rows each with its own choice, after each row's adjustment; and each token's
        score where its request asks for one."""
        chosen_from = logits
        if any(r.adjust is not None for r in requests):
            chosen_from = logits.to(torch.float32, copy=True)  # the scores are the raw logits'
            for row, request in enumerate(requests):
                if request.adjust is not None:
                    chosen_from[row] = request.adjust(chosen_from[row], request.tokens)
        tokens = argmax(chosen_from)
        for row, request in enumerate(requests):
            if request.choose is not None:
                tokens[row] = request.choose(chosen_from[row : row + 1])[0]
        scores: list[Scored | None] = [None] * len(requests)
        for row, request in enumerate(requests):
            if request.top_logprobs is not None:
                logprobs = torch.log_softmax(logits[row : row + 1].float(), dim=-1)
                scores[row] = _scored(logprobs, tokens[row : row + 1], request.top_logprobs)[0]
        return tokens, scores


def _scored(logprobs: Tensor, chosen: Tensor, k: int) -> list[Scored]:
    """Each position's chosen token's log-probability and the ``k`` likeliest, from ``logprobs``
    (T, vocab) and ``chosen`` (T,)."""
    picked = logprobs.gather(-1, chosen[:, None])[:, 0].tolist()
    if k == 0:
        return [Scored(p) for p in picked]
    values, ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
    return [
        Scored(p, tuple(zip(i, v, strict=True))) for p, i, v in zip(picked, ids.tolist(), values.tolist(), strict=True)
    ]


def _prompt_scores(logits: Tensor, ids: Tensor, length: int, k: int) -> list[Scored]:
    """The scores of a left-padded prompt's tokens after its first, from its prefill ``logits``
    (P, vocab) and ``ids`` (P,): position t's logits predict token t + 1."""
    if length < 2:
        return []
    logprobs = torch.log_softmax(logits[-length:-1].float(), dim=-1)  # (length - 1, vocab)
    return _scored(logprobs, ids[-length + 1 :], k)
