"""The three assemblies every family is made of: encoder–decoder (the Transformer of
[fig:att-transformer], T5, Marian), decoder only (GPT) and encoder only (BERT).

A family's build function (``models/<family>.py``) picks the blocks; these classes only
wire them and speak the ecosystem's API at the edge (``attention_mask`` 1 = real token).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.data.padding import length_sorted, pad_right
from attnkit.data.tokenizer import encode_with_specials, fit
from attnkit.models.io import save_pretrained
from attnkit.nn import Decoder, DecoderCache, Encoder, padding_mask
from attnkit.nn.layers import AttentionRecord
from attnkit.nn.vocab_loss import VocabLoss, target_rows, vocab_cross_entropy

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass
class ModelOutput:
    """What every model returns. ``last_hidden_state`` is the decoder's for encoder–decoder
    models; ``attentions`` maps "encoder"/"decoder" to ``{"self"|"cross": [per-layer weights]}``
    when asked for; ``vocab_loss`` replaces ``logits`` when ``target_ids`` were given."""

    last_hidden_state: Tensor
    logits: Tensor | None = None
    vocab_loss: VocabLoss | None = None
    encoder_last_hidden_state: Tensor | None = None
    pooler_output: Tensor | None = None
    attentions: dict[str, AttentionRecord] = field(default_factory=dict)


class Embeddings(nn.Module):
    """Token embedding (×√d_model when ``scale``), plus absolute positions and segment
    embeddings when the family has them, then an optional LayerNorm and dropout."""

    def __init__(
        self,
        token: nn.Embedding,
        positions: nn.Module | None,
        scale: bool,
        dropout: float,
        segments: nn.Embedding | None = None,
        norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.token, self.positions, self.segments, self.norm = token, positions, segments, norm
        self.scale = math.sqrt(token.embedding_dim) if scale else 1.0
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        ids: Tensor,
        offset: int = 0,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """``ids`` (B, T) at positions ``offset ..``, or at ``position_ids`` (B, T) when given
        (left-padded batches count positions from each row's first real token)."""
        x = self.token(ids) * self.scale  # (B, T) -> (B, T, d_model)
        if self.positions is not None and position_ids is not None:
            x = x + self.positions.at(position_ids)  # + (B, T, d_model)
        elif self.positions is not None:
            x = x + self.positions(ids.shape[1], offset)  # + (T, d_model)
        if self.segments is not None:
            x = x + self.segments(torch.zeros_like(ids) if token_type_ids is None else token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


class LMHead(nn.Module):
    """The pre-softmax linear map of [fig:att-transformer] ("Linear", then softmax).

    Tied heads reuse the token embedding passed to :meth:`forward`; ``transform`` runs first
    (BERT's dense + GELU + LayerNorm); ``scale`` multiplies the hidden state (T5 v1.0's
    d_model^-0.5); ``bias`` adds a per-token logit bias (Marian, BERT).
    """

    def __init__(
        self,
        d_model: int,
        vocab_size: int,
        tied: bool,
        bias: bool,
        scale: float = 1.0,
        transform: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.transform = transform
        self.weight = None if tied else nn.Parameter(torch.empty(vocab_size, d_model))
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None
        self.scale = scale

    def forward(self, h: Tensor, embedding: Tensor) -> Tensor:
        if self.transform is not None:
            h = self.transform(h)
        weight = embedding if self.weight is None else self.weight
        return F.linear(h * self.scale, weight, self.bias)  # (B, T, d_model) -> (B, T, vocab)

    def loss(self, h: Tensor, embedding: Tensor, target_ids: Tensor, label_smoothing: float = 0.0) -> VocabLoss:
        """The cross entropy of the logits :meth:`forward` would give against ``target_ids``
        (B, T) — ``IGNORE_INDEX`` where a position has none —, computed on the positions that
        have a target only, without the (B, T, vocab) logits (:mod:`attnkit.nn.vocab_loss`)."""
        if target_ids.shape != h.shape[:-1]:
            raise ValueError(f"target_ids has shape {tuple(target_ids.shape)}, expected {tuple(h.shape[:-1])}")
        rows, targets = target_rows(h, target_ids)  # (N, d_model), (N,)
        if self.transform is not None:
            rows = self.transform(rows)
        weight = embedding if self.weight is None else self.weight
        if (
            not torch.compiler.is_compiling()
            and targets.numel()
            and not 0 <= int(targets.min()) <= int(targets.max()) < weight.shape[0]
        ):
            raise ValueError(f"target_ids must be in [0, {weight.shape[0]}) or IGNORE_INDEX (-100)")
        return vocab_cross_entropy(rows * self.scale, weight, self.bias, targets, label_smoothing)


def check_ids(name: str, ids: Tensor, vocab_size: int) -> None:
    """Token ids must be a (batch, seq_len) integer tensor inside the vocabulary."""
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be a (batch, seq_len) integer tensor, got {shape}")
    if ids.shape[1] == 0:
        raise ValueError(f"{name} is empty (seq_len 0); pass at least one token")
    if ids.shape[0] == 0:
        raise ValueError(f"{name} is empty (batch size 0); pass at least one sequence")
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must hold int64 token ids, got dtype {ids.dtype}; pass {name}.long()")
    if torch.compiler.is_compiling():
        return  # reading the values would break the compiled graph; the embedding lookup still refuses them
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} holds token id {bad}, outside the vocabulary [0, {vocab_size})")


def _key_mask(attention_mask: Tensor | None, ids: Tensor, name: str, cached: int = 0) -> Tensor | None:
    """The (B, 1, 1, T) key mask of an ``attention_mask`` covering ``cached`` earlier positions
    and ``ids``; None when every key is real, so attention runs without a mask."""
    if attention_mask is None:
        return None
    expected = (ids.shape[0], cached + ids.shape[1])
    if tuple(attention_mask.shape) != expected:
        raise ValueError(f"{name} has shape {tuple(attention_mask.shape)}, expected {expected}")
    mask = padding_mask(attention_mask)  # (B, T) -> (B, 1, 1, T)
    return None if bool(mask.all()) else mask


class Model(nn.Module):
    """What the three assemblies share: the config, parameter counting and saving."""

    config: ModelConfig
    # What loading sets, where the model has it: the directory's tokenizer, the format its
    # weights are held in (attnkit.models.weights) and its generation_config.json's options.
    tokenizer: Tokenizer | None = None
    weights: str = "fp32"
    generation_defaults: Mapping[str, Any] = MappingProxyType({})
    # What generate() hands over to: attnkit.generation's front, which sets itself here when it
    # is imported. Decoding sits above the models and imports them; they never import it.
    decoding: ClassVar[Callable[..., Tensor] | None] = None

    def num_parameters(self) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())

    def text_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids with the model's tokenizer, its specials included ([CLS] ... [SEP]),
        cut to the model's positions keeping the last one."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, got one str; wrap it in a list")
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer to read text with; load it from a directory that has one")
        return [fit(row, self.config.max_len) for row in encode_with_specials(self.tokenizer, list(texts))]

    @torch.no_grad()
    def batched(
        self, ids: Sequence[Sequence[int]], batch_size: int = 32
    ) -> Iterator[tuple[Tensor, ModelOutput, Tensor]]:
        """Forward passes over token-id rows in batches of similar length (little padding), of
        a model of one stack (BERT, GPT): each batch's row indices (B,), its output and its
        attention mask (B, T)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        device = self.embeddings.token.weight.device  # type: ignore[attr-defined]
        for batch in length_sorted([len(row) for row in ids], batch_size):
            input_ids, mask = pad_right([ids[i] for i in batch], self.config.pad_token_id or 0, device)
            yield torch.tensor(batch, device=device), self(input_ids, mask), mask

    def head_weight(self) -> Tensor:
        """The (vocab, d_model) matrix of the vocabulary projection: the head's own, or the
        token embedding it is tied to."""
        head: LMHead = self.head  # type: ignore[assignment]
        if head.weight is not None:
            return head.weight
        embeddings = getattr(self, "decoder_embeddings", None) or self.embeddings  # type: ignore[attr-defined]
        return embeddings.token.weight

    def sequence_logits(self, h: Tensor, pooled: Tensor | None, attention_mask: Tensor | None, ids: Tensor) -> Tensor:
        """The classifier's logits (B, labels) of the sequences whose last states are ``h``
        (B, T, d_model): it reads the pooled first token (``classifier_pooling="cls"``), the real
        tokens' mean, or the last real token's state."""
        from attnkit.nn.pooling import last_pool, mean_pool

        pooling = self.config.classifier_pooling
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask
        if pooling == "mean":
            vector = mean_pool(h, mask)
        elif pooling == "last":
            vector = last_pool(h, mask)
        else:
            vector = h[:, 0] if pooled is None else pooled
        return self.classifier(vector)  # type: ignore[operator]

    def headless(self) -> str | None:
        """What this model is when it has no vocabulary head to generate with ("a classifier
        (labels [...])" or "without a vocabulary head"); None when it has one."""
        if self.config.labels:
            return f"a classifier (labels {list(self.config.labels)})"
        return "without a vocabulary head" if getattr(self, "head", True) is None else None

    def head_output(
        self, h: Tensor, embedding: Tensor, target_ids: Tensor | None, label_smoothing: float
    ) -> tuple[Tensor | None, VocabLoss | None]:
        """The head's logits of ``h`` (B, T, d_model), or, with ``target_ids``, their loss alone."""
        head: LMHead | None = self.head  # type: ignore[assignment]
        if target_ids is None:
            return (None if head is None else head(h, embedding)), None
        if head is None:
            raise ValueError("target_ids need a vocabulary head; this model has none (build it with lm_head=True)")
        return None, head.loss(h, embedding, target_ids, label_smoothing)

    def generate(self, input_ids: Tensor, attention_mask: Tensor | None = None, **options: Any) -> Tensor:
        """Greedy, beam or sampled decoding with the KV cache: see :func:`attnkit.generation.generate`.
        Options left out take the checkpoint's ``generation_config.json`` values
        (``self.generation_defaults``), as ``transformers`` does."""
        if Model.decoding is None:
            raise RuntimeError(
                "model.generate decodes with attnkit.generation, which is not imported; import it first "
                "(attnkit.from_pretrained and attnkit.build_model do)"
            )
        return Model.decoding(self, input_ids, attention_mask, **options)

    def save_pretrained(self, path: str | Path, overwrite: bool = False) -> None:
        """Write attnkit's own directory: ``config.json`` and ``model.safetensors``."""
        save_pretrained(self, path, overwrite=overwrite)


class EncoderDecoderModel(Model):
    """Encoder, decoder and head of [fig:att-transformer] (Transformer, T5, Marian)."""

    def __init__(
        self,
        config: ModelConfig,
        embeddings: Embeddings,
        decoder_embeddings: Embeddings,
        encoder: Encoder,
        decoder: Decoder,
        head: LMHead,
    ) -> None:
        super().__init__()
        self.config = config
        self.embeddings, self.decoder_embeddings = embeddings, decoder_embeddings
        self.encoder, self.decoder, self.head = encoder, decoder, head

    def encode(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, record: AttentionRecord | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Source ids (B, S) -> memory (B, S, d_model) and its key mask (B, 1, 1, S)."""
        check_ids("input_ids", input_ids, self.config.vocab_size)
        mask = _key_mask(attention_mask, input_ids, "attention_mask")
        return self.encoder(self.embeddings(input_ids), mask, record), mask

    def decode(
        self,
        decoder_input_ids: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        record: AttentionRecord | None = None,
        head: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Target ids (B, T) (only the new ones when ``cache`` holds the rest) -> hidden
        states and logits (B, T, vocab); the hidden states alone (logits None) without
        ``head``. ``decoder_attention_mask`` covers all positions."""
        check_ids("decoder_input_ids", decoder_input_ids, self.config.vocab_size)
        offset = len(cache) if cache is not None else 0
        mask = _key_mask(decoder_attention_mask, decoder_input_ids, "decoder_attention_mask", offset)
        x = self.decoder_embeddings(decoder_input_ids, offset)
        h = self.decoder(x, memory, mask=mask, memory_mask=memory_mask, cache=cache, record=record)
        return h, self.head(h, self.decoder_embeddings.token.weight) if head else None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        output_attentions: bool = False,
        target_ids: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> ModelOutput:
        """``target_ids`` (B, T): what each decoder position must predict (``IGNORE_INDEX`` where
        nothing), as given — not shifted, unlike ``transformers``' ``labels`` —; the output then
        holds their ``vocab_loss`` (with ε = ``label_smoothing``) instead of the logits."""
        if decoder_input_ids is None:
            raise ValueError(
                "decoder_input_ids is required: the target shifted right, starting with "
                f"decoder_start_token_id={self.config.decoder_start_token_id}"
            )
        enc_record: AttentionRecord | None = {} if output_attentions else None
        dec_record: AttentionRecord | None = {} if output_attentions else None
        memory, memory_mask = self.encode(input_ids, attention_mask, enc_record)
        h, _ = self.decode(
            decoder_input_ids, memory, memory_mask, decoder_attention_mask, record=dec_record, head=False
        )
        logits, loss = self.head_output(h, self.decoder_embeddings.token.weight, target_ids, label_smoothing)
        attentions = {"encoder": enc_record, "decoder": dec_record} if output_attentions else {}
        return ModelOutput(h, logits, loss, encoder_last_hidden_state=memory, attentions=attentions)


class DecoderOnlyModel(Model):
    """A causal decoder without cross-attention, with a vocabulary head (GPT) or a sequence
    classifier reading its last token."""

    def __init__(
        self,
        config: ModelConfig,
        embeddings: Embeddings,
        decoder: Decoder,
        head: LMHead | None,
        classifier: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.embeddings, self.decoder, self.head, self.classifier = embeddings, decoder, head, classifier

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        output_attentions: bool = False,
        cache: DecoderCache | None = None,
        position_ids: Tensor | None = None,
        target_ids: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> ModelOutput:
        """``input_ids`` (B, T), only the new ones when ``cache`` holds the rest;
        ``attention_mask`` covers all positions, cached and new; ``position_ids`` (B, T)
        overrides the positions ``len(cache) ..`` (for left-padded prompts). ``target_ids``
        (B, T): the next token of each position (``IGNORE_INDEX`` where none), already shifted,
        unlike ``transformers``' ``labels``; the output then holds their ``vocab_loss``."""
        check_ids("input_ids", input_ids, self.config.vocab_size)
        if position_ids is not None and position_ids.shape != input_ids.shape:
            raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}, expected {tuple(input_ids.shape)}")
        record: AttentionRecord | None = {} if output_attentions else None
        offset = len(cache) if cache is not None else 0
        mask = _key_mask(attention_mask, input_ids, "attention_mask", offset)
        x = self.embeddings(input_ids, offset, position_ids=position_ids)
        h = self.decoder(x, mask=mask, cache=cache, record=record, positions=position_ids)
        logits, loss = self.head_output(h, self.embeddings.token.weight, target_ids, label_smoothing)
        if self.classifier is not None:  # (B, labels): the sequence's class logits
            logits = self.sequence_logits(h, None, attention_mask, input_ids)
        return ModelOutput(h, logits, loss, attentions={"decoder": record} if record is not None else {})


class EncoderOnlyModel(Model):
    """A bidirectional encoder, with an optional pooler and vocabulary head (BERT)."""

    def __init__(
        self,
        config: ModelConfig,
        embeddings: Embeddings,
        encoder: Encoder,
        head: LMHead | None,
        pooler: nn.Module | None,
        classifier: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.embeddings, self.encoder, self.head, self.pooler = embeddings, encoder, head, pooler
        self.classifier = classifier

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        output_attentions: bool = False,
        target_ids: Tensor | None = None,
    ) -> ModelOutput:
        """``target_ids`` (B, T): the original token at each masked position (``IGNORE_INDEX``
        elsewhere); the output then holds their ``vocab_loss`` instead of the MLM logits."""
        check_ids("input_ids", input_ids, self.config.vocab_size)
        if token_type_ids is not None:
            types = max(self.config.type_vocab_size, 1)
            check_ids("token_type_ids", token_type_ids, types)
        record: AttentionRecord | None = {} if output_attentions else None
        mask = _key_mask(attention_mask, input_ids, "attention_mask")
        h = self.encoder(self.embeddings(input_ids, token_type_ids=token_type_ids), mask, record)
        logits, loss = self.head_output(h, self.embeddings.token.weight, target_ids, 0.0)
        pooled = self.pooler(h[:, 0]) if self.pooler is not None else None
        if self.classifier is not None:  # (B, labels): the sequence's class logits
            logits = self.sequence_logits(h, pooled, attention_mask, input_ids)
        attentions = {"encoder": record} if record is not None else {}
        return ModelOutput(h, logits, loss, pooler_output=pooled, attentions=attentions)

    @torch.no_grad()
    def encode(self, texts: Sequence[str], normalize: bool = True, batch_size: int = 32) -> Tensor:
        """Sentence embeddings (N, d_model) of ``texts`` with the model's tokenizer: the last
        hidden states averaged over each text's real tokens (as sentence-transformers pools
        all-MiniLM-L6-v2), unit length with ``normalize`` (dot products are then cosines).
        Texts longer than the model's positions are cut there."""
        return self.embed_ids(self.text_ids(texts), normalize, batch_size)

    @torch.no_grad()
    def embed_ids(self, ids: Sequence[Sequence[int]], normalize: bool = True, batch_size: int = 32) -> Tensor:
        """:meth:`encode` of texts given as token ids (each with its specials), (N, d_model)."""
        from attnkit.nn.pooling import mean_pool
        from attnkit.nn.pooling import normalize as unit

        vectors = torch.zeros(len(ids), self.config.d_model, device=self.embeddings.token.weight.device)
        for batch, out, mask in self.batched(ids, batch_size):
            vectors[batch] = mean_pool(out.last_hidden_state.float(), mask)
        return unit(vectors) if normalize else vectors
