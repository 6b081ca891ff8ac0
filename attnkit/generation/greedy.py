"""Greedy decoding [alg:att-decode], and sampling, which is the same loop with a random
choice in place of the argmax."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from attnkit.generation.incremental import IncrementalModel
from attnkit.generation.ngrams import Constraint

Choose = Callable[[Tensor], Tensor]  # next-token logits (N, vocab) -> chosen tokens (N,)


EndTokens = int | Tensor | None  # one end token, several (a (E,) tensor), or none


def is_end(tokens: Tensor, eos: EndTokens) -> Tensor:
    """Which of ``tokens`` are an end token (bool, same shape)."""
    if eos is None:
        return torch.zeros_like(tokens, dtype=torch.bool)
    return tokens == eos if isinstance(eos, int) else torch.isin(tokens, eos)


def argmax(logits: Tensor) -> Tensor:
    """Line 7 of [alg:att-decode]: argmax_v p_v. The softmax of line 6 is monotone, so the
    argmax of the logits is the argmax of p (no softmax is computed). bf16 logits are widened
    first: the exact same order, and torch's fp32 argmax is 5x faster than its bf16 one."""
    return logits.float().argmax(dim=-1)


# Finished rows leave the batch once they are a quarter of the rows still stepping: dropping
# copies every layer's cache, so it waits until it saves more than it costs.
DROP_FRACTION = 0.25


def decode_one_path(
    model: IncrementalModel,
    max_new_tokens: int,
    eos_token_id: EndTokens,
    pad_token_id: int,
    choose: Choose = argmax,
    budget: Tensor | None = None,
    constraint: Constraint | None = None,
    streamer: Callable[[Tensor], None] | None = None,
) -> Tensor:
    """The loop of [alg:att-decode], numbered as the chapter numbers it; returns the new tokens
    (N, ≤ max_new_tokens), rows that finished early padded with ``pad_token_id``.

    ``budget`` (N,): a per-row cap on new tokens (source length + offset), on top of
    ``max_new_tokens``. ``constraint`` rewrites the logits before each choice (banned tokens
    to -inf: :func:`attnkit.generation.ngrams.no_repeat_ngram`). Rows that finished are dropped
    from the batch (``DROP_FRACTION``), so a batch costs what its unfinished rows cost (not
    when the step is compiled: they keep stepping, their tokens discarded).
    ``streamer`` is called with each step's tokens (N,) as soon as they are chosen (finished
    rows: ``pad_token_id``).
    """
    # 1: H_enc <- Encoder(x), once (IncrementalModel did it); 2: y <- (BOS)
    # 4-6 for t = 1: embed y, add positions, run the decoder stack, p <- softmax(W z_t + b)
    logits = model.start()
    N = logits.shape[0]
    out = torch.full((N, max_new_tokens), pad_token_id, dtype=torch.long, device=logits.device)
    rows = torch.arange(N, device=logits.device)  # (n,): the output row of each row still stepping
    finished = torch.zeros(N, dtype=torch.bool, device=logits.device)  # (n,)
    for t in range(max_new_tokens):  # 3: for t = 1 .. T_max
        if constraint is not None:
            final = torch.full_like(finished, t + 1 == max_new_tokens)  # (n,): cut after this token
            if budget is not None:
                final |= budget[rows] <= t + 1
            logits = constraint(logits, torch.cat([model.prompt, out[rows, :t]], dim=1), final)
        token = choose(logits)  # 7: y_t <- argmax_v p_v (or a sample)
        token = torch.where(finished, pad_token_id, token)
        out[rows, t] = token  # 8: append y_t to y
        if streamer is not None:
            streamer(out[:, t])
        finished |= is_end(token, eos_token_id)  # 9: if y_t = EOS, break
        if budget is not None:
            finished |= budget[rows] <= t + 1
        done = int(finished.sum())
        if done == rows.shape[0]:
            return out[:, : t + 1]
        if t + 1 == max_new_tokens:
            break
        if done >= DROP_FRACTION * rows.shape[0] and not model.compiled:  # a compiled step keeps its shapes
            keep = (~finished).nonzero().squeeze(1)  # (n',)
            model.reorder(keep)
            rows, token, finished = rows[keep], token[keep], finished[keep]
        logits = model.step(token)  # 4-6: only the new position goes through the stack
    return out


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to -inf every logit outside the top ``top_k``, then outside the smallest set of
    tokens whose probability mass reaches ``top_p`` (nucleus sampling)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits.float(), dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # what the more likely tokens already cover
        drop_sorted = mass_before >= top_p  # the first token is always kept (mass_before = 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sampler(temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator) -> Choose:
    """A choice that samples from softmax(logits / temperature), restricted by top-k and top-p."""

    def choose(logits: Tensor) -> Tensor:
        probs = torch.softmax(filter_logits(logits / temperature, top_k, top_p).float(), dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    return choose
