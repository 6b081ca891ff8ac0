"""BERT (encoder only, bidirectional) with its masked-LM head and pooler (Devlin et al., 2019)."""

from __future__ import annotations

from torch import nn

from attnkit.config import ModelConfig
from attnkit.models import build
from attnkit.models.core import Embeddings, EncoderOnlyModel, LMHead
from attnkit.nn import Encoder, LayerNorm
from attnkit.nn.feedforward import ACTIVATIONS


def build_bert(cfg: ModelConfig) -> EncoderOnlyModel:
    """Token + learned position + segment embeddings, LayerNorm, then N post-LN encoder
    layers [eq:att-addnorm] with GELU in the FFN [eq:att-ffn]; trained by masked language
    modelling [tab:att-families].

    The MLM head (``lm_head``) is BERT's: dense + GELU + LayerNorm, then the decoder tied to
    the token embedding, plus a per-token bias. The pooler is a tanh dense layer over the
    first ([CLS]) position. With ``labels``, a sequence classifier (dropout + linear, as
    ``BertForSequenceClassification``) reads the pooled sequence instead of a vocabulary head.
    """
    token = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_token_id)
    segments = nn.Embedding(cfg.type_vocab_size, cfg.d_model) if cfg.type_vocab_size else None
    embeddings = Embeddings(
        token, build.absolute_positions(cfg), cfg.scale_embeddings, cfg.dropout, segments, build.embedding_norm(cfg)
    )
    head = None
    if cfg.lm_head:
        transform = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.d_model), _Activation(cfg.activation), LayerNorm(cfg.d_model, cfg.eps)
        )
        head = LMHead(cfg.d_model, cfg.vocab_size, cfg.tie_embeddings, cfg.logits_bias, transform=transform)
    pooler = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_model), nn.Tanh()) if cfg.pooler else None
    encoder = Encoder(build.encoder_layers(cfg), build.final_norm(cfg))
    model = EncoderOnlyModel(cfg, embeddings, encoder, head, pooler, build.classifier(cfg))
    build.init_normal(model, cfg.init_std)
    return model


class _Activation(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.fn = ACTIVATIONS[name]

    def forward(self, x):
        return self.fn(x)
