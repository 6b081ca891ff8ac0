"""Continuous batching: the greedy loop of [alg:att-decode] run for many requests at once, a
new request joining the running batch at the next step instead of waiting for it to end.

Every row is one request (a decoder-only model, greedy or sampled, no beams). A request that
joins is prefilled on its own, then its keys and values are put in a free row of one fixed
cache, right-aligned (:meth:`~attnkit.nn.cache.DecoderCache.put`): every row's newest key
sits at the same position, the shorter rows' earlier positions masked. Each row keeps its own
positions, so a row's logits are those of its prompt decoded alone. A row that ends is freed at
once. The rows and the cache's capacity come in powers of two and change only when the batch
outgrows them or fits in half of them, so that the step can run compiled, one graph per layout
(:class:`ContinuousBatch`). Requests that join together with the same prompt (an API's ``n``
choices) share one prefill.

A request may ask for scores: each chosen token's log-probability under the model (the raw
softmax of its logits, before any penalty, bias or temperature) with the k likeliest tokens',
and the same for its prompt's tokens (the first has none).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from attnkit.data.padding import pad_left
from attnkit.data.padding import positions as row_positions
from attnkit.generation import background, compiled
from attnkit.generation.greedy import argmax
from attnkit.generation.incremental import decoder_only_step
from attnkit.models.core import DecoderOnlyModel
from attnkit.nn.cache import DecoderCache

# A new layout's room for this many steps after its rows' positions (its capacity a power of two).
HEADROOM = 32


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
    finish_reason: str | None = None  # "stop" (an end token), "length", or "error" (``error`` says), once finished
    error: str | None = None  # why its ``adjust`` failed (a grammar that allows no token): it ends there

    def add(self, token: int, scored: Scored | None = None) -> bool:
        """Record ``token`` (and its score); True when the request is finished with it. A
        request whose adjustment failed ends without it."""
        if self.error is not None:
            self.finish_reason = "error"
            return True
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
    :meth:`step` all of them by one token, :meth:`remove` the ones no longer wanted.

    The batch is laid out in fixed shapes, so that its step can run as one compiled graph
    (``compile``: :mod:`attnkit.generation.compiled`, one graph per layout): ``rows`` (a power of
    two) rows of a fixed cache of ``capacity`` positions (a power of two), one shared write
    position (the cache's clock). A request takes a free row, its prompt's keys written just
    before that position; a finished row is freed (masked; it computes a dummy token until it is
    taken again). The layout changes only when the batch outgrows it (more rows, or the write
    position at the end of the cache), or shrinks to half of it: then every row is copied into a
    new layout right-aligned at the position after its longest row, the positions no row reads
    dropped.

    ``compile="auto"``: a layout whose step is neither in memory nor kept on the disk decodes
    eagerly (on its fixed buffers), and its step is asked once of ``precompile("batch", rows,
    capacity)`` (default: the model's background compiler,
    :func:`attnkit.generation.background.for_model`); a step that appears on the disk (checked
    by a stat per step) is loaded and used from then on. No step ever waits on a compile."""

    def __init__(
        self,
        model: DecoderOnlyModel,
        compile: bool | Literal["auto"] = False,
        precompile: Callable[[str, int, int], None] | None = None,
    ) -> None:
        if model.config.is_encoder_decoder:
            raise ValueError("continuous batching decodes decoder-only (GPT-family) models")
        self.model, self.compile, self.precompile = model, compile, precompile
        self._kept: dict[tuple[Any, ...], Path | None] = {}  # (structure, rows, capacity) -> its step's file
        if compile and model.embeddings.positions is not None:
            model.embeddings.positions.cover(model.config.max_len)  # a grown table would be a new graph
        self._empty()

    def _empty(self) -> None:
        self.rows: list[Request | None] = []  # each row's request; None: a free row
        self.cache: DecoderCache | None = None  # fixed: (len(rows), ·, capacity, ·) per layer
        self.key_mask: Tensor | None = None  # (rows, capacity): the keys each row may read
        self.last: Tensor | None = None  # (rows,): each row's newest token, fed at the next step
        self.next_position: Tensor | None = None  # (rows, 1)

    @property
    def requests(self) -> list[Request]:
        """The requests being decoded, in their rows' order."""
        return [r for r in self.rows if r is not None]

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
        prefill = self.model.decoder.new_cache(capacity=ids.shape[1])
        mask = None if bool(real.all()) else real
        logits = self.model(ids, mask, cache=prefill, position_ids=positions).logits  # (u, P, vocab)
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
        if keep:
            self._join([requests[n] for n in keep], prefill, index[keep], real, tokens[keep], positions[:, -1] + 1)
        return finished

    def _join(
        self, joining: list[Request], prefill: DecoderCache, select: Tensor, real: Tensor, first: Tensor, after: Tensor
    ) -> None:
        """Put ``joining`` in free rows: their prefill rows ``select`` (u,) of ``prefill`` (its
        key mask ``real`` (·, P) and the positions ``after`` (·,) that follow), their first tokens
        ``first`` (u,)."""
        length = real.shape[1]
        free = [row for row, r in enumerate(self.rows) if r is None]
        slot = 0 if self.cache is None else len(self.cache)
        if len(free) < len(joining) or slot < length:
            self._layout(len(self) + len(joining), max(length, self._span()))
            free = [row for row, r in enumerate(self.rows) if r is None]
            slot = len(self.cache)  # type: ignore[arg-type]
        assert self.cache is not None and self.key_mask is not None
        assert self.last is not None and self.next_position is not None
        place = torch.tensor(free[: len(joining)], device=select.device)
        self.cache.put(place, prefill, select, length, slot, len(self.rows))
        self.key_mask[place] = False
        self.key_mask[place, slot - length : slot] = real.index_select(0, select)
        self.last[place] = first
        self.next_position[place, 0] = after.index_select(0, select)
        for row, request in zip(free, joining, strict=False):
            self.rows[row] = request

    def _span(self) -> int:
        """The positions the rows read: from the first any row reads to the write position."""
        if self.key_mask is None or self.cache is None or not len(self):
            return 0
        occupied = torch.tensor([r is not None for r in self.rows], device=self.key_mask.device)
        read = self.key_mask[occupied].any(dim=0)  # (capacity,)
        return len(self.cache) - int(read.long().argmax()) if bool(read.any()) else 0

    def _compiled(self, args: tuple[Any, ...]) -> bool:
        """Whether this step runs compiled: always with ``compile=True``, never with False; with
        ``"auto"``, once the layout's step is in memory or kept on the disk."""
        if self.compile != "auto":
            return bool(self.compile)
        if compiled.ready(decoder_only_step, self.model, *args):
            return True
        assert self.cache is not None
        layout = (self.model.__dict__.get("_step_signature"), len(self.rows), self.cache.capacity)
        if layout not in self._kept:
            path = self._kept[layout] = compiled.kept_at(decoder_only_step, self.model, *args)
            asked = self.precompile or background.for_model(self.model)
            if path is not None and not path.is_file() and asked is not None:
                asked("batch", *layout[1:])
        path = self._kept[layout]
        return path is not None and path.is_file()

    def prepare(self, rows: int, capacity: int) -> None:
        """Ready the step of the layout of ``rows`` rows and ``capacity`` positions (with
        ``compile=True``: load it, or compile and keep it), by one request's step in a batch laid
        out so: a background compile (:mod:`attnkit.generation.background`)."""
        if rows != compiled.bucket(rows, least=1) or capacity - HEADROOM < 1:
            raise ValueError(f"no continuous batch is laid out as {rows} rows of {capacity} positions")
        self._layout(rows, capacity - HEADROOM)
        assert self.cache is not None
        if self.cache.capacity != capacity:
            raise ValueError(f"no continuous batch is laid out as {rows} rows of {capacity} positions")
        self.add([Request([self.model.config.bos_token_id or 0], 2)])
        self.step()

    def _layout(self, rows: int, length: int) -> None:
        """Lay the batch out anew: room for ``rows`` requests (a power of two), the requests now in
        it first, their last ``length`` positions right-aligned at the new write position, and a
        capacity (a power of two) with room for ``HEADROOM`` steps after them."""
        rows = compiled.bucket(rows, least=1)
        capacity = compiled.bucket(length + HEADROOM, self.model.config.max_len)
        device = self.model.embeddings.token.weight.device
        cache = self.model.decoder.new_cache(capacity=capacity, fixed=True)
        key_mask = torch.zeros(rows, capacity, dtype=torch.bool, device=device)
        last = torch.zeros(rows, dtype=torch.long, device=device)
        next_position = torch.zeros(rows, 1, dtype=torch.long, device=device)
        kept = [row for row, r in enumerate(self.rows) if r is not None]
        if kept:
            assert self.cache is not None and self.key_mask is not None
            assert self.last is not None and self.next_position is not None
            old, new = torch.tensor(kept, device=device), torch.arange(len(kept), device=device)
            slot, keep = len(self.cache), min(length, len(self.cache))
            cache.put(new, self.cache, old, keep, length, rows)
            key_mask[: len(kept), length - keep : length] = self.key_mask[old, slot - keep : slot]
            last[: len(kept)], next_position[: len(kept)] = self.last[old], self.next_position[old]
        elif self.compile:  # a new batch: the model's structure may have changed since its last (the steps' key)
            compiled.check_weights(self.model)
        assert cache.clock is not None
        cache.clock.begin(length, device)
        self.rows = [self.rows[row] for row in kept] + [None] * (rows - len(kept))
        self.cache, self.key_mask, self.last, self.next_position = cache, key_mask, last, next_position

    @torch.no_grad()
    def step(self) -> list[Request]:
        """Feed every row its newest token and choose the next; returns the requests that
        finished at this step (they have left the batch)."""
        if not len(self):
            return []
        assert self.cache is not None and self.cache.clock is not None
        if len(self.cache) == self.cache.capacity:  # the write position at the end: a new layout
            self._layout(len(self.rows), self._span())
        assert self.cache is not None and self.cache.clock is not None and self.cache.clock.slot is not None
        assert self.key_mask is not None and self.last is not None and self.next_position is not None
        self.key_mask.index_fill_(1, self.cache.clock.slot, True)  # the new position is real for every row
        args = (self.last[:, None], self.cache, self.key_mask, self.next_position)
        if self._compiled(args):
            logits = compiled.call(decoder_only_step, self.model, *args)
        else:
            logits = decoder_only_step(self.model, *args)
        self.cache.clock.advance()
        occupied = [row for row, r in enumerate(self.rows) if r is not None]
        index = torch.tensor(occupied, device=logits.device)
        self.next_position[index] += 1  # a free row stays at position 0
        requests = self.requests
        tokens, scores = self._choose(logits.index_select(0, index), requests)
        self.last[index] = tokens
        finished = [r for r, t, s in zip(requests, tokens.tolist(), scores, strict=True) if r.add(t, s)]
        self.remove(finished)
        return finished

    def remove(self, requests: Sequence[Request]) -> None:
        """Take ``requests`` out of the batch (finished, or their client went away): their rows
        are freed, and the batch laid out smaller where it fits in half its rows or capacity."""
        gone = {id(r) for r in requests}
        freed = [row for row, r in enumerate(self.rows) if r is not None and id(r) in gone]
        if not freed:
            return
        for row in freed:
            self.rows[row] = None
        if not len(self):
            self._empty()
            return
        assert self.key_mask is not None and self.cache is not None and self.next_position is not None
        self.key_mask[freed] = False
        self.next_position[freed] = 0
        span = self._span()
        if 2 * len(self) <= len(self.rows) or 2 * (span + HEADROOM) <= self.cache.capacity:
            self._layout(len(self), span)

    def _choose(self, logits: Tensor, requests: Sequence[Request]) -> tuple[Tensor, list[Scored | None]]:
        """Each row's next token (N,) from its ``logits`` (N, vocab): greedy rows together,
        sampled rows each with its own choice, after each row's adjustment; and each token's
        score where its request asks for one."""
        chosen_from = logits
        if any(r.adjust is not None for r in requests):
            chosen_from = logits.to(torch.float32, copy=True)  # the scores are the raw logits'
            for row, request in enumerate(requests):
                if request.adjust is not None:
                    try:
                        chosen_from[row] = request.adjust(chosen_from[row], request.tokens)
                    except ValueError as err:  # this request's failure (its grammar's), not the batch's
                        request.error = str(err)
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
