"""Continuous batching: requests joining a running batch at different steps, leaving it at
different steps, cancelled or trimmed, each decode exactly as ``model.generate`` decodes that
prompt alone (greedy and seeded sampling), for learned and rotary positions; the scores of
chosen and prompt tokens against one full forward pass, equal prompts prefilled once, a prompt
only scored, and the penalties against a loop that applies OpenAI's formula by hand."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit.generation.continuous import ContinuousBatch, Request
from attnkit.generation.greedy import sampler
from attnkit.generation.penalties import penalties


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
    ending = Request(short, 30, eos=[eos], on_token=lambda token, _: streamed.append(token))
    cancelled = Request(short, 30)
    batch = ContinuousBatch(model)
    batch.add([first, ending, cancelled])
    assert batch.cache is not None and len(batch.cache) == 40  # the short prompts right-aligned with the long one
    assert len(batch.rows) == 4 and batch.cache.capacity == 128  # powers of two, room for 32 steps
    batch.step()
    batch.remove([first, cancelled])  # the long prompt's client went away
    assert len(batch.rows) == 1 and len(batch.cache) == 3  # laid out anew: the positions no row reads dropped
    assert batch.cache.capacity == 64
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


def full_logprobs(model: attnkit.models.Model, ids: list[int]) -> torch.Tensor:
    """log p(token t + 1 | tokens <= t) for every position of ``ids``, by one forward pass (T, vocab)."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_scores_equal_one_full_forward_pass() -> None:
    model = model_of("llama-tiny")
    texts = prompts(model.config.vocab_size, [6, 13, 3])
    scored = Request(texts[0], 7, top_logprobs=3, prompt_logprobs=2)
    bystanders = [Request(texts[1], 5), Request(texts[2], 9, top_logprobs=0)]
    batch = ContinuousBatch(model)
    batch.add([scored, bystanders[0]])  # padded beside a longer prompt
    batch.step()
    batch.add(bystanders[1:])
    while len(batch):
        batch.step()
    for request, k in ((scored, 3), (bystanders[1], 0)):
        sequence = [*request.prompt, *request.tokens]
        oracle = full_logprobs(model, sequence)
        new = range(len(request.prompt) - 1, len(sequence) - 1)  # positions predicting the new tokens
        picked = torch.tensor([s.logprob for s in request.scores])
        torch.testing.assert_close(picked, oracle[list(new), request.tokens], atol=1e-4, rtol=1e-4)
        for position, s in zip(new, request.scores, strict=True):
            assert [i for i, _ in s.top] == oracle[position].topk(k).indices.tolist()
            torch.testing.assert_close(torch.tensor([v for _, v in s.top]), oracle[position].topk(k).values,
                                       atol=1e-4, rtol=1e-4)  # fmt: skip
    assert bystanders[0].scores == [] and bystanders[0].prompt_scores == []
    prompt_oracle = full_logprobs(model, list(scored.prompt))
    assert scored.prompt_scores[0] is None and len(scored.prompt_scores) == len(scored.prompt)
    picked = torch.tensor([s.logprob for s in scored.prompt_scores[1:]])
    torch.testing.assert_close(picked, prompt_oracle[range(len(scored.prompt) - 1), scored.prompt[1:]],
                               atol=1e-4, rtol=1e-4)  # fmt: skip
    assert [[i for i, _ in s.top] for s in scored.prompt_scores[1:]] == prompt_oracle[:-1].topk(2).indices.tolist()


def test_equal_prompts_are_prefilled_once_and_a_prompt_can_only_be_scored() -> None:
    model = model_of("gpt-tiny")
    prompt = prompts(model.config.vocab_size, [8])[0]
    choices = [
        Request(prompt, 6, choose=sampler(1.0, None, None, torch.Generator().manual_seed(seed))) for seed in range(3)
    ]
    scored_only = Request(prompt, 0, prompt_logprobs=1)
    rows: list[int] = []
    hook = model.embeddings.register_forward_hook(lambda module, args, out: rows.append(out.shape[0]))
    try:
        batch = ContinuousBatch(model)
        finished = batch.add([*choices, scored_only])
    finally:
        hook.remove()
    assert rows == [1]  # one prefill row for four requests of one prompt
    assert finished == [scored_only] and scored_only.tokens == [] and scored_only.finish_reason == "length"
    assert len(scored_only.prompt_scores) == len(prompt)
    while len(batch):
        batch.step()
    for seed, request in enumerate(choices):
        assert request.tokens == alone(model, prompt, 6, do_sample=True, temperature=1.0, seed=seed)[:6]


def test_penalties_follow_openais_formula() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    adjust = penalties(frequency=0.5, presence=0.25, bias={0: 10.0, 3: -100.0})
    assert adjust is not None
    expected = torch.tensor([11.0, 2.0 - 2 * 0.5 - 0.25, 3.0 - 0.5 - 0.25, -96.0])
    torch.testing.assert_close(adjust(logits, [1, 2, 1]), expected)
    assert penalties() is None and penalties(0.0, 0.0, {}) is None


def test_penalised_greedy_equals_a_loop_by_hand() -> None:
    model = model_of("gpt-tiny")
    prompt = prompts(model.config.vocab_size, [5])[0]
    frequency, presence, bias = 1.5, 0.5, {7: 3.0}
    request = Request(prompt, 10, adjust=penalties(frequency, presence, bias))
    batch = ContinuousBatch(model)
    batch.add([request, Request(prompts(model.config.vocab_size, [9])[0], 10)])
    while len(batch):
        batch.step()
    expected: list[int] = []
    for _ in range(10):
        with torch.no_grad():
            logits = model(torch.tensor([[*prompt, *expected]])).logits[0, -1].float()
        for token in set(expected):
            logits[token] -= frequency * expected.count(token) + presence
        logits[7] += 3.0
        expected.append(int(logits.argmax()))
    assert request.tokens == expected
    assert request.tokens != alone(model, prompt, 10)  # the penalties changed the choice


def test_a_request_whose_adjustment_fails_ends_alone() -> None:
    """An ``adjust`` that raises (a grammar that allows no token) ends its own request with the
    reason, without the token; the batch's other requests decode as alone."""
    model = model_of("gpt-tiny")
    texts = prompts(model.config.vocab_size, [4, 6])

    def failing(logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
        if len(tokens) == 3:
            raise ValueError("the regex leaves no token allowed after 3 tokens")
        return logits

    broken, fine = Request(texts[0], 10, adjust=failing), Request(texts[1], 10)
    batch = ContinuousBatch(model)
    batch.add([broken, fine])
    while len(batch):
        batch.step()
    assert broken.finish_reason == "error" and broken.error == "the regex leaves no token allowed after 3 tokens"
    assert broken.tokens == alone(model, texts[0], 3)
    assert fine.tokens == alone(model, texts[1], 10) and fine.finish_reason == "length"
