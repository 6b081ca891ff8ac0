"""Beam search, the generalisation of the chapter's greedy loop [alg:att-decode]: one beam is
greedy decoding, enough beams is exhaustive search, finished hypotheses never come back, the
length penalties are the stated formulas, caps hold per example, and with the "power" penalty
the result is transformers' beam search token for token."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attnkit
from attnkit.generation import IncrementalModel, generate
from attnkit.generation.beam import beam_search, length_penalty_factor, top
from attnkit.generation.greedy import decode_one_path


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """The models here are tiny: intra-op threads only spin (several times slower on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


Table = Callable[[int, tuple[int, ...]], list[float]]  # (example, prefix of new tokens) -> next-token logits


class ScriptedModel:
    """IncrementalModel's interface (start, step, reorder) over a table of next-token logits;
    it keeps every row's prefix, so a test can see what the search fed it."""

    def __init__(self, table: Table, batch: int, k: int) -> None:
        self.table, self.k = table, k
        self.prefixes: list[tuple[int, ...]] = [() for _ in range(batch * k)]
        self.examples = [row // k for row in range(batch * k)]  # the example of each row
        self.fed: list[tuple[int, ...]] = []  # every prefix a row has been extended to

    def _logits(self) -> torch.Tensor:
        return torch.tensor([self.table(e, p) for e, p in zip(self.examples, self.prefixes, strict=True)])

    def start(self) -> torch.Tensor:
        return self._logits()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.prefixes = [(*p, int(t)) for p, t in zip(self.prefixes, tokens, strict=True)]
        self.fed.extend(self.prefixes)
        return self._logits()

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows ``index``: each group of k new rows comes from one example (dropped
        examples leave no row)."""
        index = index.tolist()
        groups = [index[j : j + self.k] for j in range(0, len(index), self.k)]
        assert all(len({self.examples[i] for i in g}) == 1 for g in groups), "a beam moved to another example"
        self.prefixes = [self.prefixes[i] for i in index]
        self.examples = [self.examples[i] for i in index]


def run(model: object, k: int, max_new_tokens: int, eos: int | None, pad: int, **options: object) -> torch.Tensor:
    settings = dict(length_penalty=0.0, length_penalty_style="power", early_stopping=True, budget=None) | options
    return beam_search(model, k, max_new_tokens, eos, pad, **settings)  # type: ignore[arg-type]


def hypothesis(row: torch.Tensor, eos: int) -> tuple[int, ...]:
    """The tokens of one returned row up to and including its EOS (the padding dropped)."""
    tokens = row.tolist()
    return tuple(tokens[: tokens.index(eos) + 1]) if eos in tokens else tuple(tokens)


# --------------------------------------------------------------------------- one beam = greedy


@pytest.mark.parametrize("name", ["gpt-tiny", "transformer-tiny", "t5-tiny"])
def test_beam1_equals_greedy(name: str, wide_model: Callable[..., torch.nn.Module]) -> None:
    model = wide_model(name)
    ids = torch.randint(3, 1000, (3, 6))
    mask = torch.ones_like(ids)
    mask[1, :2] = mask[2, :4] = 0  # left padding (decoder-only) or a short source
    if model.config.is_encoder_decoder:
        mask = mask.flip(1)
    free = decode_one_path(IncrementalModel(model, ids, mask), 12, None, 0)
    eos = int(free[0, 3])  # a token greedy decoding emits, so that rows end at different steps
    pad = 999
    greedy = decode_one_path(IncrementalModel(model, ids, mask), 12, eos, pad)
    assert (greedy == pad).any(), "no row ended early: the test would not exercise EOS"
    beam1 = run(IncrementalModel(model, ids, mask, copies=1), 1, 12, eos, pad)
    assert torch.equal(beam1, greedy)
    front = generate(model, ids, mask, max_new_tokens=12, num_beams=1, eos_token_id=eos, pad_token_id=pad)
    assert torch.equal(front[:, -greedy.shape[1] :], greedy)


# --------------------------------------------------------------------------- enough beams = exhaustive


EXHAUSTIVE_EOS = 1


@pytest.fixture(scope="module")
def tiny_vocab_model() -> attnkit.models.Model:
    torch.manual_seed(3)
    config = attnkit.preset("gpt-tiny", vocab_size=5, init_std=0.6, dropout=0.0, eos_token_id=EXHAUSTIVE_EOS)
    return attnkit.build_model(config).eval()


@functools.cache
def all_hypotheses(model: torch.nn.Module, prompt: tuple[int, ...], length: int) -> list[tuple[float, tuple[int, ...]]]:
    """Every hypothesis of ≤ ``length`` new tokens (ending at its first EOS, or at ``length``)
    with its log p, from one full forward pass (no cache) over all of them."""
    vocab = model.config.vocab_size
    hyps = [
        seq
        for n in range(1, length + 1)
        for seq in itertools.product(range(vocab), repeat=n)
        if EXHAUSTIVE_EOS not in seq[:-1] and (n == length or seq[-1] == EXHAUSTIVE_EOS)
    ]
    ids = torch.tensor([prompt + seq + (0,) * (length - len(seq)) for seq in hyps])  # right padding: causal
    with torch.no_grad():
        log_p = torch.log_softmax(model(ids).logits.double(), dim=-1)  # (H, P + length, V)
    new = ids[:, len(prompt) :]  # (H, length)
    per_token = log_p[:, len(prompt) - 1 : -1].gather(-1, new[:, :, None])[..., 0]  # (H, length)
    lengths = torch.tensor([len(seq) for seq in hyps])
    totals = per_token.masked_fill(torch.arange(length) >= lengths[:, None], 0.0).sum(-1)
    return list(zip(totals.tolist(), hyps, strict=True))


@pytest.mark.parametrize("style", ["power", "gnmt"])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0, -0.5])
def test_beam_search_is_exhaustive_on_tiny_vocab(tiny_vocab_model: torch.nn.Module, alpha: float, style: str) -> None:
    model, length = tiny_vocab_model, 3
    prompts = torch.tensor([[2, 4, 3], [0, 0, 2]])
    k = 5**2  # every prefix of length 2 (4 x 4 without EOS) and every candidate of step 2 (20) fit
    for early_stopping in (True, False):
        got = run(
            IncrementalModel(model, prompts, None, copies=k), k, length, EXHAUSTIVE_EOS, 0,
            length_penalty=alpha, length_penalty_style=style, early_stopping=early_stopping,
        )  # fmt: skip
        for b, prompt in enumerate(prompts.tolist()):
            scored = sorted(
                ((total / length_penalty_factor(len(seq), alpha, style), seq)
                 for total, seq in all_hypotheses(model, tuple(prompt), length)),
                reverse=True,
            )  # fmt: skip
            (best_score, best), (second_score, _) = scored[:2]
            assert best_score - second_score > 1e-4, "near tie: the comparison would test rounding"
            assert hypothesis(got[b], EXHAUSTIVE_EOS) == best


# --------------------------------------------------------------------------- EOS handling

PAD, EOS, A, B = 0, 1, 2, 3


def log_probs(vocab: int, **chosen: float) -> list[float]:
    """Logits whose log-softmax puts log p = ``chosen`` on the named tokens (PAD, EOS, A, B or
    t<i>) and spreads the rest of the mass evenly on the others."""
    names = {"PAD": PAD, "EOS": EOS, "A": A, "B": B} | {f"t{i}": i for i in range(vocab)}
    fixed = {names[name]: value for name, value in chosen.items()}
    rest = math.log((1.0 - sum(math.exp(v) for v in fixed.values())) / (vocab - len(fixed)))
    return [fixed.get(i, rest) for i in range(vocab)]


@pytest.mark.parametrize("early_stopping", [True, False])
def test_finished_hypotheses_never_reenter(early_stopping: bool) -> None:
    vocab = 6

    def table(example: int, prefix: tuple[int, ...]) -> list[float]:
        if EOS in prefix:  # never asked if EOS-ended hypotheses stay out: an extension would win
            return log_probs(vocab, A=-1e-6)
        if example == 0:  # EOS first is best
            return log_probs(vocab, EOS=math.log(0.6), A=math.log(0.3)) if not prefix else log_probs(vocab, B=-0.7)
        return log_probs(vocab, EOS=-30.0, A=-0.4, B=-1.5)  # example 1 never ends early

    model = ScriptedModel(table, batch=2, k=3)
    got = run(model, 3, 4, EOS, PAD, early_stopping=early_stopping)
    assert got.shape == (2, 4)  # example 1 runs to the cap
    assert got[0].tolist() == [EOS, PAD, PAD, PAD]  # stopped at EOS, padded after
    assert not [p for p in model.fed if EOS in p], "a finished hypothesis was extended"
    assert EOS not in got[1].tolist()


def test_eos_candidate_outside_the_first_k_is_dropped() -> None:
    """As in transformers: of the 2k candidates of a step, one ending in EOS becomes a finished
    hypothesis only if it ranks among the first k; the others are backups for the live beam."""
    vocab = 50

    def table(example: int, prefix: tuple[int, ...]) -> list[float]:
        if not prefix:  # candidates: A (-0.2), B (-2.0), EOS (-3.2): EOS ranks third
            return log_probs(vocab, A=-0.2, B=-2.0, EOS=-3.2)
        logits = [0.0] * vocab  # then nearly uniform: every two-token hypothesis < -3.6
        logits[5] = 0.5
        return logits

    assert run(ScriptedModel(table, 1, 2), 2, 2, EOS, PAD)[0].tolist() == [A, 5]  # EOS was third of 4
    assert run(ScriptedModel(table, 1, 3), 3, 2, EOS, PAD)[0].tolist() == [EOS]  # third of the first 3


# --------------------------------------------------------------------------- length penalties


def test_gnmt_penalty_formula() -> None:
    for n in (1, 2, 7):
        for alpha in (0.0, 0.6, 1.0):
            assert length_penalty_factor(n, alpha, "gnmt") == pytest.approx(((5 + n) / 6) ** alpha)
            assert length_penalty_factor(n, alpha, "power") == pytest.approx(n**alpha)
    assert length_penalty_factor(1, 0.7, "gnmt") == 1.0  # lp(1) = 1: a one-token hypothesis is unchanged
    assert length_penalty_factor(9, 0.0, "gnmt") == length_penalty_factor(9, 0.0, "power") == 1.0
    with pytest.raises(ValueError, match="length_penalty_style"):
        length_penalty_factor(3, 1.0, "wu")

    # Finished hypotheses: (EOS) with log p = -1.0 and (A, EOS) with log p = -1.1. The longer
    # wins iff lp(2) > 1.1: gnmt (7/6)^α > 1.1 iff α > 0.618; power 2^α > 1.1 iff α > 0.1375.
    vocab = 6

    def table(example: int, prefix: tuple[int, ...]) -> list[float]:
        if not prefix:
            return log_probs(vocab, EOS=-1.0, A=-0.5, PAD=-30.0)
        return log_probs(vocab, EOS=-0.6, PAD=-30.0)

    def best(alpha: float, style: str) -> list[int]:
        out = run(ScriptedModel(table, 1, 2), 2, 2, EOS, PAD, length_penalty=alpha, length_penalty_style=style)
        return out[0].tolist()

    short, long = [EOS], [A, EOS]
    assert best(0.0, "gnmt") == best(0.0, "power") == short
    assert best(0.5, "gnmt") == short and best(0.5, "power") == long
    assert best(0.7, "gnmt") == long
    assert best(0.1, "power") == short


# --------------------------------------------------------------------------- caps


def test_budget_caps_each_example_as_its_own_max_new_tokens(wide_model: Callable[..., torch.nn.Module]) -> None:
    model = wide_model("transformer-tiny", seed=1)
    ids = torch.randint(3, 1000, (3, 6))
    mask = torch.ones_like(ids)
    mask[1, 4:] = mask[2, 2:] = 0
    budget = torch.tensor([7, 5, 3])  # source length + 1
    k, eos, pad = 3, 2, 0
    capped = run(IncrementalModel(model, ids, mask, copies=k), k, 10, eos, pad, budget=budget)
    assert capped.shape[1] <= 7
    for b, cap in enumerate(budget.tolist()):
        alone = run(IncrementalModel(model, ids, mask, copies=k), k, cap, eos, pad)  # the same batch, capped at cap
        width = alone.shape[1]  # <= cap
        assert capped[b, :width].tolist() == alone[b].tolist()
        assert (capped[b, width:] == pad).all()
    front = generate(model, ids, mask, max_new_tokens=10, num_beams=k, source_length_offset=1, eos_token_id=eos)
    assert torch.equal(front[:, 1:], capped)


def test_max_new_tokens_finalises_live_beams() -> None:
    """No hypothesis ends with EOS before the cap: the best live beam at the cap is returned."""

    def table(example: int, prefix: tuple[int, ...]) -> list[float]:
        return log_probs(8, EOS=-40.0, A=-0.3 - 0.1 * len(prefix))

    out = run(ScriptedModel(table, 2, 4), 4, 5, EOS, PAD)
    assert out.tolist() == [[A] * 5, [A] * 5]


# --------------------------------------------------------------------------- transformers

HF_PAD = 98  # not 0: transformers fills with EOS when pad_token_id is 0
NO_PROCESSORS = dict(no_repeat_ngram_size=0, forced_eos_token_id=None, forced_bos_token_id=None, min_length=0)


def hf_model(family: str) -> torch.nn.Module:
    """A tiny randomly initialised transformers GPT-2, T5 (v1.1) or Marian."""
    transformers = pytest.importorskip("transformers")
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=101, n_embd=32, n_head=4, n_layer=2, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, bos_token_id=100, eos_token_id=100,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(config)
    if family == "t5":
        config = transformers.T5Config(
            vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
            feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0,
            eos_token_id=1,
        )  # fmt: skip
        return transformers.T5ForConditionalGeneration(config)
    config = transformers.MarianConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=99, decoder_start_token_id=99, eos_token_id=0,
        forced_eos_token_id=None, activation_function="swish", scale_embedding=True,
    )  # fmt: skip
    return transformers.MarianMTModel(config)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("family", ["gpt2", "t5", "marian"])
def test_matches_transformers_beam_search(tmp_path: Path, family: str, seed: int) -> None:
    torch.manual_seed(seed)
    hf = hf_model(family).eval()
    with torch.no_grad():  # weights wider than the initialisation, so that the beams disagree
        for name, p in hf.named_parameters():
            if "embed_positions" not in name:
                p.normal_(0.0, 0.4 if p.dim() == 2 else 0.1)
    hf.save_pretrained(tmp_path)
    ours = attnkit.from_pretrained(tmp_path).eval()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 97, (3, 7), generator=g)
    full = torch.ones_like(ids)
    padded = full.clone()
    if family == "gpt2":
        padded[1, :3] = padded[2, :5] = 0  # left padding, as transformers wants for decoder-only
    else:
        padded[1, 5:] = padded[2, 3:] = 0
    prompt = 1 if hf.config.is_encoder_decoder else ids.shape[1]
    # EOS: a token the model emits (greedy, 3rd new token of example 0), so beams end at various steps
    eos = int(ours.generate(ids, max_new_tokens=3, eos_token_id=None, pad_token_id=HF_PAD)[0, prompt + 2])
    ended = 0
    cases = [(padded, k, alpha, True) for k in (2, 4) for alpha in (0.0, 1.0)]
    cases += [(padded, 4, 1.0, False), (full, 4, 1.0, True)]  # transformers' heuristic; no padding
    for mask, k, alpha, early_stopping in cases:
        options = dict(
            num_beams=k, length_penalty=alpha, early_stopping=early_stopping, max_new_tokens=8, eos_token_id=eos,
            pad_token_id=HF_PAD,
        )  # fmt: skip
        expected = hf.generate(ids, attention_mask=mask, do_sample=False, **options, **NO_PROCESSORS)
        got = ours.generate(ids, mask, length_penalty_style="power", **options)
        assert got.tolist() == expected.tolist(), (mask.tolist(), k, alpha, early_stopping)
        ended += int((got[:, prompt:] == eos).any(-1).sum())
    assert ended > 0, "no hypothesis ended with EOS: the comparison would not exercise it"


@pytest.mark.parametrize(
    ("rows", "width", "n"), [(3, 128_000, 8), (5, 32_003, 8), (2, 640, 10), (4, 100, 8), (1, 65, 2)]
)
def test_top_equals_torch_topk(rows: int, width: int, n: int) -> None:
    """The chunked top-n of the beam's candidates equals torch's top-k: the same values in the same
    order at the same columns (distinct values: a permutation), with -inf columns and a last,
    shorter chunk."""
    g = torch.Generator().manual_seed(width)
    x = torch.stack([torch.randperm(width, generator=g).float() for _ in range(rows)]) / width - 0.5
    x[:, ::7] = float("-inf")
    x[0, -1] = 2.0  # the best of row 0 in the last chunk, shorter where width is not a multiple of 64
    values, columns = top(x, n)
    expected_values, expected_columns = x.topk(n, dim=1)
    assert_close(values, expected_values, rtol=0, atol=0)
    assert torch.equal(columns, expected_columns)
