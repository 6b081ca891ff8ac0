"""The decoding options of :func:`attnkit.generation.generate`, checked once when they are made.

What a decoding run is asked for (length, beams, sampling, end and pad tokens, constraints) is
one frozen value, valid from the moment it exists: :func:`~attnkit.generation.generate` makes it
from its arguments, :meth:`DecodingOptions.over` from a checkpoint's ``generation_config.json``
options (``Model.generation_defaults``) and the arguments given, which win, as ``transformers``
takes them. What depends on the model or the input (ids inside the vocabulary, the context's
room, a tokenizer for the word n-grams or a grammar) is checked where the decoding starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from attnkit.generation.grammar import Grammar


@dataclass(frozen=True)
class DecodingOptions:
    """Every option of :func:`~attnkit.generation.generate` but the model's collaborators
    (``tokenizer``, ``streamer``): see it for what each does. ``eos_token_id`` may hold several
    end tokens (kept as a tuple, as ``bad_words_ids`` keeps its words)."""

    max_new_tokens: int | None = None
    max_length: int | None = None
    num_beams: int = 1
    length_penalty: float = 0.0
    length_penalty_style: Literal["gnmt", "power"] = "gnmt"
    early_stopping: bool = True
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    seed: int | None = None
    source_length_offset: int | None = None
    no_repeat_ngram_size: int | None = None
    no_repeat_ngram_unit: Literal["token", "word"] = "token"
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None
    bad_words_ids: tuple[tuple[int, ...], ...] | None = None
    grammar: Grammar | dict[str, Any] | None = None
    compile: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if isinstance(self.bad_words_ids, list):
            words = tuple(tuple(w) if isinstance(w, list) else w for w in self.bad_words_ids)
            object.__setattr__(self, "bad_words_ids", words)
        self._check_search()
        self._check_constraints()

    def _check_search(self) -> None:
        """Length, beams and sampling."""
        if self.max_new_tokens is not None and not _positive_int(self.max_new_tokens):
            raise OptionError("{max_new_tokens} must be an integer >= 1, got {got!r}", got=self.max_new_tokens)
        if not _positive_int(self.num_beams):
            raise OptionError("{num_beams} must be an integer >= 1, got {got!r}", got=self.num_beams)
        for name, value in (("length_penalty", self.length_penalty), ("temperature", self.temperature)):
            if not math.isfinite(value):  # the template names the option: "{length_penalty} must be ..."
                raise OptionError(f"{{{name}}} must be a finite number, got {{got}}", got=value)
        if self.length_penalty_style not in ("gnmt", "power"):
            raise OptionError(
                "{length_penalty_style} must be 'gnmt' or 'power', got {got!r}", got=self.length_penalty_style
            )
        if self.do_sample and self.num_beams > 1:
            raise OptionError(
                "sampling ({do_sample}) draws one path per input; set {num_beams} to 1 (got {got})", got=self.num_beams
            )
        if self.do_sample and not self.temperature > 0:
            raise OptionError("{temperature} must be > 0 when sampling, got {got}", got=self.temperature)
        if self.top_k is not None and not _positive_int(self.top_k):
            raise OptionError("{top_k} must be an integer >= 1, got {got!r}", got=self.top_k)
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise OptionError("{top_p} must be in (0, 1], got {got}", got=self.top_p)
        if self.compile not in (True, False, "auto"):
            raise OptionError("{compile} must be True, False or 'auto', got {got!r}", got=self.compile)

    def _check_constraints(self) -> None:
        """The n-gram ban and the source-length cap."""
        size = self.no_repeat_ngram_size
        if size is not None and not _positive_int(size):
            raise OptionError("{no_repeat_ngram_size} must be an integer >= 1, got {got!r} (3 is usual)", got=size)
        if self.no_repeat_ngram_unit not in ("token", "word"):
            raise OptionError(
                "{no_repeat_ngram_unit} must be 'token' or 'word', got {got!r}", got=self.no_repeat_ngram_unit
            )
        if self.no_repeat_ngram_unit == "word" and size is None:
            raise OptionError(
                "{no_repeat_ngram_unit} is the unit of {no_repeat_ngram_size}, which is not set; set both (3 is usual)"
            )
        if self.source_length_offset is not None and self.source_length_offset < 0:
            raise OptionError("{source_length_offset} must be >= 0, got {got}", got=self.source_length_offset)

    @classmethod
    def over(cls, defaults: Mapping[str, Any], **given: Any) -> DecodingOptions:
        """The options ``given``, and for those left out the checkpoint's ``defaults`` (its
        ``generation_config.json``, as :func:`attnkit.models.generation_config.read_generation_config`
        reads it), as ``transformers`` takes them: a ``max_new_tokens`` given also sets aside
        the file's ``max_length``."""
        if "max_new_tokens" in given:
            defaults = {k: v for k, v in defaults.items() if k != "max_length"}
        return cls(**{**defaults, **given})

    @classmethod
    def named(cls, names: Mapping[str, str], defaults: Mapping[str, Any], **given: Any) -> DecodingOptions:
        """:meth:`over`, refusing an option out of its range in the words of whoever gave it:
        ``names`` spells each option as its user wrote it (a command's ``--max-new-tokens``)."""
        try:
            return cls.over(defaults, **given)
        except OptionError as err:
            raise ValueError(err.spelled(names)) from None

    def but(self, **changes: Any) -> DecodingOptions:
        """These options with ``changes`` (a batch's seed, a turn's length), checked again."""
        return replace(self, **changes)

    @property
    def ends(self) -> tuple[Any, ...]:
        """The end tokens asked for, as a tuple (empty: the config's, if any)."""
        eos = self.eos_token_id
        return (eos,) if isinstance(eos, int) else tuple(eos or ())

    def end_tokens(self, config_eos: int | None) -> tuple[int, ...]:
        """The tokens a decoding ends at: those asked for, else the model config's one."""
        return self.ends or (() if config_eos is None else (config_eos,))


# The keyword arguments of generate() that are decoding options.
OPTION_NAMES = frozenset(f.name for f in fields(DecodingOptions))


class OptionError(ValueError):
    """A decoding option out of its range. The message is a template over the options' names
    (``"{max_new_tokens} must be ..."``), so that each caller can name them its own way
    (:meth:`DecodingOptions.named`); as a ValueError it names them as ``generate`` does."""

    def __init__(self, template: str, **values: Any) -> None:
        self.template, self.values = template, values
        super().__init__(self.spelled({}))

    def spelled(self, names: Mapping[str, str]) -> str:
        """The message, each option called as ``names`` call it (else by its own name)."""
        return self.template.format_map({**{name: names.get(name, name) for name in OPTION_NAMES}, **self.values})


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
