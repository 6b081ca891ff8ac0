"""Span corruption, T5's objective in [tab:att-families] (Raffel et al. 2020, §3.1.4)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from attnkit.data.specials import Specials
from attnkit.models.core import Model
from attnkit.objectives.base import Example, LossOutput, check_example, encoder_decoder_batch, encoder_decoder_loss


def random_segmentation(n_items: int, n_segments: int, generator: torch.Generator) -> list[int]:
    """A uniformly random split of ``n_items`` into ``n_segments`` non-empty lengths, in order
    (T5's ``_random_segmentation``: ``n_segments - 1`` distinct cut points among the gaps)."""
    cuts = sorted((torch.randperm(n_items - 1, generator=generator)[: n_segments - 1] + 1).tolist())
    bounds = [0, *cuts, n_items]
    return [b - a for a, b in itertools.pairwise(bounds)]


class SpanCorruption:
    """Mask contiguous spans and regenerate them with the decoder (T5's ``span_corruption``).

    For an example of L tokens: ``n_noise = round(L · noise_density)`` clipped to [1, L - 1];
    ``n_spans = max(1, round(n_noise / mean_span_length))``, capped at ``L - n_noise`` so every
    non-noise span stays non-empty (T5 does not cap; it matters only for densities near 1/2 or above).
    Noise and non-noise lengths are random segmentations; spans alternate, non-noise first,
    so the text ends in noise. With ``s_i`` the sentinel ``<extra_id_i>``:

        inputs  = N_0 s_0 N_1 s_1 ... N_{k-1} s_{k-1} eos
        targets = s_0 X_0 s_1 X_1 ... s_{k-1} X_{k-1} s_k eos

    the final sentinel ``s_k`` closing the targets as in the paper's Figure 2 (T5's code omits
    it). An example that would need more sentinels than the vocabulary has is refused with a
    ValueError rather than silently corrupted with fewer spans. ``round`` is half to even, as
    T5's ``tf.round``. Batches are built like :class:`~attnkit.objectives.translation.Translation`'s
    (``decoder_input_ids = [bos] + targets[:-1]``, ``labels = targets``); the loss is plain
    cross entropy, as in T5's pre-training.
    """

    name = "span_corruption"

    def __init__(self, specials: Specials, noise_density: float = 0.15, mean_span_length: float = 3.0) -> None:
        if not 0.0 < noise_density < 1.0:
            raise ValueError(f"noise_density must be in (0, 1), got {noise_density}")
        if mean_span_length < 1.0:
            raise ValueError(f"mean_span_length must be at least 1 token, got {mean_span_length}")
        self.specials, self.noise_density, self.mean_span_length = specials, noise_density, mean_span_length

    def counts(self, length: int) -> tuple[int, int]:
        """(noise tokens, noise spans) for an example of ``length`` tokens."""
        if length < 2:
            raise ValueError(f"span corruption needs examples of at least 2 tokens (one kept, one noise), got {length}")
        n_noise = min(max(round(length * self.noise_density), 1), length - 1)
        n_spans = min(max(round(n_noise / self.mean_span_length), 1), length - n_noise)
        available = len(self.specials.sentinels) - 1  # one sentinel closes the targets
        if n_spans > available:
            raise ValueError(
                f"an example of {length} tokens makes {n_spans} noise spans, but {len(self.specials.sentinels)} "
                f"sentinels allow at most {available}; split examples into shorter ones or raise mean_span_length"
            )
        return n_noise, n_spans

    def corrupt(self, tokens: Example, generator: torch.Generator) -> tuple[list[int], list[int]]:
        """``tokens`` -> (inputs, targets) as laid out in the class docstring, ``eos`` included."""
        check_example(tokens, self.specials)
        n_noise, n_spans = self.counts(len(tokens))
        noise_lengths = random_segmentation(n_noise, n_spans, generator)
        kept_lengths = random_segmentation(len(tokens) - n_noise, n_spans, generator)
        sentinels, inputs, targets, start = self.specials.sentinels, [], [], 0
        for i, (kept, noise) in enumerate(zip(kept_lengths, noise_lengths, strict=True)):
            inputs += [*tokens[start : start + kept], sentinels[i]]
            targets += [sentinels[i], *tokens[start + kept : start + kept + noise]]
            start += kept + noise
        return [*inputs, self.specials.eos], [*targets, sentinels[n_spans], self.specials.eos]

    def reconstruct(self, inputs: Sequence[int], targets: Sequence[int]) -> list[int]:
        """The exact inverse of :meth:`corrupt`: each sentinel of ``inputs`` replaced by the
        span that follows the same sentinel in ``targets``."""
        eos, index = self.specials.eos, {s: i for i, s in enumerate(self.specials.sentinels)}
        if not inputs or inputs[-1] != eos or not targets or targets[-1] != eos or targets[0] not in index:
            raise ValueError("inputs and targets must end with eos, and targets start with a sentinel")
        spans: list[list[int]] = []  # spans[i]: the tokens after sentinel i in targets
        for t in targets[:-1]:
            if t not in index:
                spans[-1].append(t)  # targets[0] is a sentinel, so there is a span to extend
            elif index[t] == len(spans):
                spans.append([])
            else:
                raise ValueError(f"targets hold sentinel <extra_id_{index[t]}> where <extra_id_{len(spans)}> is due")
        tokens: list[int] = []
        used = 0  # sentinels of inputs replaced so far
        for t in inputs[:-1]:
            if t not in index:
                tokens.append(t)
            elif index[t] == used and used < len(spans) - 1:
                tokens += spans[used]
                used += 1
            else:
                raise ValueError(f"inputs hold sentinel <extra_id_{index[t]}>, but targets have no span for it")
        if len(spans) != used + 1 or spans[-1]:
            raise ValueError(
                f"targets must hold the {used} spans of inputs and then only the closing sentinel <extra_id_{used}>"
            )
        return tokens

    def batch(self, examples: Sequence[Example], generator: torch.Generator) -> dict[str, Tensor]:
        """Examples -> corrupted (inputs, targets) -> the tensors of :func:`encoder_decoder_batch`."""
        pairs = [self.corrupt(x, generator) for x in examples]
        return encoder_decoder_batch([inputs for inputs, _ in pairs], [targets for _, targets in pairs], self.specials)

    def loss(self, model: Model, batch: dict[str, Tensor]) -> LossOutput:
        return encoder_decoder_loss(model, batch, self.specials, self.name)
