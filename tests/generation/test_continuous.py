"""Continuous batching: requests joining a running batch at different steps, leaving it at
different steps, cancelled or trimmed, each decode exactly as ``model.generate`` decodes that
prompt alone (greedy and seeded sampling), for learned and rotary positions."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit.generation.continuous import TRIM_AT, ContinuousBatch, Request
from attnkit.generation.greedy import sampler


def model_of(name: str) -> attnkit.models.Model:
    torch.manual_seed(0)
    return attnkit.build_model(attnkit.preset(name)).eval()


def prompts(vocab: int, lengths: list[int], seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def alone(model: attnkit.models.Model, prompt: list[int], new: int, **options: object) -> list[int]:
    """``prompt``'s continuation by ``model.generate``, up to and with the model's end token."""
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new, **options)[0, len(prompt) :].tolist()
    eos = model.config.eos_token_id
    return out[: out.index(eos) + 1] if eos in out else out


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
def test_requests_joining_and_leaving_decode_as_alone(name: str) -> None:
    model = model_of(name)
    texts = prompts(model.config.vocab_size, [5, 9, 3, 14, 7, 1])
    budgets = [12, 5, 20, 8, 15, 10]
    requests = [Request(p, k) for p, k in zip(texts, budgets, strict=True)]
    batch = ContinuousBatch(model)
    batch.add(requests[:2])
    batch.step()
    batch.step()
    batch.add(requests[2:4])  # join a batch two steps in, one longer and one shorter than it
    sizes = []
    for _ in range(3):
        batch.step()
        sizes.append(len(batch))
    batch.add(requests[4:])
    while len(batch):
        batch.step()
    assert sizes == [4, 3, 3]  # the 5-token request left after its fifth token
    for request, prompt, new in zip(requests, texts, budgets, strict=True):
        assert request.tokens == alone(model, prompt, new)
        assert request.finish_reason == "length"


def test_end_tokens_cancellation_and_trimmed_padding() -> None:
    model = model_of("gpt-tiny")
    long, short = prompts(model.config.vocab_size, [40, 2])
    reference = alone(model, short, 30)
    eos = reference[6]
    streamed: list[int] = []
    first = Request(long, 30)
    ending = Request(short, 30, eos=[eos], on_token=streamed.append)
    cancelled = Request(short, 30)
    batch = ContinuousBatch(model)
    batch.add([first, ending, cancelled])
    assert batch.cache is not None and len(batch.cache) == 40  # the short prompts padded to the long one
    batch.step()
    batch.remove([first, cancelled])  # the long prompt's client went away
    assert len(batch.cache) < 40 - TRIM_AT  # padding no row reads is cut off
    while len(batch):
        batch.step()
    stop = reference.index(eos) + 1
    assert ending.tokens == streamed == reference[:stop] and ending.finish_reason == "stop"
    assert first.finish_reason is None and len(first.tokens) == 2


def test_sampled_requests_equal_seeded_generate() -> None:
    model = model_of("llama-tiny")
    texts = prompts(model.config.vocab_size, [4, 11, 6])
    eos = [model.config.eos_token_id]
    requests = [
        Request(p, 9, eos=eos, choose=sampler(0.8, None, 0.9, torch.Generator().manual_seed(seed)))
        for seed, p in enumerate(texts)
    ]
    greedy = Request(texts[0], 9, eos=eos)
    batch = ContinuousBatch(model)
    batch.add([requests[0], greedy])
    batch.step()
    batch.add(requests[1:])
    while len(batch):
        batch.step()
    for seed, (request, prompt) in enumerate(zip(requests, texts, strict=True)):
        assert request.tokens == alone(model, prompt, 9, do_sample=True, temperature=0.8, top_p=0.9, seed=seed)
    assert greedy.tokens == alone(model, texts[0], 9)


def test_bad_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="decoder-only"):
        ContinuousBatch(model_of("transformer-tiny"))
    batch = ContinuousBatch(model_of("gpt-tiny"))
    with pytest.raises(ValueError, match="at least one token"):
        batch.add([Request([], 3)])
    assert len(batch) == 0
