"""A model run one position at a time with its key/value cache, behind one interface for
decoder-only and encoder–decoder models: :meth:`IncrementalModel.start` then
:meth:`IncrementalModel.step`, each returning next-token logits, and
:meth:`IncrementalModel.reorder` to re-rank or drop rows between steps."""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.generation.batches import positions
from attnkit.models.core import DecoderOnlyModel, EncoderDecoderModel, Model
from attnkit.nn import padding_mask
from attnkit.nn.cache import DecoderCache


def decoder_only_step(
    model: DecoderOnlyModel, tokens: Tensor, cache: DecoderCache, key_mask: Tensor | None, positions: Tensor
) -> Tensor:
    """One new token per row (N, 1) at ``positions`` (N, 1) through a decoder-only model with its
    ``cache``; ``key_mask`` (N, len(cache) + 1): the keys each row may read (None: all). Returns
    the next-token logits (N, vocab)."""
    mask = None if key_mask is None else padding_mask(key_mask)  # (N, 1, 1, seen)
    x = model.embeddings(tokens, position_ids=positions)
    h = model.decoder(x, mask=mask, cache=cache, positions=positions)
    return model.head(h, model.embeddings.token.weight)[:, -1]


class IncrementalModel:
    """``copies`` rows per example (beam search keeps k hypotheses of each), decoded with the
    KV cache: the source is encoded once ([alg:att-decode], line 1), every step feeds only the
    new token and reads the earlier keys and values from the cache.

    The step is lean: the tokens it feeds are the decoder's own choices, so they are not
    validated again; the key mask and positions of decoder-only rows live in buffers sized for
    the whole decode, so a step slices them instead of allocating.
    """

    def __init__(
        self, model: Model, input_ids: Tensor, attention_mask: Tensor | None, copies: int = 1, max_new_tokens: int = 64
    ) -> None:
        self.model, self.copies = model, copies
        self.encoder_decoder = model.config.is_encoder_decoder
        prompt = 1 if self.encoder_decoder else input_ids.shape[1]
        # Room for 32 new tokens, then the cache doubles as far as the decode really goes: a step
        # attends over the whole buffer (KVCache.whole), so it is kept within twice what is filled.
        self.cache = model.decoder.new_cache(capacity=prompt + min(max_new_tokens, 32), groups=copies)
        rows = input_ids.shape[0] * copies
        self.key_mask: Tensor | None = None
        if isinstance(model, EncoderDecoderModel):
            # One memory row per example, not per copy: cross-attention lets an example's rows
            # share its memory's keys and values (MultiHeadAttention groups them).
            self.memory, self.memory_mask = model.encode(input_ids, attention_mask)  # (B, S, d), (B, 1, 1, S)
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
                self.key_mask = torch.ones(rows, prompt + max_new_tokens, dtype=torch.bool, device=real.device)
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
        if self.encoder_decoder:
            return self._decode(tokens)
        seen = len(self.cache) + 1
        mask = None if self.key_mask is None else self.key_mask[:, :seen]
        positions, self.next_position = self.next_position, self.next_position + 1
        return decoder_only_step(self.model, tokens, self.cache, mask, positions)  # type: ignore[arg-type]

    def _decode(self, tokens: Tensor) -> Tensor:
        model: EncoderDecoderModel = self.model  # type: ignore[assignment]
        x = model.decoder_embeddings(tokens, len(self.cache))
        h = model.decoder(x, self.memory, memory_mask=self.memory_mask, cache=self.cache)
        return model.head(h, model.decoder_embeddings.token.weight)[:, -1]

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (N',): beam search re-ranking hypotheses within each example,
        and dropping every row of the examples that are done (N' < N). An example's rows stay
        in that example, so the memory and its cross-attention keys/values, shared by them,
        are only narrowed to the examples that remain."""
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
