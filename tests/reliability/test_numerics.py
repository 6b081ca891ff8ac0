"""Numerics. A non-finite loss stops training with its step number, or, opted into with
``train.skip_nonfinite``, is skipped within that budget by every rank alike; attention and decoding
stay finite with fully masked rows, under bf16 autocast and with extreme values, on every path.

Covered elsewhere, not repeated here: tests/nn/test_attention.py::
test_fully_masked_row_is_zero_with_finite_grads (attention_math and attention_fused in fp32, bf16
autocast and bf16 inputs, forward and backward) and ::test_paths_agree_and_are_finite (hypothesis
over shapes, masks with dead rows, bias and scale in fp32, fused == math);
tests/generation/test_greedy_sampling.py::test_generate_fuzz (hypothesis over greedy and sampled
decoding of gpt-tiny and transformer-tiny against recomputation). The fuzz tests here add
MultiHeadAttention, is_causal, bf16 autocast and extreme magnitudes to the first, and beam search,
T5, prompts that are all padding, impossible settings and bf16 autocast to the second.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.testing import assert_close

from attnkit.config import DataConfig, RunConfig, TrainConfig, preset
from attnkit.data.batching import StepBatches, TokenBatches
from attnkit.data.prepare import cost
from attnkit.data.specials import Specials
from attnkit.models import build_model
from attnkit.models.core import Model
from attnkit.models.run_dir import latest_checkpoint
from attnkit.nn.attention import MultiHeadAttention, attention_fused, attention_math, scaled_dot_product_attention
from attnkit.nn.masks import causal_mask
from attnkit.objectives.base import LossOutput
from attnkit.objectives.causal_lm import CausalLM
from attnkit.training import distributed
from attnkit.training.checkpoint import load_checkpoint
from attnkit.training.distributed import World
from attnkit.training.trainer import METRICS, NonFiniteLossError, Trainer

VOCAB = 64  # room for the 37 special tokens and some words
PRECISIONS = ["fp32", "bf16-autocast"]


def autocast(precision: str) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-autocast")


def all_finite(*tensors: Tensor | None) -> bool:
    return all(bool(t.isfinite().all()) for t in tensors if t is not None)


# --------------------------------------------------------------------------- non-finite loss


def tiny_trainer(run_dir: Path, skip_nonfinite: int, max_steps: int = 6) -> Trainer:
    """A one-layer GPT trained with AdamW on random words, a metrics line every step."""
    model = preset("gpt-tiny", vocab_size=VOCAB, d_model=32, d_ff=64, n_heads=2, n_layers=1, max_len=32, dropout=0.0,
                   pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    train = TrainConfig(optimizer="adamw", lr=1e-2, schedule="constant", max_steps=max_steps, batch_tokens=256,
                        log_every=1, eval_every=0, checkpoint_every=100, skip_nonfinite=skip_nonfinite)  # fmt: skip
    run = RunConfig(model, train, DataConfig())
    rng = random.Random(0)
    examples = [[rng.randrange(40, VOCAB) for _ in range(rng.randint(3, 10))] for _ in range(64)]
    batches = TokenBatches([cost(e) for e in examples], train.batch_tokens, train.seed)
    torch.manual_seed(0)
    world = World(torch.device("cpu"))
    return Trainer(run, run_dir, build_model(model), CausalLM(Specials(VOCAB)), examples,
                   iter(StepBatches(batches, 0, 1)), world)  # fmt: skip


def poison(trainer: Trainer, steps: set[int], value: float) -> None:
    """Multiply the objective's loss by ``value`` (inf or nan) at ``steps``."""
    loss = trainer.objective.loss

    def poisoned(model: torch.nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        out = loss(model, batch)
        if trainer.progress.step + 1 in steps:
            return LossOutput(out.total * value, out.tokens, out.metrics)
        return out

    trainer.objective.loss = poisoned


def weights(trainer: Trainer) -> dict[str, Tensor]:
    return {name: p.detach().clone() for name, p in trainer.bare.named_parameters()}


def adam_steps(trainer: Trainer) -> list[float]:
    return [float(state["step"]) for state in trainer.optimizer.state.values()]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / METRICS).read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_non_finite_loss_stops_training_with_its_step_number(tmp_path: Path, value: float) -> None:
    trainer = tiny_trainer(tmp_path, skip_nonfinite=0)
    poison(trainer, {3}, value)
    with pytest.raises(NonFiniteLossError, match=rf"the loss became {value} at step 3 .* train\.skip_nonfinite=N"):
        trainer.fit(progress_bar=False)
    assert trainer.progress.step == 2
    assert [r["step"] for r in records(tmp_path)] == [1, 2]


def test_skipped_steps_change_nothing_and_are_counted(tmp_path: Path) -> None:
    trainer = tiny_trainer(tmp_path, skip_nonfinite=2)
    poison(trainer, {3, 5}, math.inf)
    trainer.fit(progress_bar=False, session_steps=2)
    before, steps_before = weights(trainer), adam_steps(trainer)
    trainer.fit(progress_bar=False, session_steps=1)  # step 3: skipped
    assert trainer.progress.step == 3
    after = weights(trainer)
    for name, w in before.items():
        assert torch.equal(after[name], w), name
    assert adam_steps(trainer) == steps_before  # the optimiser did not step

    trainer.fit(progress_bar=False)  # steps 4 to 6, of which 5 is skipped
    assert trainer.progress.step == 6 and trainer.progress.skipped == 2
    assert adam_steps(trainer) == [4.0] * len(steps_before)
    assert any(not torch.equal(w, after[name]) for name, w in weights(trainer).items())
    lines = records(tmp_path)
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5, 6]
    assert [r["skipped"] for r in lines] == [0, 0, 1, 1, 2, 2]
    assert [math.isfinite(r["loss"]) for r in lines] == [True, True, False, True, False, True]
    assert [r["tokens"] > 0 for r in lines] == [True, True, False, True, False, True]
    _, _, state = load_checkpoint(latest_checkpoint(tmp_path))
    assert state["progress"]["skipped"] == 2  # a resumed run keeps counting against the same budget


def test_skipping_stops_with_the_step_number_once_the_budget_is_spent(tmp_path: Path) -> None:
    trainer = tiny_trainer(tmp_path, skip_nonfinite=1)
    poison(trainer, {2, 4}, math.nan)
    message = r"the loss became nan at step 4 \(1 such steps skipped before, train\.skip_nonfinite=1\)"
    with pytest.raises(NonFiniteLossError, match=message):
        trainer.fit(progress_bar=False)
    assert trainer.progress.step == 3 and trainer.progress.skipped == 2


def test_a_non_finite_loss_on_another_rank_is_skipped_on_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision reads the loss summed over ranks, the same number on every rank: here the
    all-reduce of step 2 brings in another rank's infinite loss beside this rank's finite one."""
    trainer = tiny_trainer(tmp_path, skip_nonfinite=1)
    all_sum = distributed.all_sum

    def with_another_rank(values: list[float], world: World) -> list[float]:
        summed = all_sum(values, world)
        if len(values) > 1 and trainer.progress.step + 1 == 2:  # the step's [loss, tokens, metrics...]
            summed[0] += math.inf
        return summed

    monkeypatch.setattr(distributed, "all_sum", with_another_rank)
    trainer.fit(progress_bar=False, session_steps=1)
    before = weights(trainer)
    trainer.fit(progress_bar=False, session_steps=1)
    for name, w in weights(trainer).items():
        assert torch.equal(w, before[name]), name
    assert records(tmp_path)[-1]["skipped"] == 1


# --------------------------------------------------------------------------- fully masked rows


@pytest.mark.parametrize("return_weights", [False, True], ids=["fused", "math"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_multi_head_attention_with_fully_masked_rows_is_finite(precision: str, return_weights: bool) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=16, n_heads=4)
    x = torch.randn(2, 5, 16, requires_grad=True)
    memory = torch.randn(2, 7, 16, requires_grad=True)
    mask = torch.rand(2, 1, 5, 7) > 0.5
    mask[..., 0] = True
    mask[0, :, 2] = False  # one query with no key
    mask[1] = False  # a memory that is all padding
    with autocast(precision):
        out, attention = mha(x, memory=memory, mask=mask, return_weights=return_weights)
    out.float().square().sum().backward()
    assert all_finite(out, attention, x.grad, memory.grad, *(p.grad for p in mha.parameters()))
    for row in (out[0, 2], *out[1]):  # attending nothing: w_o of a zero vector, its bias
        assert_close(row.float(), mha.w_o.bias.detach().to(out.dtype).float())


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", ["gpt-tiny", "bert-tiny", "t5-tiny", "transformer-tiny"])
def test_every_family_is_finite_with_an_all_padding_row(name: str, precision: str) -> None:
    """Self-attention (causal or not, T5's relative bias) and cross-attention to a source that is
    all padding: forward and backward finite."""
    torch.manual_seed(0)
    model = build_model(preset(name, vocab_size=VOCAB, n_layers=1))
    ids = torch.randint(40, VOCAB, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1] = 0
    extra = {"decoder_input_ids": ids[:, :4]} if model.config.is_encoder_decoder else {}
    with autocast(precision):
        logits = model(ids, attention_mask=mask, **extra).logits
    logits.float().logsumexp(-1).sum().backward()
    assert all_finite(logits, *(p.grad for p in model.parameters()))


# --------------------------------------------------------------------------- extreme values

ATTENTION_PATHS = {
    "math": lambda q, k, v, mask, bias, causal: attention_math(q, k, v, mask, bias=bias, is_causal=causal)[0],
    "fused": lambda q, k, v, mask, bias, causal: attention_fused(q, k, v, mask, bias=bias, is_causal=causal),
    "front": lambda q, k, v, mask, bias, causal: (
        scaled_dot_product_attention(q, k, v, mask, is_causal=causal)
        if bias is None
        else attention_fused(q, k, v, mask, bias=bias, is_causal=causal)
    ),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("extreme", ["inputs-x1e4", "scores-pm1e4"])
@pytest.mark.parametrize("path", list(ATTENTION_PATHS))
def test_extreme_values_stay_finite(path: str, extreme: str, precision: str, causal: bool) -> None:
    """Inputs scaled by 1e4 (scores about 1e8) or scores pushed to ±1e4 by a bias: the softmax
    saturates but stays finite, forward and backward, and the fused path agrees with the math one."""
    g = torch.Generator().manual_seed(1)
    scale_in = 1e4 if extreme == "inputs-x1e4" else 1.0
    q = (torch.randn(2, 3, 5, 8, generator=g) * scale_in).requires_grad_()
    k = (torch.randn(2, 3, 7, 8, generator=g) * scale_in).requires_grad_()
    v = torch.randn(2, 3, 7, 8, generator=g).requires_grad_()
    bias = torch.randn(1, 3, 5, 7, generator=g).sign() * 1e4 if extreme == "scores-pm1e4" else None
    mask = torch.rand(2, 3, 5, 7, generator=g) > 0.3
    mask[0, 1, 3] = False  # a fully masked row
    with autocast(precision):
        out = ATTENTION_PATHS[path](q, k, v, mask, bias, causal)
    out.float().sum().backward()
    assert all_finite(out, q.grad, k.grad, v.grad)
    if precision == "fp32":
        with torch.no_grad():
            reference = ATTENTION_PATHS["math"](q, k, v, mask, bias, causal)
        assert_close(out, reference, atol=1e-4, rtol=1e-4)


@functools.cache
def loud_gpt() -> Model:
    """A GPT whose untied output layer is scaled by 1e5: logits of about ±1e4 to 1e5."""
    torch.manual_seed(0)
    model = build_model(preset("gpt-tiny", vocab_size=VOCAB, n_layers=1, tie_embeddings=False)).eval()
    with torch.no_grad():
        model.head.weight.mul_(1e5)
    return model


@contextlib.contextmanager
def finite_logits(model: Model) -> Iterator[list[bool]]:
    """Whether each logits tensor the model computes inside the block is finite."""
    seen: list[bool] = []
    hook = model.head.register_forward_hook(lambda module, args, out: seen.append(all_finite(out)))
    try:
        yield seen
    finally:
        hook.remove()


DECODING = {
    "greedy": {},
    "beams": {"num_beams": 3, "length_penalty": 1.0},
    "sample": {"do_sample": True},
    "cold-top-k": {"do_sample": True, "top_k": 5, "temperature": 0.05},
    "top-p": {"do_sample": True, "top_p": 0.3},
    "hot": {"do_sample": True, "temperature": 50.0},
}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("decoding", list(DECODING))
def test_decoding_with_extreme_logits(decoding: str, precision: str) -> None:
    model = loud_gpt()
    ids = torch.randint(40, VOCAB, (3, 5), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # a left-padded row counts from its first token
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    assert logits.abs().max() > 1e4
    with finite_logits(model) as seen, autocast(precision):
        out = model.generate(ids, mask, max_new_tokens=6, eos_token_id=None, seed=0, **DECODING[decoding])
    assert seen and all(seen)
    assert out.shape == (3, 11) and torch.equal(out[:, :5], ids)
    assert int(out.min()) >= 0 and int(out.max()) < VOCAB
    if decoding == "greedy" and precision == "fp32":
        assert torch.equal(out[:, 5], logits.argmax(-1))


# --------------------------------------------------------------------------- fuzz


@st.composite
def attention_problems(draw: st.DrawFn) -> dict:
    n, m = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    return dict(
        B=draw(st.integers(1, 2)), H=draw(st.integers(1, 3)), n=n, m=m, d_k=draw(st.integers(1, 8)),
        d_v=draw(st.integers(1, 8)), mask=draw(st.sampled_from(["none", "random", "padding", "all-false"])),
        density=draw(st.sampled_from([0.0, 0.3, 0.7, 1.0])), dead=draw(st.lists(st.integers(0, n - 1), max_size=n)),
        is_causal=draw(st.booleans()), scale=draw(st.sampled_from([None, 0.1, 1.0, 10.0])),
        path=draw(st.sampled_from(["math", "fused", "front", "mha"])), precision=draw(st.sampled_from(PRECISIONS)),
        magnitude=draw(st.sampled_from([1.0, 1e2, 1e4])), seed=draw(st.integers(0, 2**31 - 1)),
    )  # fmt: skip


def fuzz_mask(p: dict, g: torch.Generator) -> Tensor | None:
    """A (B, 1 or H, n, m) bool mask of the drawn kind; ``dead`` rows attend nothing."""
    B, H, n, m = p["B"], p["H"], p["n"], p["m"]
    if p["mask"] == "none":
        return None
    if p["mask"] == "all-false":
        return torch.zeros(B, 1, n, m, dtype=torch.bool)
    heads = 1 if p["mask"] == "padding" or p["path"] == "mha" else H
    rows = 1 if p["mask"] == "padding" else n
    mask = (torch.rand(B, heads, rows, m, generator=g) < p["density"]).expand(B, heads, n, m).clone()
    mask[..., p["dead"], :] = False
    return mask


@settings(max_examples=80, deadline=None)
@given(attention_problems())
def test_attention_fuzz(p: dict) -> None:
    """Any shapes, masks (rows with no key included), causal or not, scale, path, precision and
    magnitude: finite forward and backward, and zero output where a row attends nothing."""
    B, H, n, m = p["B"], p["H"], p["n"], p["m"]
    g = torch.Generator().manual_seed(p["seed"])
    mask = fuzz_mask(p, g)
    if p["path"] == "mha":
        torch.manual_seed(p["seed"])
        mha = MultiHeadAttention(d_model=H * p["d_k"], n_heads=H, d_k=p["d_k"], d_v=p["d_v"])
        x = (torch.randn(B, n, H * p["d_k"], generator=g) * p["magnitude"]).requires_grad_()
        memory = (torch.randn(B, m, H * p["d_k"], generator=g) * p["magnitude"]).requires_grad_()
        inputs: tuple[Tensor, ...] = (x, memory)

        def run() -> Tensor:
            return mha(x, memory=memory, mask=mask, is_causal=p["is_causal"])[0]
    else:
        q = (torch.randn(B, H, n, p["d_k"], generator=g) * p["magnitude"]).requires_grad_()
        k = (torch.randn(B, H, m, p["d_k"], generator=g) * p["magnitude"]).requires_grad_()
        v = torch.randn(B, H, m, p["d_v"], generator=g).requires_grad_()
        inputs = (q, k, v)
        fn = {"math": lambda *a, **kw: attention_math(*a, **kw)[0], "fused": attention_fused,
              "front": scaled_dot_product_attention}[p["path"]]  # fmt: skip

        def run() -> Tensor:
            return fn(q, k, v, mask, scale=p["scale"], is_causal=p["is_causal"])

    if p["is_causal"] and n > m:
        with pytest.raises(ValueError, match=r"0 <= n <= m"):
            run()
        return
    with autocast(p["precision"]):
        out = run()
    out.float().sum().backward()
    assert all_finite(out, *(t.grad for t in inputs))
    if p["path"] != "mha":
        allowed = torch.ones(n, m, dtype=torch.bool) if mask is None else mask
        if p["is_causal"]:
            allowed = allowed & causal_mask(n, m)
        dead = ~allowed.expand(B, H, n, m).any(-1)
        assert bool((out[dead] == 0).all())


@functools.cache
def fuzz_model(name: str) -> Model:
    torch.manual_seed(0)
    small = {"vocab_size": VOCAB, "n_layers": 1} | ({"max_len": 10} if name == "gpt-tiny" else {})
    return build_model(preset(name, **small)).eval()


# One setting made impossible, in a third of the draws.
IMPOSSIBLE = {
    "max_new_tokens": [0, -1], "num_beams": [0, -2], "temperature": [0.0, -1.0], "top_k": [0, -1],
    "top_p": [0.0, -0.1, 1.5],
}  # fmt: skip


@st.composite
def decoding_settings(draw: st.DrawFn) -> dict:
    prompt = draw(st.integers(1, 6))
    sample = draw(st.booleans())
    s = dict(
        name=draw(st.sampled_from(["gpt-tiny", "transformer-tiny", "t5-tiny"])), batch=draw(st.integers(1, 3)),
        prompt=prompt, padding=draw(st.lists(st.integers(0, prompt), min_size=3, max_size=3)),
        max_new_tokens=draw(st.integers(1, 5)), num_beams=1 if sample else draw(st.integers(1, 4)), do_sample=sample,
        top_k=draw(st.one_of(st.none(), st.integers(1, VOCAB + 5))),
        top_p=draw(st.one_of(st.none(), st.sampled_from([0.05, 0.5, 0.95, 1.0]))),
        temperature=draw(st.sampled_from([0.01, 0.7, 1.0, 5.0])),
        length_penalty=draw(st.sampled_from([-1.0, 0.0, 2.0])),
        eos_token_id=draw(st.one_of(st.none(), st.integers(0, VOCAB - 1))),
        precision=draw(st.sampled_from(PRECISIONS)), seed=draw(st.integers(0, 2**31 - 1)),
    )  # fmt: skip
    broken = draw(st.sampled_from([None] * 12 + ["sampling-with-beams", *IMPOSSIBLE]))
    if broken == "sampling-with-beams":
        s.update(do_sample=True, num_beams=draw(st.integers(2, 4)))
    elif broken is not None:
        s[broken] = draw(st.sampled_from(IMPOSSIBLE[broken]))
    return s


def refusal(s: dict, model: Model) -> str | None:
    """What ``generate`` must refuse in ``s``, as a regex of its message; None when it is valid."""
    cfg = model.config
    if s["max_new_tokens"] < 1:
        return "max_new_tokens must be an integer >= 1"
    if s["num_beams"] < 1:
        return "num_beams must be an integer >= 1"
    if s["do_sample"] and s["num_beams"] > 1:
        return r"sampling \(do_sample\) draws one path per input"
    if s["do_sample"] and s["temperature"] <= 0:
        return "temperature must be > 0"
    if s["top_k"] is not None and s["top_k"] < 1:
        return "top_k must be an integer >= 1"
    if s["top_p"] is not None and not 0 < s["top_p"] <= 1:
        return r"top_p must be in \(0, 1\]"
    if (0 if cfg.is_encoder_decoder else s["prompt"]) + s["max_new_tokens"] > cfg.max_len:
        return "exceeds the model's context"
    return None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(decoding_settings())
def test_generate_fuzz_never_crashes_nor_computes_nan(s: dict) -> None:
    """Random models, prompts (rows that are all padding included) and settings, possible or not:
    a ValueError for the impossible ones, else tokens of the vocabulary, the prompt kept, at most
    max_new_tokens more, and every logit computed on the way finite."""
    model = fuzz_model(s["name"])
    B, P = s["batch"], s["prompt"]
    g = torch.Generator().manual_seed(s["seed"])
    ids = torch.randint(40, VOCAB, (B, P), generator=g)
    mask = torch.ones_like(ids)
    for row, pad in enumerate(s["padding"][:B]):
        if model.config.is_encoder_decoder:
            mask[row, P - pad :] = 0  # sources are right-padded
        else:
            mask[row, :pad] = 0  # prompts are left-padded
    options = {key: s[key] for key in ("max_new_tokens", "num_beams", "do_sample", "top_k", "top_p", "temperature",
                                       "length_penalty", "eos_token_id", "seed")}  # fmt: skip
    refused = refusal(s, model)
    event("refused" if refused else "decoded")
    if refused is not None:
        with pytest.raises(ValueError, match=refused):
            model.generate(ids, mask, **options)
        return
    with finite_logits(model) as seen, autocast(s["precision"]):
        out = model.generate(ids, mask, **options)
    assert seen and all(seen)
    prefix = 1 if model.config.is_encoder_decoder else P
    assert out.dtype == torch.long and out.shape[0] == B and prefix < out.shape[1] <= prefix + s["max_new_tokens"]
    assert int(out.min()) >= 0 and int(out.max()) < VOCAB
    if not model.config.is_encoder_decoder:
        assert torch.equal(out[:, :P], ids)
