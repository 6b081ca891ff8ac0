"""A model run one position at a time with its key/value cache, behind one interface for
decoder-only and encoder–decoder models: :meth:`IncrementalModel.start` then
:meth:`IncrementalModel.step`, each returning next-token logits, and
:meth:`IncrementalModel.reorder` to re-rank or drop rows between steps."""

from __future__ import annotations

import logging
import time
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.data.padding import positions
from attnkit.generation import background, compiled
from attnkit.kernels import gemm
from attnkit.models.core import DecoderOnlyModel, EncoderDecoderModel, Model
from attnkit.nn import padding_mask
from attnkit.nn.cache import DecoderCache

log = logging.getLogger(__name__)


def decoder_only_step(
    model: DecoderOnlyModel, tokens: Tensor, cache: DecoderCache, key_mask: Tensor | None, positions: Tensor
) -> Tensor:
    """One new token per row (N, 1) at ``positions`` (N, 1) through a decoder-only model with its
    ``cache``; ``key_mask`` (N, len(cache) + 1), or (N, capacity) with a fixed cache: the keys
    each row may read (None: all). Returns the next-token logits (N, vocab)."""
    mask = None if key_mask is None else padding_mask(key_mask)  # (N, 1, 1, seen)
    x = model.embeddings(tokens, position_ids=positions)
    h = model.decoder(x, mask=mask, cache=cache, positions=positions)
    return model.head(h, model.embeddings.token.weight)[:, -1]


def encoder_decoder_step(
    model: EncoderDecoderModel, tokens: Tensor, cache: DecoderCache, memory: Tensor, memory_mask: Tensor | None
) -> Tensor:
    """One new target token per row (N, 1) through the decoder, attending to ``memory``
    (N / g, S, d) (an example's g rows share theirs); returns the next-token logits (N, vocab)."""
    if cache.fixed_step:  # the position is a tensor, not an int
        assert cache.clock is not None and cache.clock.slot is not None
        x = model.decoder_embeddings(tokens, position_ids=cache.clock.slot.expand(tokens.shape[0], 1))
    else:
        x = model.decoder_embeddings(tokens, len(cache))
    h = model.decoder(x, memory, memory_mask=memory_mask, cache=cache)
    return model.head(h, model.decoder_embeddings.token.weight)[:, -1]


class IncrementalModel:
    """``copies`` rows per example (beam search keeps k hypotheses of each), decoded with the
    KV cache: the source is encoded once ([alg:att-decode], line 1), every step feeds only the
    new token and reads the earlier keys and values from the cache.

    The step is lean: the tokens it feeds are the decoder's own choices, so they are not
    validated again; the key mask and positions of decoder-only rows live in buffers sized for
    the whole decode, so a step slices them instead of allocating.

    ``compile``: every step after the first runs one compiled fixed-shape graph
    (:mod:`attnkit.generation.compiled`) over a cache of fixed capacity (a power of two that
    holds the decode, within the model's context), and an encoder–decoder's source is padded to
    a power of two, so that later calls of other lengths reuse the graph. The rows keep their
    places: beam search re-ranks an example's beams through the cache's history table
    (:class:`~attnkit.nn.cache.FixedBeamKVCache`), and an example that is done stays in the
    step, its rows fed a filler token and their logits left out (:meth:`reorder`, :meth:`step`).

    ``"auto"`` (decoder-only, one path per row, a model
    :func:`~attnkit.generation.compiled.can_compile`): eager steps, their seconds paid into the
    layout's :class:`~attnkit.generation.compiled.Account`, until readying the step is due; then
    the cache moves into fixed buffers and the later steps run compiled. Otherwise ``"auto"`` is
    eager: batched beams of int8 or int4 weights take PyTorch's int8 GEMM eagerly, which a
    compiled step cannot trace.
    """

    # Sets up one decode: the cache's layout for the batch, its beams and its prompt, which the
    # compiled step and every decoding algorithm then share; each branch is one source layout.
    def __init__(
        self,
        model: Model,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        copies: int = 1,
        max_new_tokens: int = 64,
        compile: bool | Literal["auto"] = False,
    ) -> None:
        self.model, self.copies = model, copies
        self.encoder_decoder = model.config.is_encoder_decoder
        prompt = 1 if self.encoder_decoder else input_ids.shape[1]
        self.longest = prompt + max_new_tokens - 1  # what the cache holds: the last token chosen is never fed
        self.account: compiled.Account | None = None
        checked = False  # the model checked for the step, its structure taken (check_weights)
        if compile == "auto":
            compile = False
            if copies == 1 and not self.encoder_decoder and compiled.can_compile(model):
                self._check_for_step()
                checked = True
                unmasked = attention_mask is None or bool(attention_mask.bool().all())
                layout = (model.__dict__["_step_signature"], input_ids.shape[0], self._capacity(), unmasked)
                self.account = compiled.account(model, layout)
                compile = self.account.due()
                self.account = None if compile else self.account
        self.compiled = compile
        rows = input_ids.shape[0] * copies
        if compile is True and compiled.loses_the_gemm(model, rows):
            log.warning(
                "compile=True at %d rows of quantised weights: the compiled step multiplies through attnkit's block "
                "kernel, not the int8 GEMM eager decoding uses from %d rows on, and is slower here; decode eagerly "
                "(compile=False, --no-compile) or in batches of fewer rows", rows, gemm.MANY_ROWS,
            )  # fmt: skip
        self.live: Tensor | None = None  # compiled beams: the step's example of each one still searched
        if compile:
            if not checked:
                self._check_for_step()
            self.cache = self._fixed_cache()
            capacity = self.cache.capacity
            if copies > 1:
                self.live = torch.arange(input_ids.shape[0], device=input_ids.device)
                self.filler = torch.zeros(rows, 1, dtype=torch.long, device=input_ids.device)
        else:
            # Room for 32 new tokens, then the cache doubles as far as the decode really goes: a step
            # attends over the whole buffer (KVCache.whole), so it is kept within twice what is filled.
            capacity = prompt + max_new_tokens
            self.cache = model.decoder.new_cache(capacity=prompt + min(max_new_tokens, 32), groups=copies)
        self.key_mask: Tensor | None = None
        if isinstance(model, EncoderDecoderModel):
            # One memory row per example, not per copy: cross-attention lets an example's rows
            # share its memory's keys and values (MultiHeadAttention groups them).
            self.memory, self.memory_mask = model.encode(input_ids, attention_mask)  # (B, S, d), (B, 1, 1, S)
            if compile:
                self.memory, self.memory_mask = _pad_memory(self.memory, self.memory_mask, model.config)
            start = model.config.decoder_start_token_id
            self.prompt = torch.full((rows, 1), start, dtype=torch.long, device=input_ids.device)
        else:
            self.prompt = input_ids.repeat_interleave(copies, dim=0)
            real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
            real = real.repeat_interleave(copies, dim=0)  # (B·copies, T)
            # Left-padded prompts count positions from each row's first real token; every new
            # position is real, so rows without padding need no key mask at all.
            self.positions = positions(real)  # (B·copies, T)
            self.next_position = self.positions[:, -1:] + 1  # (B·copies, 1)
            if not bool(real.all()):
                self.key_mask = torch.ones(rows, capacity, dtype=torch.bool, device=real.device)
                self.key_mask[:, :prompt] = real

    def start(self) -> Tensor:
        """Feed the prompt (decoder-only) or the start token (encoder–decoder); return the
        logits (N, vocab) of the token after it."""
        if self.encoder_decoder:
            return self._decode(self.prompt)
        mask = None if self.key_mask is None else self.key_mask[:, : self.prompt.shape[1]]
        return self.model(self.prompt, mask, cache=self.cache, position_ids=self.positions).logits[:, -1]

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one new token per row (N,); return the logits (N, vocab) of the next one."""
        tokens = tokens[:, None]  # (N,) -> (N, 1)
        if self.compiled:
            return self._compiled_step(tokens)
        if self.encoder_decoder:
            return self._decode(tokens)
        start = time.perf_counter()
        seen = len(self.cache) + 1
        mask = None if self.key_mask is None else self.key_mask[:, :seen]
        positions, self.next_position = self.next_position, self.next_position + 1
        logits = decoder_only_step(self.model, tokens, self.cache, mask, positions)  # type: ignore[arg-type]
        if self.account is not None:
            self.account.paid += time.perf_counter() - start
            if self.account.paid >= compiled.LOAD_SECONDS:
                self._move_when_due()
        return logits

    def _capacity(self) -> int:
        return compiled.bucket(self.longest, self.model.config.max_len)

    def _check_for_step(self) -> None:
        """Make the model ready for a compiled step of this decode's capacity and take its
        structure for the steps' key (:func:`~attnkit.generation.compiled.check_weights`), once a
        decode: the signature walks every module and weight (2.3 ms on GPT-2)."""
        model = self.model
        embeddings = model.decoder_embeddings if isinstance(model, EncoderDecoderModel) else model.embeddings
        if embeddings.positions is not None:
            embeddings.positions.cover(self._capacity())  # first: a grown table is a new constant
        compiled.check_weights(model)

    def _fixed_cache(self) -> DecoderCache:
        """An empty cache of the compiled step's fixed capacity (the model checked for it)."""
        return self.model.decoder.new_cache(capacity=self._capacity(), groups=self.copies, fixed=True)

    def _move_when_due(self) -> None:
        """``"auto"``: move the decode onto the compiled step once readying it is due (at the first
        look, the cache laid out as the step's to name its file)."""
        assert self.account is not None
        moved = None
        if not self.account.looked:
            self.account.looked = True
            moved = self._moved()
            tokens = torch.empty_like(self.next_position)  # (N, 1), as a step's tokens
            path = compiled.kept_at(decoder_only_step, self.model, tokens, *moved, self.next_position)
            asked = background.for_model(self.model)
            if path is not None and not path.is_file() and asked is not None:
                asked("generate", tokens.shape[0], moved[0].capacity, moved[1] is not None)
                self.account.background = True
            self.account.path = path
        if self.account.due():
            self.cache, self.key_mask = moved or self._moved()
            self.compiled, self.account = True, None

    def _moved(self) -> tuple[DecoderCache, Tensor | None]:
        """The cache and key mask so far, copied into the compiled step's fixed layout."""
        fixed, filled = self._fixed_cache(), len(self.cache)
        rows = torch.arange(self.next_position.shape[0], device=self.next_position.device)
        fixed.put(rows, self.cache, rows, filled, filled, rows.shape[0])
        assert fixed.clock is not None
        fixed.clock.begin(filled, rows.device)
        if self.key_mask is None:
            return fixed, None
        mask = self.key_mask.new_ones(rows.shape[0], fixed.capacity)  # (N, capacity): the new positions are real
        kept = min(fixed.capacity, self.key_mask.shape[1])
        mask[:, :kept] = self.key_mask[:, :kept]
        return fixed, mask

    def _compiled_step(self, tokens: Tensor) -> Tensor:
        assert self.cache.clock is not None
        tokens = tokens.contiguous()  # a column of a larger table would be a graph of its own strides
        dropped = self.live is not None and self.live.shape[0] * self.copies < self.filler.shape[0]
        if dropped:  # the rows of the examples still searched, among all the step's rows
            self.filler.view(-1, self.copies)[self.live] = tokens.view(-1, self.copies)
            tokens = self.filler
        if self.cache.history is not None:
            self.cache.history.stamp(self.cache.clock.filled)  # outside the graph: the step reads the table
        if self.encoder_decoder:
            args = (tokens, self.cache, self.memory, self.memory_mask)
            logits = compiled.call(encoder_decoder_step, self.model, *args)
        else:
            args = (tokens, self.cache, self.key_mask, self.next_position)  # type: ignore[assignment]
            logits = compiled.call(decoder_only_step, self.model, *args)
            self.next_position = self.next_position + 1
        self.cache.clock.advance()
        if dropped:
            assert self.live is not None
            return logits.view(-1, self.copies, logits.shape[-1])[self.live].flatten(0, 1)
        return logits

    def _decode(self, tokens: Tensor) -> Tensor:
        return encoder_decoder_step(self.model, tokens, self.cache, self.memory, self.memory_mask)  # type: ignore[arg-type]

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (N',): beam search re-ranking hypotheses within each example,
        and dropping every row of the examples that are done (N' < N). An example's rows stay
        in that example, so the memory and its cross-attention keys/values, shared by them,
        are only narrowed to the examples that remain.

        Compiled, the rows keep their places: the beams of the examples that remain are re-ranked
        in the cache's history, and the examples dropped only leave :attr:`live`."""
        if self.compiled:
            self._rerank(index)
            return
        examples = None
        if index.shape[0] != self.prompt.shape[0]:
            examples = index.view(-1, self.copies)[:, 0] // self.copies  # (B',): the examples that remain
            self.prompt = self.prompt.index_select(0, index)
        self.cache.reorder(index, examples)
        if self.encoder_decoder and examples is not None:
            self.memory = self.memory.index_select(0, examples)
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, examples)
        if not self.encoder_decoder:
            self.next_position = self.next_position.index_select(0, index)
            if self.key_mask is not None:
                self.key_mask = self.key_mask.index_select(0, index)

    def _rerank(self, index: Tensor) -> None:
        if self.live is None:
            raise ValueError(
                "a compiled one-path decode keeps its rows in place (its shapes are fixed); reorder() needs "
                "compile=False"
            )
        k = self.copies
        parents = index.view(-1, k)  # (B', k): rows of the examples searched so far, in their order
        if index.shape[0] != self.prompt.shape[0]:
            self.live = self.live[parents[:, 0] // k]  # (B',): the step's example of each that remains
            self.prompt = self.prompt.index_select(0, index)
        own = torch.arange(k, device=index.device).repeat(self.filler.shape[0] // k, 1)  # (B, k): as they are
        own[self.live] = parents % k
        self.cache.reorder((own + torch.arange(own.shape[0], device=index.device)[:, None] * k).view(-1))


def prepare(model: DecoderOnlyModel, rows: int, capacity: int, masked: bool) -> None:
    """Ready (load, or compile and keep) the compiled step of a one-path decode of ``rows`` rows
    over a cache of ``capacity`` positions, with a key mask (padded prompts) or not, by decoding
    one step of that layout: a background compile (:mod:`attnkit.generation.background`)."""
    if capacity != compiled.bucket(capacity, model.config.max_len):
        raise ValueError(f"no decode has a cache of {capacity} positions; capacities are powers of two or the context")
    ids = torch.full((rows, 2), model.config.bos_token_id or 0, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[0, 0] = 0 if masked else 1  # a left-padded row: the step reads a key mask
    incremental = IncrementalModel(model, ids, mask, max_new_tokens=capacity - 1, compile=True)
    incremental.step(incremental.start().argmax(-1))


def _pad_memory(memory: Tensor, mask: Tensor | None, config: ModelConfig) -> tuple[Tensor, Tensor]:
    """The encoded sources (B, S, d) and their key mask (B, 1, 1, S) padded on the right to a
    power of two within the context (masked), so that a compiled step reads a memory of one of a
    few lengths. The encoder itself runs on the sources as they are: padded first, a batch of
    32 Marian-sized sources of up to 41 tokens cost half as much again in the encoder."""
    B, S, _ = memory.shape
    mask = memory.new_ones(B, 1, 1, S, dtype=torch.bool) if mask is None else mask
    extra = compiled.bucket(S, config.max_len, least=16) - S
    return F.pad(memory, (0, 0, 0, extra)), F.pad(mask, (0, extra), value=False)
