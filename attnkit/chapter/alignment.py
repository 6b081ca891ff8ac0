"""Cross-attention as alignment (chapter §The Complete Encoder–Decoder Architecture: "a
learned, differentiable alignment between input and output"): the weights with which each
target token's query reads the source, drawn from a real forward pass of a trained model."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import Tensor

from attnkit.generation import generate_with_defaults
from attnkit.models.core import EncoderDecoderModel


def pieces(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """Readable token labels: each token's text as the tokenizer's decoder writes it, a leading
    space shown as ▁. Byte-level BPE stores "Éternel" as "ĠÃīternel"; decoded, it reads
    "▁Éternel". A token holding only part of a character's bytes keeps its stored form."""
    labels = []
    for i in ids:
        text = tokenizer.decode([i], skip_special_tokens=False)
        labels.append(tokenizer.id_to_token(i) if "\ufffd" in text or not text else text.replace(" ", "▁"))
    return labels


@torch.no_grad()
def cross_attention(
    model: EncoderDecoderModel, tokenizer: Tokenizer, source: str, max_new_tokens: int = 64
) -> tuple[list[str], list[str], Tensor]:
    """Translate ``source`` greedily, then run the teacher-forced forward pass on the result
    and return (source tokens, target tokens, weights (N layers, H, T, S)) of every decoder
    layer's cross-attention [eq:att-alpha]."""
    cfg = model.config
    src = [*tokenizer.encode(source, add_special_tokens=False).ids, cfg.eos_token_id]
    input_ids = torch.tensor([src])
    out = generate_with_defaults(model, input_ids, max_new_tokens=max_new_tokens)[0].tolist()  # model.generate
    target = out[1 : out.index(cfg.eos_token_id, 1) + 1] if cfg.eos_token_id in out[1:] else out[1:]
    decoder_input = torch.tensor([[cfg.decoder_start_token_id, *target[:-1]]])
    record = model(input_ids, decoder_input_ids=decoder_input, output_attentions=True).attentions["decoder"]
    weights = torch.stack([w[0] for w in record["cross"]])  # N × (B=1, H, T, S) -> (N, H, T, S)
    return pieces(tokenizer, src), pieces(tokenizer, target), weights


def plot_alignment(
    model: EncoderDecoderModel, tokenizer: Tokenizer, source: str, path: str | Path, layer: int = -1
) -> Path:
    """Save a heatmap of one layer's cross-attention averaged over heads, beside each head's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    src, tgt, weights = cross_attention(model, tokenizer, source)
    heads = weights[layer]  # (H, T, S)
    H = heads.shape[0]
    fig = plt.figure(figsize=(6 + 2.2 * min(H, 4), 0.32 * len(tgt) + 3))
    grid = fig.add_gridspec(max(1, (H + 3) // 4), 1 + min(H, 4), width_ratios=[3] + [1] * min(H, 4))
    ax = fig.add_subplot(grid[:, 0])
    ax.imshow(heads.mean(0).numpy(), cmap="viridis", aspect="auto", vmin=0.0)
    ax.set_xticks(range(len(src)), src, rotation=70, fontsize=8)
    ax.set_yticks(range(len(tgt)), tgt, fontsize=8)
    ax.set_xlabel("source (keys)")
    ax.set_ylabel("target (queries)")
    ax.set_title(f"cross-attention, layer {layer % weights.shape[0] + 1}, mean of {H} heads")
    for h in range(H):
        sub = fig.add_subplot(grid[h // 4, 1 + h % 4])
        sub.imshow(heads[h].numpy(), cmap="viridis", aspect="auto", vmin=0.0)
        sub.set_title(f"head {h + 1}", fontsize=8)
        sub.set_xticks([])
        sub.set_yticks([])
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
