"""The causal mask (chapter §The causal mask): [eq:att-mask] M and the masked attention
[eq:att-masked] of a randomly initialised GPT on a real sentence. The weights above the
diagonal are exactly zero, and replacing the tokens from position t on leaves every output
before t unchanged: the past does not see the future. A control runs the same model's first
attention layer without the mask, where it does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from attnkit.chapter.report import Context, Section, pyplot, save
from attnkit.config import preset
from attnkit.models.gpt import build_gpt
from attnkit.nn.masks import causal_mask

# The chapter's labels this experiment shows (docs/chapter.md's figure column reads them).
LABELS = ("eq:att-mask", "eq:att-masked", "eq:att-alpha")

SENTENCE = "In the beginning God created the heavens and the earth."
# gpt-tiny's initialisation (std 0.02) gives near-uniform weights; a wider one gives a pattern to look at
INIT_STD = 0.1


def words(sentence: str) -> list[str]:
    """Words and punctuation marks, in order."""
    return re.findall(r"\w+|[^\w\s]", sentence)


def future_changes(
    forward: Callable[[Tensor], Tensor], ids: Tensor, vocab_size: int, trials: int, generator: torch.Generator
) -> Tensor:
    """``D[t, p]``: the largest change of ``forward``'s output at position p over ``trials``
    random replacements of the tokens at positions >= t (every replaced token differs from the
    original). ``ids`` (1, T); ``forward`` maps (B, T) ids to (B, T, d). Returns ``(T, T)``;
    row 0 is left at zero (nothing before position 0 to compare)."""
    T = ids.shape[1]
    reference = forward(ids.expand(trials, T))  # (trials, T, d), batched like the replacements
    changes = torch.zeros(T, T)
    for t in range(1, T):
        replaced = ids.repeat(trials, 1)  # (1, T) -> (trials, T)
        shift = torch.randint(1, vocab_size, (trials, T - t), generator=generator)
        replaced[:, t:] = (replaced[:, t:] + shift) % vocab_size
        changes[t] = (forward(replaced) - reference).abs().amax(dim=(0, 2))  # (trials, T, d) -> (T,)
    return changes


def _figure(tokens: list[str], mask: Tensor, weights: Tensor, changes: Tensor) -> Any:
    from matplotlib.colors import ListedColormap

    plt = pyplot()
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(19, 6.2))
    T = len(tokens)
    left.imshow(mask.numpy(), cmap=ListedColormap(["#eeeeee", "#93c47d"]), vmin=0, vmax=1)
    for i in range(T):
        for j in range(T):
            left.text(j, i, "0" if mask[i, j] else "−∞", ha="center", va="center", fontsize=8)
    left.set_title("[eq:att-mask] M from attnkit.nn.masks.causal_mask\n(green: may attend, 0; grey: blocked, −∞)")
    image = middle.imshow(weights.numpy(), cmap="viridis", vmin=0.0)
    for i in range(T):
        for j in range(T):
            value = float(weights[i, j])
            label = "0" if value == 0.0 else f"{value:.2f}"
            middle.text(j, i, label, ha="center", va="center", fontsize=6, color="white" if value < 0.5 else "black")
    fig.colorbar(image, ax=middle, fraction=0.046)
    middle.set_title("[eq:att-masked] α, layer 1, head 1\n(above the diagonal: exactly 0)")
    shown = torch.where(changes > 0, changes.clamp_min(1e-12).log10(), torch.nan)  # exact zeros: blank
    cmap = plt.get_cmap("magma").with_extremes(bad="white")
    image = right.imshow(shown[1:].numpy(), cmap=cmap, extent=(-0.5, T - 0.5, T - 0.5, 0.5))
    fig.colorbar(image, ax=right, fraction=0.046, label="log10 max |Δ hidden state|")
    right.set_title("change of the output at p when the tokens ≥ t are replaced\n(white: exactly 0)")
    right.set_xlabel("output position p")
    right.set_ylabel("first replaced position t")
    right.set_yticks(range(1, T), [f"{t}: {tokens[t]}" for t in range(1, T)], fontsize=8)
    right.set_xticks(range(T), tokens, rotation=60, fontsize=8)
    for ax in (left, middle):
        ax.set_xticks(range(T), tokens, rotation=60, fontsize=8)
        ax.set_yticks(range(T), tokens, fontsize=8)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
    fig.suptitle(f"causal self-attention of a randomly initialised gpt-tiny on “{SENTENCE}”", y=1.02)
    fig.tight_layout()
    return fig


# One experiment, read top to bottom as its report section reads (the mask, its weights, the
# future-replacement test, the figure); the pieces that repeat are the functions above.
def run(ctx: Context) -> Section:
    """Mask, weights, and the future-replacement test on the sentence's words."""
    trials = 2 if ctx.quick else 16
    tokens = words(SENTENCE)
    vocab = {w: i + 1 for i, w in enumerate(dict.fromkeys(tokens))}  # 0 is gpt-tiny's pad/bos
    ids = torch.tensor([[vocab[w] for w in tokens]])  # (1, T)
    T = ids.shape[1]
    with torch.random.fork_rng():  # the initialisation draws from the global generator
        torch.manual_seed(ctx.seed)
        model = build_gpt(preset("gpt-tiny", dropout=0.0, init_std=INIT_STD)).eval()
    generator = torch.Generator().manual_seed(ctx.seed)
    mask = causal_mask(T)
    with torch.no_grad():
        record = model(ids, output_attentions=True).attentions["decoder"]["self"]
        weights = torch.stack([w[0] for w in record])  # N × (1, H, T, T) -> (N, H, T, T)
        size = model.config.vocab_size
        fused = future_changes(lambda x: model(x).last_hidden_state, ids, size, trials, generator)
        readable = future_changes(
            lambda x: model(x, output_attentions=True).last_hidden_state, ids, size, trials, generator
        )
        attention = model.decoder.layers[0].self_attn
        unmasked = future_changes(lambda x: attention(model.embeddings(x))[0], ids, size, trials, generator)

    past = torch.ones(T, T, dtype=torch.bool).tril(-1)  # (t, p) with p < t
    past[0] = False
    above = float(weights[..., ~mask].max())
    rows_err = float((weights.sum(-1) - 1).abs().max())
    numbers = {
        "tokens": tokens,
        "layers": weights.shape[0],
        "heads": weights.shape[1],
        "init_std": INIT_STD,
        "trials": trials,
        "above_diagonal_max": above,
        "rows_sum_max_error": rows_err,
        "future_change_max": float(fused[past].max()),
        "future_change_max_math_path": float(readable[past].max()),
        "replaced_change_min": float(fused.diagonal()[1:].min()),
        "future_change_max_without_mask": float(unmasked[past].max()),
    }
    figures = [save(_figure(tokens, mask, weights[0, 0], fused), ctx, "att-causal-mask.png")]
    text = f"""
The sentence "{SENTENCE}" split into its {T} words and marks, each given an id, went through attnkit's `gpt-tiny`
({numbers["layers"]} layers × {numbers["heads"]} heads, randomly initialised with std {INIT_STD}, no dropout),
whose self-attention adds the causal mask M of [eq:att-mask] built by `attnkit.nn.masks.causal_mask`
[eq:att-masked]. Over every layer and head, the largest weight above the diagonal was {above!r} — the blocked
entries are exact zeros, not small numbers — and the rows summed to 1 within {rows_err:.1e} [eq:att-alpha].

The past does not see the future: replacing the tokens from position t on ({trials} random replacements for
each t = 1..{T - 1}) changed the final hidden state at positions before t by at most
{numbers["future_change_max"]!r} on the fused path (the one training uses) and
{numbers["future_change_max_math_path"]!r} on the path that returns the weights, while the output at the first
replaced position always changed (by at least {numbers["replaced_change_min"]:.3g}). As a control, the first
layer's attention run without the mask on the same embeddings changed the earlier positions by up to
{numbers["future_change_max_without_mask"]:.3g}.
"""
    return Section(
        title="The causal mask",
        labels=LABELS,
        text=text,
        figures=figures,
        numbers=numbers,
    )
