"""A model run one position at a time with its key/value cache, behind one interface for
decoder-only and encoder–decoder models: :meth:`IncrementalModel.start` then
:meth:`IncrementalModel.step`, each returning next-token logits."""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.models.core import Model


class IncrementalModel:
    """``copies`` rows per example (beam search keeps k hypotheses of each), decoded with the
    KV cache: the source is encoded once ([alg:att-decode], line 1), every step feeds only the
    new token and reads the earlier keys and values from the cache."""

    def __init__(
        self, model: Model, input_ids: Tensor, attention_mask: Tensor | None, copies: int = 1, max_new_tokens: int = 64
    ) -> None:
        self.model = model
        self.encoder_decoder = model.config.is_encoder_decoder
        prompt = 1 if self.encoder_decoder else input_ids.shape[1]
        # Room for up to 256 new tokens at once (no regrowth while decoding the usual requests);
        # a longer one grows the cache by doubling, as far as it really decodes.
        self.cache = model.decoder.new_cache(capacity=prompt + min(max_new_tokens, 256))
        if self.encoder_decoder:
            memory, memory_mask = model.encode(input_ids, attention_mask)
            self.memory = memory.repeat_interleave(copies, dim=0)  # (B, S, d) -> (B·copies, S, d)
            self.memory_mask = None if memory_mask is None else memory_mask.repeat_interleave(copies, dim=0)
            start = model.config.decoder_start_token_id
            self.prompt = torch.full((self.memory.shape[0], 1), start, dtype=torch.long, device=input_ids.device)
        else:
            self.prompt = input_ids.repeat_interleave(copies, dim=0)
            real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
            self.key_mask = real.repeat_interleave(copies, dim=0)  # (B·copies, T): grows by one per step
            # Left-padded prompts count positions from each row's first real token.
            self.positions = (self.key_mask.long().cumsum(-1) - 1).clamp(min=0)
            self.next_position = self.positions[:, -1:] + 1  # (B·copies, 1)

    def start(self) -> Tensor:
        """Feed the prompt (decoder-only) or the start token (encoder–decoder); return the
        logits (N, vocab) of the token after it."""
        if self.encoder_decoder:
            return self._decode(self.prompt)
        return self.model(self.prompt, self.key_mask, cache=self.cache, position_ids=self.positions).logits[:, -1]

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one new token per row (N,); return the logits (N, vocab) of the next one."""
        tokens = tokens[:, None]  # (N,) -> (N, 1)
        if self.encoder_decoder:
            return self._decode(tokens)
        self.key_mask = torch.cat([self.key_mask, self.key_mask.new_ones(tokens.shape)], dim=1)
        positions, self.next_position = self.next_position, self.next_position + 1
        return self.model(tokens, self.key_mask, cache=self.cache, position_ids=positions).logits[:, -1]

    def _decode(self, tokens: Tensor) -> Tensor:
        _, logits = self.model.decode(tokens, self.memory, self.memory_mask, cache=self.cache)
        return logits[:, -1]

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (N,) — beam search re-ranking hypotheses within each example,
        so the memory and its cross-attention keys/values, shared by an example's rows, stay."""
        self.cache.reorder(index, cross_attention=False)
        if not self.encoder_decoder:
            self.key_mask = self.key_mask.index_select(0, index)
            self.next_position = self.next_position.index_select(0, index)
