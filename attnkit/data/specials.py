"""The special tokens, defined once for every tokenizer attnkit trains and every objective."""

from __future__ import annotations

from dataclasses import dataclass

PAD, BOS, EOS, UNK, MASK = "<pad>", "<s>", "</s>", "<unk>", "<mask>"
N_SENTINELS = 32  # T5's span-corruption sentinels <extra_id_0> .. <extra_id_31>


def sentinel(i: int) -> str:
    return f"<extra_id_{i}>"


SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK, MASK, *(sentinel(i) for i in range(N_SENTINELS)))


@dataclass(frozen=True)
class Specials:
    """Ids of the special tokens in one vocabulary. ``bos`` doubles as BERT's [CLS] and the
    decoder's start token, ``eos`` as BERT's [SEP]; ``sentinels[i]`` is ``<extra_id_i>``."""

    vocab_size: int
    pad: int = 0
    bos: int = 1
    eos: int = 2
    unk: int = 3
    mask: int = 4
    sentinels: tuple[int, ...] = tuple(range(5, 5 + N_SENTINELS))

    def __post_init__(self) -> None:
        ids = (self.pad, self.bos, self.eos, self.unk, self.mask, *self.sentinels)
        if len(set(ids)) != len(ids) or not all(0 <= i < self.vocab_size for i in ids):
            raise ValueError(f"special token ids must be distinct and inside the vocabulary [0, {self.vocab_size})")

    @property
    def all(self) -> frozenset[int]:
        return frozenset((self.pad, self.bos, self.eos, self.unk, self.mask, *self.sentinels))


@dataclass(frozen=True)
class ModelSpecials:
    """The special ids a pretrained model's config names, for fine-tuning it with its own
    tokenizer (not attnkit's): what the causal-LM objective reads (``bos`` may be ``eos``, as
    GPT-2's both are <|endoftext|>); no mask token or sentinels."""

    vocab_size: int
    pad: int
    bos: int
    eos: int
    unk: int = -1  # none

    @property
    def all(self) -> frozenset[int]:
        return frozenset((self.pad, self.bos, self.eos))
