"""T5 (encoder–decoder, text-to-text, span corruption) (Raffel et al., 2020)."""

from __future__ import annotations

from torch import nn

from attnkit.config import ModelConfig
from attnkit.models import build
from attnkit.models.core import Embeddings, EncoderDecoderModel, LMHead
from attnkit.nn import Decoder, Encoder


def build_t5(cfg: ModelConfig) -> EncoderDecoderModel:
    """Both halves of [fig:att-transformer] [tab:att-families], with T5's deviations, each
    where the config sets it:

    - no absolute positions: a learned relative bias per head added to the scores, computed
      once per stack (bidirectional in the encoder, causal in the decoder) and shared by
      every layer;
    - RMSNorm, pre-LN [eq:att-addnorm] with a final norm per stack, no biases anywhere;
    - no 1/√d_k in [eq:att-sdpa]: the initialisation below folds it into W^Q;
    - v1.0: ReLU FFN and a tied head fed d_model^-0.5 × the hidden state (``head_scale``);
      v1.1: gated-GELU FFN and an untied head.
    """
    token = nn.Embedding(cfg.vocab_size, cfg.d_model)
    model = EncoderDecoderModel(
        cfg,
        embeddings=Embeddings(token, None, scale=False, dropout=cfg.dropout),
        decoder_embeddings=Embeddings(token, None, scale=False, dropout=cfg.dropout),
        encoder=Encoder(build.encoder_layers(cfg), build.final_norm(cfg), build.relative_bias(cfg, True)),
        decoder=Decoder(
            build.decoder_layers(cfg, cross_attention=True), build.final_norm(cfg), build.relative_bias(cfg, False)
        ),
        head=LMHead(
            cfg.d_model,
            cfg.vocab_size,
            cfg.tie_embeddings,
            cfg.logits_bias,
            scale=cfg.d_model**-0.5 if cfg.head_scale else 1.0,
        ),
    )
    _init_t5(model, cfg)
    return model


def _init_t5(model: EncoderDecoderModel, cfg: ModelConfig) -> None:
    """T5's initialisation (Mesh TensorFlow): each matrix N(0, fan_in^-0.5), with W^Q's further
    divided by √d_k, which stands in for the missing 1/√d_k (with ``scale_scores`` the scores
    are scaled instead, and W^Q is drawn as W^K); the embedding N(0, 1).

    The untied head (v1.1) is a matrix like the others: N(0, d_model^-0.5), so that the final
    RMSNorm's output (each element ~1) gives logits of std ~1 and an untrained model a loss
    near ln V. ``transformers``' T5 draws it N(0, 1) instead: logits of std √d_model (16 at
    d_model 256) and an initial loss of tens of nats, which Adam spends its first thousands of
    steps undoing (its pull request 26441). The tied head (v1.0) reuses the N(0, 1) embedding
    and scales the hidden state by d_model^-0.5 instead (``head_scale``)."""
    d_k = cfg.d_k or cfg.d_model // cfg.n_heads
    nn.init.normal_(model.embeddings.token.weight, std=1.0)
    if model.head.weight is not None:
        nn.init.normal_(model.head.weight, std=cfg.d_model**-0.5)
    for stack in (model.encoder, model.decoder):
        nn.init.normal_(stack.position_bias.embedding.weight, std=cfg.d_model**-0.5)
        for layer in stack.layers:
            for attn in filter(None, (layer.self_attn, getattr(layer, "cross_attn", None))):
                nn.init.normal_(attn.w_q.weight, std=cfg.d_model**-0.5 * (1 if cfg.scale_scores else d_k**-0.5))
                nn.init.normal_(attn.w_k.weight, std=cfg.d_model**-0.5)
                nn.init.normal_(attn.w_v.weight, std=cfg.d_model**-0.5)
                nn.init.normal_(attn.w_o.weight, std=(cfg.n_heads * d_k) ** -0.5)
            for w in filter(None, (layer.ffn.w_1, layer.ffn.w_3)):
                nn.init.normal_(w.weight, std=cfg.d_model**-0.5)
            nn.init.normal_(layer.ffn.w_2.weight, std=cfg.d_ff**-0.5)
