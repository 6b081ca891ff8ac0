"""The encoder–decoder Transformer of [fig:att-transformer] (Vaswani et al., 2017)."""

from __future__ import annotations

from torch import nn

from attnkit.config import ModelConfig
from attnkit.models import build
from attnkit.models.core import Embeddings, EncoderDecoderModel, LMHead
from attnkit.nn import Decoder, Encoder


def build_transformer(cfg: ModelConfig) -> EncoderDecoderModel:
    """The paper's model: token embeddings ×√d_model plus sinusoidal positions
    [eq:att-pe-sin][eq:att-pe-cos], N post-LN encoder and decoder layers [eq:att-addnorm], and a
    pre-softmax linear map sharing its weights with both embeddings.

    Marian checkpoints are this model with SiLU in the FFN, sines and cosines in halves and a
    logit bias; the config says so, the wiring is the same.
    """
    token = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
    target = token if cfg.tie_embeddings else nn.Embedding(cfg.vocab_size, cfg.d_model, cfg.pad_token_id)
    model = EncoderDecoderModel(
        cfg,
        embeddings=Embeddings(token, build.absolute_positions(cfg), cfg.scale_embeddings, cfg.dropout),
        decoder_embeddings=Embeddings(target, build.absolute_positions(cfg), cfg.scale_embeddings, cfg.dropout),
        encoder=Encoder(build.encoder_layers(cfg), build.final_norm(cfg)),
        decoder=Decoder(build.decoder_layers(cfg, cross_attention=True), build.final_norm(cfg)),
        head=LMHead(cfg.d_model, cfg.vocab_size, tied=cfg.tie_embeddings, bias=cfg.logits_bias),
    )
    # Initialisation of the reference implementation (tensor2tensor): Glorot-uniform matrices,
    # embeddings N(0, d_model^-0.5) so that ×√d_model gives unit scale.
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            nn.init.xavier_uniform_(p)
        elif not name.endswith("gamma"):
            nn.init.zeros_(p)
    for embedding in {token, target}:
        nn.init.normal_(embedding.weight, std=cfg.d_model**-0.5)
    if model.head.weight is not None:
        nn.init.normal_(model.head.weight, std=cfg.d_model**-0.5)
    return model
