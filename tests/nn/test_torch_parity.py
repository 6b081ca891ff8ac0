"""attnkit's attention, layers and stacks against PyTorch's own implementations.

Each test builds a ``torch.nn`` module, copies its weights into the attnkit one and compares
whole output tensors (fp32, eval mode, dropout 0). Conventions that differ and are converted
here: torch's masks say True = ignore, attnkit's say True = may attend; torch packs
W_q, W_k, W_v into one ``in_proj_weight``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attnkit.nn import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    LayerNorm,
    MultiHeadAttention,
    causal_mask,
)

D_MODEL, N_HEADS, D_FF = 32, 4, 64
ATOL, RTOL = 1e-5, 1e-5


# --------------------------------------------------------------------------- weight copying


@torch.no_grad()
def copy_mha(src: nn.MultiheadAttention, dst: MultiHeadAttention) -> None:
    """Copy ``torch.nn.MultiheadAttention`` into attnkit's: in_proj rows are [W_q; W_k; W_v]."""
    w_q, w_k, w_v = src.in_proj_weight.chunk(3, dim=0)
    b_q, b_k, b_v = src.in_proj_bias.chunk(3, dim=0)
    for lin, w, b in ((dst.w_q, w_q, b_q), (dst.w_k, w_k, b_k), (dst.w_v, w_v, b_v)):
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    dst.w_o.weight.copy_(src.out_proj.weight)
    dst.w_o.bias.copy_(src.out_proj.bias)


@torch.no_grad()
def copy_linear(src: nn.Linear, dst: nn.Linear) -> None:
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


@torch.no_grad()
def copy_norm(src: nn.LayerNorm, dst: LayerNorm) -> None:
    dst.gamma.copy_(src.weight)
    dst.beta.copy_(src.bias)


def copy_encoder_layer(src: nn.TransformerEncoderLayer, dst: EncoderLayer) -> None:
    copy_mha(src.self_attn, dst.self_attn)
    copy_linear(src.linear1, dst.ffn.w_1)
    copy_linear(src.linear2, dst.ffn.w_2)
    copy_norm(src.norm1, dst.add_norm_self.norm)
    copy_norm(src.norm2, dst.add_norm_ffn.norm)


def copy_decoder_layer(src: nn.TransformerDecoderLayer, dst: DecoderLayer) -> None:
    copy_mha(src.self_attn, dst.self_attn)
    copy_mha(src.multihead_attn, dst.cross_attn)
    copy_linear(src.linear1, dst.ffn.w_1)
    copy_linear(src.linear2, dst.ffn.w_2)
    copy_norm(src.norm1, dst.add_norm_self.norm)
    copy_norm(src.norm2, dst.add_norm_cross.norm)
    copy_norm(src.norm3, dst.add_norm_ffn.norm)


@torch.no_grad()
def randomize_norms(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.LayerNorm):
            m.weight.copy_(1.0 + 0.3 * torch.randn_like(m.weight))
            m.bias.copy_(0.3 * torch.randn_like(m.bias))


def perturb(module: nn.Module) -> nn.Module:
    """Random weights everywhere (projections, biases, LayerNorm gamma/beta), then eval mode.

    Default inits leave biases at 0 and gamma/beta at 1/0, and deep-copied stack layers
    identical; random values make a wrong copy or a swapped layer show.
    """
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                continue
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() == 1 else p.shape[-1] ** -0.5))
    randomize_norms(module)
    return module.eval()


def key_padding(lengths: list[int], m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(torch's (B, m) True = ignore, attnkit's (B, 1, 1, m) True = may attend)."""
    keep = torch.arange(m)[None, :] < torch.tensor(lengths)[:, None]
    return ~keep, keep[:, None, None, :]


# --------------------------------------------------------------------------- MultiHeadAttention


def _mha_pair() -> tuple[nn.MultiheadAttention, MultiHeadAttention]:
    torch.manual_seed(0)
    ref = perturb(nn.MultiheadAttention(D_MODEL, N_HEADS, dropout=0.0, batch_first=True))
    ours = MultiHeadAttention(D_MODEL, N_HEADS).eval()
    copy_mha(ref, ours)
    return ref, ours


@pytest.mark.parametrize("case", ["self", "cross", "key_padding", "causal_bool", "causal_float"])
@torch.no_grad()
def test_mha_matches_torch_multihead_attention(case: str) -> None:
    ref, ours = _mha_pair()
    torch.manual_seed(1)
    B, n, m = 3, 7, 11
    x = torch.randn(B, n, D_MODEL)
    memory = torch.randn(B, m, D_MODEL) if case in ("cross", "key_padding") else None
    src = x if memory is None else memory

    ref_kwargs: dict[str, torch.Tensor] = {}
    our_mask = None
    if case == "key_padding":
        ref_kwargs["key_padding_mask"], our_mask = key_padding([11, 4, 1], m)
    elif case == "causal_bool":
        ref_kwargs["attn_mask"] = ~causal_mask(n)  # torch: True = masked
        our_mask = causal_mask(n)
    elif case == "causal_float":
        ref_kwargs["attn_mask"] = torch.zeros(n, n).masked_fill(~causal_mask(n), float("-inf"))
        our_mask = causal_mask(n)

    # the output alone: torch's fast path vs attnkit's fused path
    expected, _ = ref(x, src, src, need_weights=False, **ref_kwargs)
    got, none = ours(x, memory=memory, mask=our_mask)
    assert none is None
    assert_close(got, expected, atol=ATOL, rtol=RTOL)

    # the per-head weights: torch's math path vs attnkit's math path
    expected, expected_w = ref(x, src, src, need_weights=True, average_attn_weights=False, **ref_kwargs)
    got, got_w = ours(x, memory=memory, mask=our_mask, return_weights=True)
    assert got_w is not None
    assert got_w.shape == (B, N_HEADS, n, src.shape[1])
    assert_close(got, expected, atol=ATOL, rtol=RTOL)
    assert_close(got_w, expected_w, atol=ATOL, rtol=RTOL)


# --------------------------------------------------------------------------- layers


@pytest.mark.parametrize("with_padding", [False, True], ids=["nomask", "padding"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["postLN", "preLN"])
@torch.no_grad()
def test_encoder_layer_matches_torch(norm_first: bool, activation: str, with_padding: bool) -> None:
    torch.manual_seed(0)
    ref = perturb(
        nn.TransformerEncoderLayer(
            D_MODEL,
            N_HEADS,
            D_FF,
            dropout=0.0,
            activation=activation,
            batch_first=True,
            norm_first=norm_first,
        )
    )
    ours = EncoderLayer(D_MODEL, N_HEADS, D_FF, dropout=0.0, norm_first=norm_first, activation=activation).eval()
    copy_encoder_layer(ref, ours)

    B, T = 3, 9
    x = torch.randn(B, T, D_MODEL)
    if with_padding:
        ignore, keep = key_padding([9, 5, 2], T)  # no fully padded sequence
        expected = ref(x, src_key_padding_mask=ignore)
        got = ours(x, mask=keep)
    else:
        expected = ref(x)
        got = ours(x)
    assert_close(got, expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("norm_first", [False, True], ids=["postLN", "preLN"])
@torch.no_grad()
def test_decoder_layer_matches_torch(norm_first: bool) -> None:
    torch.manual_seed(0)
    ref = perturb(
        nn.TransformerDecoderLayer(
            D_MODEL,
            N_HEADS,
            D_FF,
            dropout=0.0,
            batch_first=True,
            norm_first=norm_first,
        )
    )
    ours = DecoderLayer(D_MODEL, N_HEADS, D_FF, dropout=0.0, norm_first=norm_first).eval()
    copy_decoder_layer(ref, ours)

    B, n, m = 3, 6, 8
    x, memory = torch.randn(B, n, D_MODEL), torch.randn(B, m, D_MODEL)
    ignore, keep = key_padding([8, 3, 5], m)
    expected = ref(
        x,
        memory,
        tgt_mask=~causal_mask(n),
        memory_key_padding_mask=ignore,
    )
    got = ours(x, memory, mask=causal_mask(n), memory_mask=keep)
    assert_close(got, expected, atol=ATOL, rtol=RTOL)


# --------------------------------------------------------------------------- stacks


@torch.no_grad()
def test_stacks_match_torch() -> None:
    torch.manual_seed(0)
    N = 2
    ref_enc = perturb(
        nn.TransformerEncoder(
            nn.TransformerEncoderLayer(D_MODEL, N_HEADS, D_FF, dropout=0.0, batch_first=True, norm_first=True),
            num_layers=N,
            norm=nn.LayerNorm(D_MODEL),
            enable_nested_tensor=False,
        )
    )
    ref_dec = perturb(
        nn.TransformerDecoder(
            nn.TransformerDecoderLayer(D_MODEL, N_HEADS, D_FF, dropout=0.0, batch_first=True, norm_first=True),
            num_layers=N,
            norm=nn.LayerNorm(D_MODEL),
        )
    )
    # the deep-copied layers must differ, or a mix-up of layer order would go unnoticed
    assert not torch.equal(ref_enc.layers[0].linear1.weight, ref_enc.layers[1].linear1.weight)

    enc_layers = [EncoderLayer(D_MODEL, N_HEADS, D_FF, dropout=0.0, norm_first=True) for _ in range(N)]
    dec_layers = [DecoderLayer(D_MODEL, N_HEADS, D_FF, dropout=0.0, norm_first=True) for _ in range(N)]
    for src, dst in zip(ref_enc.layers, enc_layers, strict=True):
        copy_encoder_layer(src, dst)
    for src, dst in zip(ref_dec.layers, dec_layers, strict=True):
        copy_decoder_layer(src, dst)
    enc_norm, dec_norm = LayerNorm(D_MODEL), LayerNorm(D_MODEL)
    copy_norm(ref_enc.norm, enc_norm)
    copy_norm(ref_dec.norm, dec_norm)
    encoder = Encoder(enc_layers, final_norm=enc_norm).eval()
    decoder = Decoder(dec_layers, final_norm=dec_norm).eval()

    B, S, T = 3, 10, 7
    src, tgt = torch.randn(B, S, D_MODEL), torch.randn(B, T, D_MODEL)
    ignore, keep = key_padding([10, 6, 3], S)

    expected_memory = ref_enc(src, src_key_padding_mask=ignore)
    memory = encoder(src, mask=keep)
    assert_close(memory, expected_memory, atol=ATOL, rtol=RTOL)

    expected = ref_dec(tgt, expected_memory, tgt_mask=~causal_mask(T), memory_key_padding_mask=ignore)
    got = decoder(tgt, memory, memory_mask=keep)  # attnkit's decoder is always causal
    assert_close(got, expected, atol=ATOL, rtol=RTOL)
