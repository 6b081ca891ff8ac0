"""GPT (decoder only, causal): the GPT-2 wiring (Radford et al., 2019)."""

from __future__ import annotations

import math

from torch import nn

from attnkit.config import ModelConfig
from attnkit.models import build
from attnkit.models.core import DecoderOnlyModel, Embeddings, LMHead
from attnkit.nn import Decoder


def build_gpt(cfg: ModelConfig) -> DecoderOnlyModel:
    """Token + learned positions, N decoder layers without cross-attention, all causal
    [eq:att-mask], trained on next-token prediction [tab:att-families].

    Deviations from the chapter's block, as GPT-2 has them: pre-LN [eq:att-addnorm] with a
    final LayerNorm, tanh-approximated GELU in the FFN, and the head tied to the token
    embedding.

    With ``labels`` (and ``lm_head=False``), a sequence classifier reads the last token's state
    instead of a vocabulary head: GPT-1's transfer to classification (Radford et al., 2018), as
    ``GPT2ForSequenceClassification`` (a linear layer without bias).
    """
    token = nn.Embedding(cfg.vocab_size, cfg.d_model)
    head = LMHead(cfg.d_model, cfg.vocab_size, tied=cfg.tie_embeddings, bias=cfg.logits_bias) if cfg.lm_head else None
    model = DecoderOnlyModel(
        cfg,
        embeddings=Embeddings(token, build.absolute_positions(cfg), cfg.scale_embeddings, cfg.dropout),
        decoder=Decoder(build.decoder_layers(cfg, cross_attention=False), build.final_norm(cfg)),
        head=head,
        classifier=build.classifier(cfg, bias=False),
    )
    build.init_normal(model, cfg.init_std)
    # GPT-2: the projections that write into the residual stream start with σ/√(2N), so the
    # stream's variance does not grow with depth (2 such writes per layer).
    for layer in model.decoder.layers:
        for linear in (layer.self_attn.w_o, layer.ffn.w_2):
            nn.init.normal_(linear.weight, std=cfg.init_std / math.sqrt(2 * cfg.n_layers))
    return model
