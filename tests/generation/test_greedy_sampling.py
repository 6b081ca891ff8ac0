"""Greedy decoding [alg:att-decode] and sampling behind ``generate()``.

* The KV-cache loop gives, token for token, what recomputing the whole forward at every step
  gives (every family, a converted Marian model, left-padded decoder-only batches).
* On weights converted from random transformers models (GPT-2, T5 v1.0/v1.1, Marian) greedy
  ``generate`` equals transformers' ``generate(do_sample=False, num_beams=1)`` token for token,
  with and without EOS cutting rows short.
* Sampling is reproducible with a seed, reduces to greedy at top_k=1 or a tiny temperature,
  top-p keeps the smallest nucleus reaching p, and sampled frequencies follow the softmax.
* Bad settings are ValueErrors naming the value, raised before the model runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.testing import assert_close

import attnkit
from attnkit.config import preset
from attnkit.generation import filter_logits
from attnkit.generation.greedy import sampler

transformers = pytest.importorskip("transformers")

N_NEW = 8  # new tokens per greedy comparison
NO_EOS = 998  # an EOS for the presets' 1000-token vocabulary that these runs never emit (checked by their lengths)


# --------------------------------------------------------------------------- models


# gains (times 1/sqrt(fan_in)) of self-attention, FFN and cross-attention weights per family: wider
# than the initialisation, so that greedy decoding does not settle on one repeated token and a wrong
# cache or position shows. Cross-attention is kept weak in the post-LN Transformer: at full
# strength its output is a function of the source only and repeats one token.
GAINS = {"gpt": (3.0, 1.0, 0.0), "transformer": (3.0, 3.0, 0.3), "t5": (3.0, 1.0, 1.0)}


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Redraw an attnkit model's weights (see GAINS)."""
    attention, ffn, cross = GAINS[model.config.family]
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            gain = 1.0 if "token" in name else ffn if "ffn" in name else cross if "cross_attn" in name else attention
            p.copy_(torch.randn(p.shape, generator=g) * gain / p.shape[-1] ** 0.5)
        elif name.endswith("w_1.bias"):
            p.copy_(torch.randn(p.shape, generator=g) - 1.5)
        else:
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if name.endswith("gamma") else 0.0))
    return model


def preset_model(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return randomize(attnkit.build_model(preset(name, dropout=0.0)), seed).eval()


_CACHE: dict[str, torch.nn.Module] = {}


def shared_model(name: str) -> torch.nn.Module:
    """One randomized model per preset for the whole module (tests only read it)."""
    if name not in _CACHE:
        _CACHE[name] = preset_model(name)
    return _CACHE[name]


@torch.no_grad()
def widen_hf(model: torch.nn.Module, seed: int, gains: tuple[float, float, float]) -> torch.nn.Module:
    """randomize() for a transformers model, the modules found by transformers' names."""
    attention, ffn, cross = gains
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "embed_positions" in name or "relative_attention_bias" in name:  # Marian's sinusoids; T5's bias
            continue
        if p.dim() >= 2:
            fan_in = p.shape[0] if ".h." in name else p.shape[-1]  # GPT-2's Conv1D weights are (in, out)
            if any(k in name for k in ("wte", "wpe", "shared", "embed_tokens", "lm_head")):
                gain = 1.0
            elif any(k in name for k in ("encoder_attn", "EncDecAttention")):
                gain = cross
            elif any(k in name for k in ("mlp", "DenseReluDense", "fc1", "fc2")):
                gain = ffn
            else:
                gain = attention
            p.copy_(torch.randn(p.shape, generator=g) * gain / fan_in**0.5)
        elif name.endswith(("fc1.bias", "c_fc.bias")):
            p.copy_(torch.randn(p.shape, generator=g) - 1.5)
        else:
            norm = "ln_" in name or "layer_norm" in name or "layernorm" in name
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if norm and name.endswith("weight") else 0.0))
    return model


GPT2_VOCAB = 97


def hf_gpt2(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=GPT2_VOCAB, n_embd=32, n_head=4, n_layer=2, n_positions=40, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=GPT2_VOCAB - 1, eos_token_id=GPT2_VOCAB - 1,
    )  # fmt: skip
    return widen_hf(transformers.GPT2LMHeadModel(config), seed, GAINS["gpt"]).eval()


T5_VOCAB = 64


def hf_t5(seed: int, version: str) -> torch.nn.Module:
    """v1.0: ReLU FFN, tied head scaled by d_model^-0.5; v1.1: gated GELU, untied head."""
    v10 = version == "v1.0"
    config = transformers.T5Config(
        vocab_size=T5_VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
        feed_forward_proj="relu" if v10 else "gated-gelu", tie_word_embeddings=v10,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(config)
    if not v10:  # transformers 5 ties the head unless it is a parameter of its own
        model.lm_head.weight = torch.nn.Parameter(torch.empty(T5_VOCAB, 32))
    widen_hf(model, seed, (1.0, 3.0, 1.0))
    with torch.no_grad():
        model.shared.weight.mul_(32**0.5)  # N(0, 1) embeddings, as T5 draws them
        for name, p in model.named_parameters():
            if "relative_attention_bias" in name:
                p.mul_(8.0)  # make positions matter
    return model.eval()


MARIAN_VOCAB, MARIAN_PAD = 64, 63  # Marian's pad token is also its decoder start token


def hf_marian(seed: int) -> torch.nn.Module:
    config = transformers.MarianConfig(
        vocab_size=MARIAN_VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=MARIAN_PAD,
        decoder_start_token_id=MARIAN_PAD, eos_token_id=0, forced_eos_token_id=0, activation_function="swish",
        scale_embedding=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = widen_hf(transformers.MarianMTModel(config), seed, GAINS["transformer"])
    with torch.no_grad():
        model.final_logits_bias.normal_(generator=torch.Generator().manual_seed(seed))
    return model.eval()


SEEDS = [0, 2, 7]  # seeds whose random models emit varied tokens (T5 v1.0 and Marian tend to repeat one)
HF_BUILDERS = {
    "gpt2": hf_gpt2,
    "t5-v1.0": lambda seed: hf_t5(seed, "v1.0"),
    "t5-v1.1": lambda seed: hf_t5(seed, "v1.1"),
    "marian": hf_marian,
}


def converted(hf: torch.nn.Module, path: Path) -> torch.nn.Module:
    """The attnkit model of ``hf``, without the defaults of its generation_config.json (Marian's
    forced end token): the comparisons here are of the search alone, as hf_greedy runs it."""
    hf.save_pretrained(path)
    model = attnkit.from_pretrained(path)
    model.generation_defaults = {}
    return model


# --------------------------------------------------------------------------- references


def random_ids(seed: int, shape: tuple[int, int], vocab: int, low: int = 2) -> Tensor:
    """Ids in [low, vocab - 1): clear of the special ids at either end of the vocabulary."""
    return torch.randint(low, vocab - 1, shape, generator=torch.Generator().manual_seed(seed))


def right_padded_mask(lengths: list[int], width: int) -> Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()


def left_padded_mask(lengths: list[int], width: int) -> Tensor:
    return (torch.arange(width)[None, :] >= width - torch.tensor(lengths)[:, None]).long()


@torch.no_grad()
def recompute_greedy(model: torch.nn.Module, ids: Tensor, mask: Tensor | None, steps: int) -> Tensor:
    """[alg:att-decode] without a cache: the whole prefix through the whole model at every step,
    argmax of the last position. Returns the ``steps`` new tokens (no EOS handling).

    Decoder-only positions follow DecoderOnlyModel.forward's convention for left padding:
    ``position_ids = cumsum(mask) - 1``, clamped at 0 on the padding."""
    cfg = model.config
    if cfg.is_encoder_decoder:
        seq = torch.full((ids.shape[0], 1), cfg.decoder_start_token_id)
        for _ in range(steps):
            logits = model(ids, attention_mask=mask, decoder_input_ids=seq).logits[:, -1]
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
        return seq[:, 1:]
    seq = ids
    for _ in range(steps):
        if mask is None:
            logits = model(seq).logits[:, -1]
        else:
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(seq, attention_mask=mask, position_ids=positions).logits[:, -1]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq[:, ids.shape[1] :]


def end_at_eos(new: Tensor, eos: int, pad: int) -> Tensor:
    """Apply lines 9-10 of [alg:att-decode] to a batch of free-running continuations: tokens
    after a row's first EOS become ``pad``; decoding stops once every row has ended. (Rows are
    independent, so what a finished row is fed afterwards cannot change the others.)"""
    is_eos = (new == eos).long()
    seen = is_eos.cumsum(dim=1)
    out = new.masked_fill(seen - is_eos > 0, pad)
    all_done = (seen > 0).all(dim=0)
    if bool(all_done.any()):
        out = out[:, : int(all_done.nonzero()[0]) + 1]
    return out


def unused_token(new: Tensor, vocab: int) -> int:
    """An id none of the rows emits: EOS that never fires."""
    used = set(new.flatten().tolist())
    return next(v for v in range(vocab) if v not in used)


def early_eos(new: Tensor) -> int:
    """An EOS that cuts one row short while another runs on (past that point or to the end):
    the earliest emitted token whose first occurrences differ between rows."""
    steps = new.shape[1]
    for t in range(steps - 2):
        for row in range(new.shape[0]):
            token = int(new[row, t])
            hits = new == token
            ends = [int(h.nonzero()[0]) if bool(h.any()) else steps for h in hits]
            if max(ends) > min(ends):
                return token
    raise AssertionError(f"degenerate test model, every row emits the same tokens:\n{new}")


def with_prefix(model: torch.nn.Module, ids: Tensor, new: Tensor) -> Tensor:
    """generate()'s output convention: prompt + continuation (decoder-only) or the decoder
    sequence from decoder_start_token_id (encoder-decoder)."""
    if model.config.is_encoder_decoder:
        return torch.cat([torch.full_like(new[:, :1], model.config.decoder_start_token_id), new], dim=1)
    return torch.cat([ids, new], dim=1)


def assert_tokens_equal(got: Tensor, expected: Tensor, what: str = "") -> None:
    assert got.shape == expected.shape and torch.equal(got, expected), f"{what}\ngot\n{got}\nexpected\n{expected}"


def hf_greedy(hf: torch.nn.Module, ids: Tensor, mask: Tensor, steps: int, eos: int, pad: int) -> Tensor:
    """transformers' greedy search with every extra logits processor off."""
    with torch.no_grad():
        return hf.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, num_beams=1, max_new_tokens=steps,
            eos_token_id=eos, pad_token_id=pad, min_length=0, no_repeat_ngram_size=0, bad_words_ids=None,
            forced_bos_token_id=None, forced_eos_token_id=None, repetition_penalty=1.0,
        )  # fmt: skip


# --------------------------------------------------------------------------- cache == recomputation


def kv_model(name: str, tmp_path: Path) -> torch.nn.Module:
    if name == "marian":
        return converted(hf_marian(0), tmp_path / "marian")
    return shared_model(name)


@pytest.mark.parametrize("name", ["gpt-tiny", "transformer-tiny", "t5-tiny", "marian"])
def test_kv_cache_decoding_equals_recomputation(name: str, tmp_path: Path) -> None:
    model = kv_model(name, tmp_path)
    cfg = model.config
    steps = 10
    ids = random_ids(3, (3, 7), cfg.vocab_size)
    # encoder-decoder: right-padded sources; decoder-only: the unpadded batch first
    mask = right_padded_mask([7, 5, 2], 7) if cfg.is_encoder_decoder else None
    free = recompute_greedy(model, ids, mask, steps)
    assert len(set(free.flatten().tolist())) > 3, f"degenerate test model: {free}"

    never = unused_token(free, cfg.vocab_size)
    got = model.generate(ids, mask, max_new_tokens=steps, eos_token_id=never)
    assert_tokens_equal(got, with_prefix(model, ids, free), "cache vs recomputation")

    # one row stops early and is padded, another runs on
    eos, pad = early_eos(free), cfg.pad_token_id
    expected = end_at_eos(free, eos, pad)
    got = model.generate(ids, mask, max_new_tokens=steps, eos_token_id=eos)
    assert_tokens_equal(got, with_prefix(model, ids, expected), f"EOS {eos}")
    # every row ends early (one row, EOS = its third token): decoding stops there
    eos, one = int(free[0, 2]), None if mask is None else mask[:1]
    got = model.generate(ids[:1], one, max_new_tokens=steps, eos_token_id=eos)
    assert_tokens_equal(got, with_prefix(model, ids[:1], end_at_eos(free[:1], eos, pad)), f"row 0, EOS {eos}")
    assert got.shape[1] <= (1 if cfg.is_encoder_decoder else ids.shape[1]) + 3

    if not cfg.is_encoder_decoder:  # a left-padded batch, garbage ids under the padding
        left = left_padded_mask([7, 4, 1], 7)
        free = recompute_greedy(model, ids, left, steps)
        got = model.generate(ids, left, max_new_tokens=steps, eos_token_id=never)
        assert_tokens_equal(got, torch.cat([ids, free], dim=1), "left-padded batch")
        for row, length in enumerate([7, 4, 1]):  # ... and padding changes nothing
            alone = model.generate(ids[row : row + 1, 7 - length :], max_new_tokens=steps, eos_token_id=never)
            assert_tokens_equal(alone[:, length:], got[row : row + 1, 7:], f"row {row} alone")


# --------------------------------------------------------------------------- == transformers


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("family", list(HF_BUILDERS))
def test_greedy_matches_transformers(family: str, seed: int, tmp_path: Path) -> None:
    hf = HF_BUILDERS[family](seed)
    ours = converted(hf, tmp_path / "hf")
    cfg = ours.config
    if cfg.is_encoder_decoder:  # 3 right-padded sources
        width, lengths = 7, [7, 4, 2]
        mask = right_padded_mask(lengths, width)
        ids = random_ids(seed, (3, width), cfg.vocab_size).masked_fill(mask == 0, cfg.pad_token_id)
    else:  # 2 prompts, unpadded
        ids, mask = random_ids(seed, (2, 5), cfg.vocab_size), torch.ones(2, 5, dtype=torch.long)
    pad = cfg.pad_token_id

    never = unused_token(recompute_greedy(ours, ids, mask, N_NEW), cfg.vocab_size)
    free = theirs = hf_greedy(hf, ids, mask, N_NEW, eos=never, pad=pad)
    assert theirs.shape[1] == (1 if cfg.is_encoder_decoder else ids.shape[1]) + N_NEW
    assert_tokens_equal(ours.generate(ids, mask, max_new_tokens=N_NEW, eos_token_id=never), theirs, "no EOS")

    # one row stops early and is padded, another runs on
    start = theirs.shape[1] - N_NEW
    eos = early_eos(theirs[:, start:])
    theirs = hf_greedy(hf, ids, mask, N_NEW, eos=eos, pad=pad)
    got = ours.generate(ids, mask, max_new_tokens=N_NEW, eos_token_id=eos)
    assert_tokens_equal(got, theirs, f"EOS {eos}")
    ended = (got[:, start:] == eos).long().cumsum(1) - (got[:, start:] == eos).long() > 0
    assert bool(ended.any()) and bool((got[:, start:][ended] == pad).all())
    # every row ends early (one row, EOS = its third token): both stop there
    eos = int(free[0, start + 2])
    theirs = hf_greedy(hf, ids[:1], mask[:1], N_NEW, eos=eos, pad=pad)
    assert theirs.shape[1] <= start + 3
    assert_tokens_equal(ours.generate(ids[:1], mask[:1], max_new_tokens=N_NEW, eos_token_id=eos), theirs, "row 0")


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_matches_transformers_left_padded_gpt2(seed: int, tmp_path: Path) -> None:
    hf = hf_gpt2(seed)
    ours = converted(hf, tmp_path / "hf")
    pad = ours.config.pad_token_id
    lengths = [6, 3, 1]
    mask = left_padded_mask(lengths, 6)
    ids = random_ids(seed, (3, 6), GPT2_VOCAB).masked_fill(mask == 0, pad)
    never = unused_token(recompute_greedy(ours, ids, mask, N_NEW), GPT2_VOCAB)
    theirs = hf_greedy(hf, ids, mask, N_NEW, eos=never, pad=pad)
    assert_tokens_equal(ours.generate(ids, mask, max_new_tokens=N_NEW, eos_token_id=never), theirs, "left-padded")
    eos = early_eos(theirs[:, 6:])
    theirs = hf_greedy(hf, ids, mask, N_NEW, eos=eos, pad=pad)
    assert_tokens_equal(ours.generate(ids, mask, max_new_tokens=N_NEW, eos_token_id=eos), theirs, f"EOS {eos}")


# --------------------------------------------------------------------------- sampling


def test_sampling_is_reproducible_with_seed() -> None:
    model = shared_model("gpt-tiny")
    ids = random_ids(0, (2, 4), 1000)
    options = dict(do_sample=True, max_new_tokens=30, eos_token_id=NO_EOS, temperature=1.5)
    runs = {seed: model.generate(ids, **options, seed=seed) for seed in (0, 1, 2)}
    for seed, tokens in runs.items():
        assert_tokens_equal(model.generate(ids, **options, seed=seed), tokens, f"seed {seed} again")
        assert tokens.shape == (2, 4 + 30)
    assert not torch.equal(runs[0], runs[1]) and not torch.equal(runs[1], runs[2])
    assert not torch.equal(runs[0], model.generate(ids, max_new_tokens=30, eos_token_id=NO_EOS))  # not greedy
    # the same holds for an encoder-decoder
    t = shared_model("transformer-tiny")
    src = random_ids(1, (2, 5), 1000)
    a, b = (t.generate(src, do_sample=True, max_new_tokens=20, temperature=3.0, seed=s) for s in (7, 8))
    assert_tokens_equal(t.generate(src, do_sample=True, max_new_tokens=20, temperature=3.0, seed=7), a)
    assert not torch.equal(a, b)


def test_unseeded_sampling_leaves_global_rng_reproducible() -> None:
    model = shared_model("gpt-tiny")
    ids = random_ids(0, (1, 3), 1000)
    draws = []
    for _ in range(2):
        torch.manual_seed(1234)
        model.generate(ids, do_sample=True, max_new_tokens=2)
        draws.append(torch.rand(4))
    assert torch.equal(draws[0], draws[1])


@pytest.mark.parametrize("name", ["gpt-tiny", "transformer-tiny"])
def test_top_k_1_equals_greedy(name: str) -> None:
    model = shared_model(name)
    ids = random_ids(2, (3, 5), 1000)
    greedy = model.generate(ids, max_new_tokens=12)
    for seed in (0, 1):
        for temperature in (1.0, 5.0):
            sampled = model.generate(
                ids, max_new_tokens=12, do_sample=True, top_k=1, temperature=temperature, seed=seed
            )
            assert_tokens_equal(sampled, greedy, f"seed {seed}, T={temperature}")


@pytest.mark.parametrize("name", ["gpt-tiny", "t5-tiny"])
def test_temperature_scales(name: str) -> None:
    """softmax(logits / T) -> one-hot on the argmax as T -> 0: sampling is greedy decoding."""
    model = shared_model(name)
    ids = random_ids(4, (3, 5), 1000)
    greedy = model.generate(ids, max_new_tokens=12)
    for seed in (0, 1, 2):
        cold = model.generate(ids, max_new_tokens=12, do_sample=True, temperature=1e-4, seed=seed)
        assert_tokens_equal(cold, greedy, f"seed {seed}")
    hot = model.generate(ids, max_new_tokens=12, do_sample=True, temperature=100.0, seed=0)
    assert not torch.equal(hot, greedy)


def nucleus(probs: list[float], p: float) -> set[int]:
    """Reference: the smallest set of most probable tokens whose mass reaches p (ties-free)."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = set(), 0.0
    for i in order:
        kept.add(i)
        mass += probs[i]
        if mass >= p:
            break
    return kept


@pytest.mark.parametrize(
    ("probs", "p", "expected"),
    [
        ([0.1, 0.5, 0.15, 0.25], 0.4, {1}),
        ([0.1, 0.5, 0.15, 0.25], 0.6, {1, 3}),
        ([0.1, 0.5, 0.15, 0.25], 0.74, {1, 3}),
        ([0.1, 0.5, 0.15, 0.25], 0.76, {1, 3, 2}),
        ([0.1, 0.5, 0.15, 0.25], 0.95, {0, 1, 2, 3}),
        ([0.1, 0.5, 0.15, 0.25], 1.0, {0, 1, 2, 3}),
        ([0.1, 0.5, 0.15, 0.25], 1e-9, {1}),
        ([0.02, 0.03, 0.9, 0.05], 0.91, {2, 3}),
        ([0.02, 0.03, 0.9, 0.05], 0.89, {2}),
        ([0.3, 0.3001, 0.2, 0.1999], 0.31, {0, 1}),
        ([0.7, 0.1, 0.1 + 1e-3, 0.1 - 1e-3], 0.75, {0, 2}),
    ],
)
def test_top_p_keeps_smallest_set_reaching_p(probs: list[float], p: float, expected: set[int]) -> None:
    assert nucleus(probs, p) == expected  # the reference agrees with the hand-worked answer
    logits = torch.tensor(probs).log() + 3.0  # a shift changes nothing
    batch = torch.stack([logits, logits.flip(0)])  # a second row, permuted
    out = filter_logits(batch, top_p=p)
    flipped = {len(probs) - 1 - i for i in expected}
    for row, keep in ((0, expected), (1, flipped)):
        want = torch.tensor([i in keep for i in range(len(probs))])
        assert torch.equal(torch.isfinite(out[row]), want), (row, out[row])
        assert torch.equal(out[row][want], batch[row][want])  # kept logits untouched
        assert bool((out[row][~want] == float("-inf")).all())


def test_top_p_on_random_distributions() -> None:
    """Against the reference on random 50-token distributions (p away from the cut points)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, 50, generator=g, dtype=torch.float64) * 2
    probs = logits.softmax(-1)
    for p in (0.05, 0.3, 0.5, 0.9, 0.99, 1.0):
        out = filter_logits(logits.float(), top_p=p)
        for row in range(logits.shape[0]):
            cum = probs[row].sort(descending=True).values.cumsum(0)
            if bool(((cum - p).abs() < 1e-5).any()):
                continue  # too close to a cut point for float32
            want = nucleus(probs[row].tolist(), p)
            assert {int(i) for i in torch.isfinite(out[row]).nonzero()} == want, (row, p)


def test_top_k_and_top_p_filters() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 1.0]])
    out = filter_logits(logits, top_k=2)
    assert torch.equal(torch.isfinite(out), torch.tensor([[True, False, False, True, False]]))
    assert torch.equal(filter_logits(logits, top_k=5), logits)
    assert torch.equal(filter_logits(logits, top_k=100), logits)
    assert torch.equal(filter_logits(logits), logits)
    # top-p measures mass after top-k, renormalised over the kept tokens (transformers' order):
    # 3.0 holds 0.624 of all five but 0.665 of the top 3, so p = 0.64 keeps it alone
    assert 0.62 < float(logits.softmax(-1)[0, 3]) < 0.64 < float(torch.tensor([3.0, 2.0, 1.0]).softmax(0)[0]) < 0.67
    assert torch.equal(torch.isfinite(filter_logits(logits, top_p=0.64)), torch.tensor([[1, 0, 0, 1, 0]]).bool())
    assert torch.equal(
        torch.isfinite(filter_logits(logits, top_k=3, top_p=0.64)), torch.tensor([[0, 0, 0, 1, 0]]).bool()
    )
    assert torch.equal(
        torch.isfinite(filter_logits(logits, top_k=3, top_p=0.7)), torch.tensor([[1, 0, 0, 1, 0]]).bool()
    )


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, None, None), (0.5, None, None), (2.0, None, None), (1.0, 3, None), (1.0, None, 0.8)],
)
def test_sampling_frequencies_match_softmax(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Pearson's chi-square on 20000 draws from a fixed 4-token distribution stays below the
    0.1% critical value of its degrees of freedom (16.27 / 13.82 / 10.83 for 3 / 2 / 1); the
    seed is fixed, so the test is deterministic. Filtered-out tokens are never drawn."""
    critical = {3: 16.27, 2: 13.82, 1: 10.83}
    draws = 20_000
    logits = torch.tensor([1.0, 0.0, 2.0, -0.5])
    expected = (logits / temperature).softmax(0)
    if top_k == 3:  # the least likely token (id 3) goes; the rest renormalise
        expected = torch.cat([expected[:3], torch.zeros(1)])
    if top_p == 0.8:  # sorted probs 0.61, 0.22, 0.12, 0.05: two tokens reach 0.8
        assert 0.8 < float(expected[2] + expected[0]) < 0.9
        expected = torch.tensor([float(expected[0]), 0.0, float(expected[2]), 0.0])
    expected = expected / expected.sum()
    choose = sampler(temperature, top_k, top_p, torch.Generator().manual_seed(0))
    tokens = choose(logits.expand(draws, 4))
    assert tokens.shape == (draws,) and tokens.dtype == torch.long
    counts = torch.bincount(tokens, minlength=4).double()
    allowed = expected > 0
    assert torch.equal(counts[~allowed], torch.zeros_like(counts[~allowed]))
    want = expected[allowed].double() * draws
    chi2 = float(((counts[allowed] - want) ** 2 / want).sum())
    assert chi2 < critical[int(allowed.sum()) - 1], (counts, want, chi2)
    assert_close(counts / draws, expected.double(), atol=0.015, rtol=0)


# --------------------------------------------------------------------------- bad input


def untouched(model: torch.nn.Module) -> list[str]:
    """Hooks that record every module run: a refused call must leave the list empty."""
    calls: list[str] = []
    for name, module in model.named_modules():
        module.register_forward_pre_hook(lambda *_, name=name: calls.append(name))
    return calls


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(num_beams=0), r"num_beams must be an integer >= 1, got 0"),
        (dict(do_sample=True, top_p=0), r"top_p must be in \(0, 1\], got 0"),
        (dict(do_sample=True, top_p=1.5), r"top_p must be in \(0, 1\], got 1\.5"),
        (dict(do_sample=True, temperature=0), r"temperature must be > 0 when sampling, got 0"),
        (dict(do_sample=True, temperature=-1.0), r"temperature must be > 0 when sampling, got -1\.0"),
        (dict(do_sample=True, top_k=0), r"top_k must be an integer >= 1, got 0"),
        (dict(max_new_tokens=0), r"max_new_tokens must be an integer >= 1, got 0"),
        (dict(max_new_tokens=-3), r"max_new_tokens must be an integer >= 1, got -3"),
        (dict(do_sample=True, num_beams=2), r"sampling \(do_sample\) draws one path per input; set num_beams to 1"),
    ],
)
def test_bad_settings_are_refused_before_any_model_work(options: dict, message: str) -> None:
    model = preset_model("gpt-tiny")
    calls = untouched(model)
    with pytest.raises(ValueError, match=message):
        model.generate(random_ids(0, (1, 3), 1000), **options)
    assert calls == []


def test_bad_prompts_are_refused_before_any_model_work() -> None:
    model = preset_model("gpt-tiny")  # max_len 256
    calls = untouched(model)
    with pytest.raises(ValueError, match=r"input_ids is empty \(seq_len 0\)"):
        model.generate(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"prompt of length 200 plus max_new_tokens=57 exceeds .* 256 positions"):
        model.generate(random_ids(0, (1, 200), 1000), max_new_tokens=57)
    with pytest.raises(ValueError, match=r"prompt of length 257 plus max_new_tokens=1 exceeds"):
        model.generate(random_ids(0, (1, 257), 1000), max_new_tokens=1)
    assert calls == []
    # the boundary itself is allowed: 200 + 56 = 256
    out = model.generate(random_ids(0, (1, 200), 1000), max_new_tokens=56, eos_token_id=NO_EOS)
    assert out.shape == (1, 256)


@pytest.mark.parametrize("pad", [-1, 1000])
def test_pad_outside_vocabulary_is_refused_before_any_model_work(pad: int) -> None:
    model = preset_model("gpt-tiny")
    ids = random_ids(3, (2, 4), 1000)
    eos = int(recompute_greedy(model, ids, None, 1)[0, 0])  # row 0 ends at once, then is fed the pad
    calls = untouched(model)
    with pytest.raises(ValueError, match=rf"pad_token_id.*{pad}"):
        model.generate(ids, max_new_tokens=4, eos_token_id=eos, pad_token_id=pad)
    assert calls == []


def test_bert_does_not_generate() -> None:
    torch.manual_seed(0)
    bert = attnkit.build_model("bert-tiny").eval()
    calls = untouched(bert)
    with pytest.raises(ValueError, match=r"BERT is an encoder and does not generate"):
        bert.generate(random_ids(0, (1, 4), 1000), max_new_tokens=3)
    assert calls == []


# --------------------------------------------------------------------------- fuzz


@st.composite
def decoding_settings(draw: st.DrawFn) -> dict:
    sample = draw(st.booleans())
    return dict(
        name=draw(st.sampled_from(["gpt-tiny", "transformer-tiny"])),
        batch=draw(st.integers(1, 3)),
        prompt=draw(st.integers(1, 6)),
        max_new_tokens=draw(st.integers(1, 6)),
        left_pad=draw(st.lists(st.integers(0, 5), min_size=3, max_size=3)),
        eos_token_id=draw(st.one_of(st.none(), st.integers(0, 999))),
        seed=draw(st.integers(0, 2**31 - 1)),
        do_sample=sample,
        top_k=draw(st.one_of(st.none(), st.integers(1, 50))) if sample else None,
        top_p=draw(st.one_of(st.none(), st.floats(0.01, 1.0))) if sample else None,
        temperature=draw(st.floats(0.05, 4.0)) if sample else 1.0,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(decoding_settings())
def test_generate_fuzz(s: dict) -> None:
    model = shared_model(s["name"])
    cfg = model.config
    B, P, N = s["batch"], s["prompt"], s["max_new_tokens"]
    ids = random_ids(s["seed"], (B, P), cfg.vocab_size, low=0)
    pads = [min(n, P - 1) for n in s["left_pad"][:B]]  # every row keeps a real token
    if cfg.is_encoder_decoder:
        mask = right_padded_mask([P - n for n in pads], P)
    else:
        mask = left_padded_mask([P - n for n in pads], P)
    options = {k: s[k] for k in ("max_new_tokens", "do_sample", "top_k", "top_p", "temperature", "eos_token_id")}
    out = model.generate(ids, mask, **options, seed=s["seed"])

    prefix = 1 if cfg.is_encoder_decoder else P
    assert out.dtype == torch.long and out.shape[0] == B and prefix + 1 <= out.shape[1] <= prefix + N
    assert int(out.min()) >= 0 and int(out.max()) < cfg.vocab_size
    if cfg.is_encoder_decoder:
        assert bool((out[:, 0] == cfg.decoder_start_token_id).all())
    else:
        assert torch.equal(out[:, :P], ids)
    new = out[:, prefix:]
    eos = cfg.eos_token_id if s["eos_token_id"] is None else s["eos_token_id"]
    assert torch.equal(end_at_eos(new, eos, cfg.pad_token_id), new)  # pad after EOS, stop when all ended
    if new.shape[1] < N:  # stopped early: every row has ended
        assert bool((new == eos).any(dim=1).all())
    if not s["do_sample"]:
        expected = end_at_eos(recompute_greedy(model, ids, mask, N), eos, cfg.pad_token_id)
        assert_tokens_equal(new, expected, str(s))
