"""Training-step throughput of attnkit vs transformers on identical weights and batches
(issue: training), and model FLOPs utilisation against this machine's measured matmul peak.

One step = forward, backward and an AdamW update, fp32, on a (batch × seq) batch of random
tokens. Model FLOPs per token ≈ 6 × (non-embedding parameters + tied head) + the attention
matmuls (12 · layers · seq · d_model for a causal decoder, counted in full).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

import attnkit
from attnkit.config import preset
from attnkit.models import build_model
from attnkit.nn.positional import sinusoidal_table
from attnkit.objectives.base import token_loss
from benchmarks.common import Comparison, add_mfu, compare


def matmul_peak(
    n: int = 2048, repeats: int = 10, dtype: torch.dtype = torch.float32, device: torch.device | None = None
) -> float:
    """FLOP/s of the best of ``repeats`` n×n matrix products on ``device`` (the CPU by default):
    the limit for MFU. A CUDA device is synchronised so that the time covers the work."""
    device = device or torch.device("cpu")
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    a @ b
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA runs asynchronously; the CPU does not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _convert(hf: torch.nn.Module) -> torch.nn.Module:
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        return attnkit.from_pretrained(Path(tmp)).train()


def _gpt_pair(d_model: int, layers: int, vocab: int, seq: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    import transformers

    config = transformers.GPT2Config(
        vocab_size=vocab, n_embd=d_model, n_layer=layers, n_head=d_model // 64, n_positions=seq,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    hf = transformers.GPT2LMHeadModel(config).train()
    return _convert(hf), hf


def _marian_pair(d_model: int, layers: int, vocab: int, seq: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    import transformers

    config = transformers.MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=d_model // 64, decoder_attention_heads=d_model // 64, encoder_ffn_dim=4 * d_model,
        decoder_ffn_dim=4 * d_model, max_position_embeddings=seq, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, pad_token_id=vocab - 1, decoder_start_token_id=vocab - 1, eos_token_id=0,
        forced_eos_token_id=0,
    )  # fmt: skip
    hf = transformers.MarianMTModel(config).train()
    return _convert(hf), hf


class TorchTransformer(torch.nn.Module):
    """The chapter's encoder–decoder assembled from ``torch.nn.Transformer``: shared embeddings
    scaled by √d_model plus sinusoidal positions, post-LN layers, an output layer tied to the
    embeddings — the same size and computation as attnkit's ``transformer`` family."""

    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, d_ff: int, max_len: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.register_buffer("positions", sinusoidal_table(max_len, d_model), persistent=False)
        self.core = torch.nn.Transformer(
            d_model, heads, layers, layers, d_ff, dropout=0.0, batch_first=True, norm_first=False
        )
        self.scale = d_model**0.5

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        def embed(ids: torch.Tensor) -> torch.Tensor:
            return self.embed(ids) * self.scale + self.positions[: ids.shape[1]]

        mask = torch.nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        hidden = self.core(embed(src), embed(tgt), tgt_mask=mask, tgt_is_causal=True)
        return hidden @ self.embed.weight.T  # (B, T, d_model) -> (B, T, vocab)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss_fn(model).backward()
    optimizer.step()


def model_flops_per_token(model: torch.nn.Module, seq: int) -> float:
    cfg = model.config
    params = sum(p.numel() for n, p in model.named_parameters() if "positions" not in n)
    stacks = cfg.n_layers + (cfg.decoder_layers * 2 if cfg.is_encoder_decoder else 0)  # cross-attention too
    return 6 * params + 12 * stacks * seq * cfg.d_model


def run(
    repeats: int = 5, small: bool = False, batch: int = 8, seq: int = 128, compile: bool = False
) -> list[Comparison]:
    d_model, layers, vocab = (128, 2, 1000) if small else (512, 6, 8000)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab - 1, (batch, seq), generator=g)
    labels = torch.randint(1, vocab - 1, (batch, seq), generator=g)
    peak = matmul_peak()
    results = []
    ours, hf = _gpt_pair(d_model, layers, vocab, seq)
    opt_ours, opt_hf = (torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (ours, hf))
    results.append(
        compare(
            f"GPT-2-shaped d={d_model} N={layers} train step ({batch}×{seq})",
            lambda: train_step(ours, opt_ours, lambda m: token_loss(m(ids).logits, labels).total / labels.numel()),
            lambda: train_step(hf, opt_hf, lambda m: m(ids, labels=ids).loss),
            work=batch * seq, peer_name="transformers", repeats=repeats,
            compile_ours=ours if compile else None,
        )
    )  # fmt: skip
    add_mfu(results[-1], model_flops_per_token(ours, seq), peak)
    ours, hf = _marian_pair(d_model, layers, vocab, seq)
    opt_ours, opt_hf = (torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (ours, hf))
    results.append(
        compare(
            f"Marian-shaped d={d_model} N={layers}+{layers} train step ({batch}×{seq} → {seq})",
            lambda: train_step(
                ours, opt_ours,
                lambda m: token_loss(m(ids, decoder_input_ids=labels).logits, labels).total / labels.numel(),
            ),
            lambda: train_step(hf, opt_hf, lambda m: m(ids, decoder_input_ids=labels, labels=labels).loss),
            work=batch * seq, peer_name="transformers", repeats=repeats,
            compile_ours=ours if compile else None,
        )
    )  # fmt: skip
    add_mfu(results[-1], model_flops_per_token(ours, seq), peak)
    ours = build_model(preset("transformer-base", vocab_size=vocab, d_model=d_model, n_heads=d_model // 64,
                              d_ff=4 * d_model, n_layers=layers, dropout=0.0, max_len=seq)).train()  # fmt: skip
    torch_model = TorchTransformer(vocab, d_model, d_model // 64, layers, 4 * d_model, seq).train()
    opt_ours, opt_torch = (torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (ours, torch_model))
    results.append(
        compare(
            f"encoder–decoder d={d_model} N={layers}+{layers} train step ({batch}×{seq} → {seq})",
            lambda: train_step(
                ours, opt_ours,
                lambda m: token_loss(m(ids, decoder_input_ids=labels).logits, labels).total / labels.numel(),
            ),
            lambda: train_step(
                torch_model, opt_torch,
                lambda m: torch.nn.functional.cross_entropy(m(ids, labels).flatten(0, 1), labels.flatten()),
            ),
            work=batch * seq, peer_name="torch.nn.Transformer", repeats=repeats,
            compile_ours=ours if compile else None,
        )
    )  # fmt: skip
    add_mfu(results[-1], model_flops_per_token(ours, seq), peak)
    return results
