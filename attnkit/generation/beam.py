"""Beam search: the loop of [alg:att-decode] carrying the k most probable prefixes of each
example instead of one ("beam search generalizes it by carrying the B most probable
prefixes"; the chapter's B is ``num_beams`` = k here, B is the batch).

Every step scores all k·V one-token extensions of an example's live prefixes by their
accumulated log-probability, keeps the best, moves those ending in EOS to a per-example
list of finished hypotheses (scored with a length penalty) and continues the rest. The
selection rules are Hugging Face's (``GenerationMixin._beam_search``), so that
``length_penalty_style="power"`` reproduces ``transformers``' beam search token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.generation.greedy import EndTokens, is_end
from attnkit.generation.incremental import IncrementalModel
from attnkit.generation.ngrams import Constraint

NEG_INF = float("-inf")


TOP_CHUNK = 64  # the columns :func:`top` takes the maximum of at a time


def top(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``x.topk(n, dim=1)`` of a wide ``x`` (rows, width), best first: the values and their columns.

    torch's top-k sorts its way through every column: at (32, 128,000), a batch of 32 sentences'
    4 beams x 32,000 words, it took 4.5 ms a step here. The n best of a row lie in the n chunks of
    ``TOP_CHUNK`` columns whose maxima are largest (a value in any other chunk has n chunks'
    maxima, n other values, at least as large), so the maxima, one pass, pick n chunks, and the top
    n of their n x 64 values are the row's: 0.65 ms."""
    rows, width = x.shape
    if n * TOP_CHUNK >= width:
        return x.topk(n, dim=1)
    whole = width - width % TOP_CHUNK
    maxima = x[:, :whole].view(rows, -1, TOP_CHUNK).amax(-1)  # (rows, width // 64)
    if whole < width:  # the last, shorter chunk
        maxima = torch.cat([maxima, x[:, whole:].amax(-1, keepdim=True)], dim=1)
    chunks = maxima.topk(n, dim=1).indices  # (rows, n)
    columns = (chunks[:, :, None] * TOP_CHUNK + torch.arange(TOP_CHUNK, device=x.device)).view(rows, -1)
    values = x.gather(1, columns.clamp(max=width - 1)).masked_fill_(columns >= width, NEG_INF)  # (rows, n·64)
    best, at = values.topk(n, dim=1)
    return best, columns.gather(1, at)


def length_penalty_factor(length: int, alpha: float, style: str) -> float:
    """The divisor of a finished hypothesis's log-probability, for ``length`` = |Y| = new
    tokens, EOS included (the prompt or start token not counted, as in transformers).

    ``"gnmt"``: ((5 + |Y|) / 6)^α (Wu et al. 2016, eq. 14); ``"power"``: |Y|^α (transformers,
    fairseq). α = 0 is no penalty; α > 0 favours longer hypotheses (log-probabilities are
    negative, so a larger divisor raises the score).
    """
    if style == "gnmt":
        return ((5 + length) / 6) ** alpha
    if style == "power":
        return length**alpha  # int ** float, the same Python float transformers divides by
    raise ValueError(f"length_penalty_style must be 'gnmt' or 'power', got {style!r}")


@dataclass
class Beams:
    """The search state of B examples × k beams. ``T`` = max_new_tokens; token buffers hold
    the new tokens only and ``pad_token_id`` past each prefix's end."""

    tokens: Tensor  # (B, k, T) live prefixes; after step t, positions 0..t are set
    scores: Tensor  # (B, k) accumulated log p of each live prefix, best first; -inf = empty slot
    finished_tokens: Tensor  # (B, k, T) best k finished hypotheses of each example, best first
    finished_scores: Tensor  # (B, k) their length-penalised scores; -inf = empty slot
    finished_lengths: Tensor  # (B, k) their lengths |Y| (EOS included)
    done: Tensor  # (B,) no further candidate can enter this example's finished list

    @classmethod
    def start(cls, batch: int, k: int, max_new_tokens: int, pad_token_id: int, device: torch.device) -> Beams:
        tokens = torch.full((batch, k, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        scores = torch.zeros(batch, k, device=device)
        # Every row starts from the same prefix: only beam 0 is live at the first step, or the
        # k copies would propose the same k·V candidates k times and fill the beam with duplicates.
        scores[:, 1:] = NEG_INF
        return cls(
            tokens=tokens,
            scores=scores,
            finished_tokens=tokens.clone(),
            finished_scores=torch.full((batch, k), NEG_INF, device=device),
            finished_lengths=torch.zeros(batch, k, dtype=torch.long, device=device),
            done=torch.zeros(batch, dtype=torch.bool, device=device),
        )

    def add_finished(self, tokens: Tensor, scores: Tensor, length: int) -> None:
        """Merge candidates ``tokens`` (B, n, T) with penalised ``scores`` (B, n) (-inf: not a
        candidate) into each example's finished list, keeping its best k."""
        k = self.finished_scores.shape[1]
        merged = torch.cat([self.finished_scores, scores], dim=1)  # (B, k + n)
        self.finished_scores, keep = merged.topk(k, dim=1)  # (B, k), sorted: best first
        lengths = torch.cat([self.finished_lengths, self.finished_lengths.new_full(scores.shape, length)], dim=1)
        self.finished_lengths = lengths.gather(1, keep)
        merged_tokens = torch.cat([self.finished_tokens, tokens], dim=1)  # (B, k + n, T)
        self.finished_tokens = merged_tokens.gather(1, keep[:, :, None].expand(-1, -1, tokens.shape[2]))

    def select(self, examples: Tensor) -> Beams:
        """The state of ``examples`` (B',) only."""
        return Beams(*(getattr(self, f).index_select(0, examples) for f in self.__dataclass_fields__))


# Batched beam search as one loop (expand, score, select, finish, shrink), kept whole so the
# step reads as the algorithm does; its parameters are the decoding options it honours.
@torch.no_grad()
def beam_search(
    model: IncrementalModel,
    num_beams: int,
    max_new_tokens: int,
    eos_token_id: EndTokens,
    pad_token_id: int,
    length_penalty: float,
    length_penalty_style: str,
    early_stopping: bool,
    budget: Tensor | None,
    constraint: Constraint | None = None,
) -> Tensor:
    """Beam search with ``num_beams`` = k beams per example, the generalisation of the greedy
    loop of [alg:att-decode] (k = 1 is greedy decoding). ``model`` holds k rows per example,
    example-major (rows b·k .. b·k + k - 1 are example b's beams). Returns each example's best
    hypothesis's new tokens (B, ≤ max_new_tokens), padded with ``pad_token_id`` after its EOS.

    - Scores are accumulated log-probabilities (float32); a finished hypothesis of |Y| new
      tokens (EOS included) scores log p(Y) / lp(|Y|), lp from :func:`length_penalty_factor` with
      α = ``length_penalty`` and ``length_penalty_style``.
    - Each step keeps the 2k best extensions of an example (over its beams × vocabulary). Of
      these, one ending in EOS becomes a finished hypothesis only if it ranks among the first
      k (as in transformers); the live beam is the best k that do not end in EOS, so a
      finished hypothesis is never extended.
    - ``early_stopping=True``: an example is done once it has k finished hypotheses.
      ``early_stopping=False``: transformers' heuristic — done once it has k and the best live
      prefix, scored as if it ended now (log p / lp(current length)), does not beat the worst
      of them. A done example takes no further hypotheses (its rows keep stepping with the
      others: the batch shares one KV cache).
    - At ``max_new_tokens``, or at an example's ``budget`` (B,) cap on new tokens, the k best
      extensions of the step are finalised (ending in EOS or not), as transformers does at
      its max length, and the example is done.

    - ``constraint`` rewrites each step's log-probabilities (N, V) before the top-2k, given
      what each row has read, as transformers applies its logits processors after the
      log-softmax (banned tokens get -inf; the others are not renormalised).
    - An example that is done leaves the batch: its best hypothesis is kept and its k rows
      are dropped from the model in the same reorder that re-ranks the others' beams.

    Differences from transformers: empty slots are -inf rather than -1e9, so with a
    vocabulary smaller than 2k a dead slot never turns into a hypothesis; ``"gnmt"`` and
    ``budget`` are attnkit's.
    """
    k, T = num_beams, max_new_tokens
    logits = model.start()  # (B·k, V): [alg:att-decode] lines 1-6 for t = 1, on every row
    rows, V = logits.shape
    if rows % k:
        raise ValueError(f"the model holds {rows} rows, not a multiple of num_beams={k}")
    B = rows // k
    device = logits.device
    beams = Beams.start(B, k, T, pad_token_id, device)
    best = torch.full((B, T), pad_token_id, dtype=torch.long, device=device)  # each example's result
    best_lengths = torch.zeros(B, dtype=torch.long, device=device)
    examples = torch.arange(B, device=device)  # (B',): the example of each one still searched
    # Keep 2k candidates: up to k of them (at most one per beam, each beam has one EOS) may end
    # in EOS and leave the beam, so 2k guarantees k live continuations remain.
    n_candidates = min(2 * k, k * V)
    last = torch.full((B,), T, dtype=torch.long, device=device)  # (B',): each example's cap on |Y|
    if budget is not None:
        last = last.minimum(budget.to(device=device, dtype=torch.long).view(B))
    # (N, V) float32 buffers reused by every step: a fresh one costs more than the softmax
    # (measured here, 128 x 32k: page faults on 16 MB took up to 11 ms, the softmax 1 ms); logits
    # of another dtype are widened into one of them first.
    log_p_buffer = torch.empty(rows, V, device=device)
    wide = torch.empty(rows, V, device=device) if logits.dtype != torch.float32 else None
    for t in range(T):  # 3: for t = 1 .. T_max
        B = examples.shape[0]
        length = t + 1  # |Y| of every candidate of this step
        divisor = length_penalty_factor(length, length_penalty, length_penalty_style)  # lp(|Y|)
        # 6: p <- softmax(...), as log-probabilities added to each prefix's (beams x vocabulary)
        widened = logits if wide is None else wide[: B * k].copy_(logits)  # (B·k, V) in float32
        log_p = torch.log_softmax(widened, dim=-1, out=log_p_buffer[: B * k])  # (B·k, V)
        if constraint is not None:
            read = torch.cat([model.prompt, beams.tokens[:, :, :t].reshape(B * k, t)], dim=1)  # (B·k, L)
            log_p = constraint(log_p, read, (last <= length).repeat_interleave(k))
        total = log_p.view(B, k, V).add_(beams.scores[:, :, None]).view(B, k * V)  # (B, k·V), in place
        # 7: the argmax becomes a top-2k, over all k·V extensions of an example at once
        cand_scores, flat = top(total, n_candidates)  # (B, 2k), best first
        cand_beams = torch.div(flat, V, rounding_mode="floor")  # (B, 2k): which prefix it extends
        cand_tokens = flat - cand_beams * V  # (B, 2k): with which token

        # 9: if y_t = EOS, the hypothesis ends; at the length cap, every candidate ends.
        at_cap = (last <= length)[:, None]  # (B, 1)
        ends = at_cap if eos_token_id is None else at_cap | is_end(cand_tokens, eos_token_id)  # (B, 2k) or (B, 1)
        ends = ends.expand(B, n_candidates)

        # Finished: ending candidates among the first k, of examples still taking hypotheses.
        new = ends[:, :k] & (cand_scores[:, :k] > NEG_INF) & ~beams.done[:, None]  # (B, k)
        if bool(new.any()):
            penalised = cand_scores[:, :k] / divisor  # log p(Y) / lp(|Y|)
            prefixes = beams.tokens.gather(1, cand_beams[:, :k, None].expand(-1, -1, T))  # (B, k, T)
            prefixes[:, :, t] = cand_tokens[:, :k]  # 8: append y_t
            beams.add_finished(prefixes, penalised.masked_fill(~new, NEG_INF), length)

        # Live: the best k candidates that did not end (an EOS-ended one never re-enters).
        beams.scores, keep = cand_scores.masked_fill(ends, NEG_INF).topk(k, dim=1)  # (B, k)
        parents = cand_beams.gather(1, keep)  # (B, k): each new beam's prefix
        tokens = cand_tokens.gather(1, keep).masked_fill(beams.scores == NEG_INF, pad_token_id)  # (B, k)
        beams.tokens = beams.tokens.gather(1, parents[:, :, None].expand(-1, -1, T))
        beams.tokens[:, :, t] = tokens  # 8: append y_t

        full = beams.finished_scores[:, -1] > NEG_INF  # (B,): k finished hypotheses (sorted: last slot)
        if early_stopping:
            beams.done |= full
        else:
            best_live = beams.scores[:, 0] / divisor  # the best live prefix as if it ended now
            beams.done |= full & (best_live <= beams.finished_scores[:, -1])
        beams.done |= at_cap[:, 0]
        if bool(beams.done.any()):  # keep the results of the examples that are done
            done = beams.done.nonzero().squeeze(1)
            best[examples[done]] = beams.finished_tokens[done, 0]
            best_lengths[examples[done]] = beams.finished_lengths[done, 0]
            if done.shape[0] == B:
                break
            remain = (~beams.done).nonzero().squeeze(1)  # (B',)
            beams, examples, last = beams.select(remain), examples[remain], last[remain]
            parents, tokens = parents[remain], tokens[remain]
            first_row = remain[:, None] * k  # (B', 1): the model's row of each remaining example's beam 0
        else:
            first_row = torch.arange(B, device=device)[:, None] * k
        if k > 1 or first_row.shape[0] < B:
            model.reorder((parents + first_row).view(-1))  # rows of the model, within each example
        logits = model.step(tokens.view(-1))  # 4-6: only the new position goes through the stack
    return best[:, : max(int(best_lengths.max()), 1)]
