"""Decoding: greedy [alg:att-decode], beam search (its generalisation) and sampling, behind one
:func:`generate`, all on the key/value cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from attnkit.config import ModelConfig
from attnkit.generation.constraints import bad_words, chain, forced
from attnkit.generation.grammar import Grammar, compile_grammar, constrained
from attnkit.generation.greedy import decode_one_path, filter_logits, sampler
from attnkit.generation.incremental import IncrementalModel
from attnkit.generation.ngrams import Constraint, no_repeat_ngram, no_repeat_word_ngram, words_of
from attnkit.generation.options import OPTION_NAMES, DecodingOptions
from attnkit.models.core import Model, check_ids

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["DecodingOptions", "Grammar", "IncrementalModel", "filter_logits", "generate"]


def _new_tokens(cfg: ModelConfig, input_ids: Tensor, max_new_tokens: int | None, max_length: int | None) -> int:
    """``max_new_tokens``, else what ``max_length`` leaves after the prompt (decoder-only) or
    the start token (encoder-decoder), else 20."""
    if max_new_tokens is not None:
        return max_new_tokens
    if max_length is None:
        return 20
    read = 1 if cfg.is_encoder_decoder else input_ids.shape[1]
    if not isinstance(max_length, int) or max_length <= read:
        raise ValueError(
            f"max_length={max_length!r} leaves no room after the {read} tokens already read; pass max_new_tokens"
        )
    return max_length - read


def _check_call(
    model: Model,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    options: DecodingOptions,
    max_new_tokens: int,
    tokenizer: Tokenizer | None,
) -> None:
    """What ``options`` (checked when they were made) cannot know alone: the model, the input
    and the tokenizer they are used with."""
    cfg = model.config
    if cfg.family == "bert":
        raise ValueError("BERT is an encoder and does not generate; use attnkit fill-mask for [MASK] predictions")
    if (what := model.headless()) is not None:
        raise ValueError(f"this {cfg.family} model is {what} and does not generate; use attnkit classify")
    check_ids("input_ids", input_ids, cfg.vocab_size)
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, expected {tuple(input_ids.shape)} like input_ids"
        )
    if options.no_repeat_ngram_unit == "word" and tokenizer is None:
        raise ValueError(
            "no_repeat_ngram_unit='word' reads words with a tokenizer and this model has none; pass tokenizer= or "
            "set model.tokenizer (from_pretrained does, from the directory's tokenizer.json), or use 'token'"
        )
    if options.source_length_offset is not None and not cfg.is_encoder_decoder:
        raise ValueError("source_length_offset bounds a translation by its source; it needs an encoder-decoder")
    # The decoder's context (a decoder-only model sees prompt + continuation) bounds the request
    # before anything is allocated for it.
    needed = (0 if cfg.is_encoder_decoder else input_ids.shape[1]) + max_new_tokens
    if needed > cfg.max_len:
        prompt = "" if cfg.is_encoder_decoder else f"prompt of length {input_ids.shape[1]} plus "
        room = max(cfg.max_len - needed + max_new_tokens, 0)
        raise ValueError(
            f"{prompt}max_new_tokens={max_new_tokens} exceeds the model's context of {cfg.max_len} positions; "
            f"shorten the prompt or lower max_new_tokens (the context leaves room for {room})"
        )
    _check_token_ids(options, cfg)
    if options.grammar is not None and tokenizer is None:
        raise ValueError("grammar= reads the output's text through a tokenizer and this model has none; pass "
                         "tokenizer= or set model.tokenizer (from_pretrained does)")  # fmt: skip


def _check_token_ids(options: DecodingOptions, cfg: ModelConfig) -> None:
    """The token ids ``options`` name are inside the model's vocabulary, and an encoder–decoder
    has the start token its decoder begins with."""
    ends = options.ends
    for name, value in (("eos_token_id", ends[0] if ends else None), ("pad_token_id", options.pad_token_id)):
        if value is not None and not (isinstance(value, int) and 0 <= value < cfg.vocab_size):
            raise ValueError(f"{name} must be a token id in [0, {cfg.vocab_size}), got {value!r}")
    if cfg.is_encoder_decoder and cfg.decoder_start_token_id is None:
        raise ValueError("the model's config has no decoder_start_token_id; set it to the decoder's first token")
    words = [("bad_words_ids", i) for word in options.bad_words_ids or () for i in word]
    forced_ids = [
        ("forced_bos_token_id", options.forced_bos_token_id),
        ("forced_eos_token_id", options.forced_eos_token_id),
    ]
    for name, value in [*forced_ids, *(("eos_token_id", e) for e in ends[1:]), *words]:  # the first end: above
        if value is not None and not (isinstance(value, int) and 0 <= value < cfg.vocab_size):
            raise ValueError(f"{name} must hold token ids in [0, {cfg.vocab_size}), got {value!r}")


def _constraint(
    incremental: IncrementalModel, options: DecodingOptions, max_new_tokens: int, ends: list[int],
    tokenizer: Tokenizer | None,
) -> Constraint | None:  # fmt: skip
    """The constraints ``options`` ask for, in transformers' order: n-grams, bad words, forced
    first token, forced last token; then the grammar, last: it may leave only one token, which
    nothing after it may ban."""
    vocab_size = incremental.model.config.vocab_size
    constraints = []
    if options.no_repeat_ngram_size is not None:  # n-grams over what the decoder reads: the prompt or the start
        constraints.append(
            no_repeat_ngram(options.no_repeat_ngram_size)
            if options.no_repeat_ngram_unit == "token"
            else no_repeat_word_ngram(options.no_repeat_ngram_size, words_of(tokenizer, vocab_size))
        )
    if options.bad_words_ids:
        constraints.append(bad_words(options.bad_words_ids))
    read_before = incremental.prompt.shape[1]
    if options.forced_bos_token_id is not None:
        constraints.append(forced(options.forced_bos_token_id, 0, read_before))
    if options.forced_eos_token_id is not None:
        constraints.append(forced(options.forced_eos_token_id, max_new_tokens - 1, read_before))
    if options.grammar is not None:
        compiled = compile_grammar(options.grammar, tokenizer, vocab_size, ends)  # type: ignore[arg-type]
        constraints.append(constrained(compiled, read_before, max_new_tokens))
    return chain(constraints)


# The pinned signature (DESIGN.md) and what attnkit added, one keyword per option as transformers'
# generate() takes them: they become one DecodingOptions, checked once.
@torch.no_grad()
def generate(
    model: Model,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    max_new_tokens: int | None = None,
    num_beams: int = 1,
    length_penalty: float = 0.0,
    length_penalty_style: Literal["gnmt", "power"] = "gnmt",
    early_stopping: bool = True,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    seed: int | None = None,
    source_length_offset: int | None = None,
    no_repeat_ngram_size: int | None = None,
    no_repeat_ngram_unit: Literal["token", "word"] = "token",
    tokenizer: Tokenizer | None = None,
    max_length: int | None = None,
    forced_bos_token_id: int | None = None,
    forced_eos_token_id: int | None = None,
    bad_words_ids: list[list[int]] | None = None,
    streamer: Callable[[Tensor], None] | None = None,
    compile: bool | Literal["auto"] = "auto",
    grammar: Grammar | dict[str, Any] | None = None,
    options: DecodingOptions | None = None,
) -> Tensor:
    """Continue ``input_ids`` (decoder-only: returns prompt + continuation) or translate them
    (encoder–decoder: returns the decoder sequence, starting with its start token).

    ``num_beams=1`` is greedy decoding [alg:att-decode]; more beams is beam search with the
    length penalty ``((5+|Y|)/6)^α`` (``"gnmt"``, Wu et al. 2016, the paper's) or ``|Y|^α``
    (``"power"``, Hugging Face and fairseq), α = ``length_penalty``. ``do_sample`` samples
    from softmax(logits / temperature) with optional top-k and top-p, reproducibly with
    ``seed``. Sequences end at ``eos_token_id`` (default: the config's) and are padded with
    ``pad_token_id``; ``source_length_offset`` caps each translation at its source length +
    the offset. Decoder-only prompts may be left-padded (``attention_mask`` 0 on the left).
    ``no_repeat_ngram_size`` = n forbids any n-gram to occur twice in a row's sequence (prompt
    or start token included, as in ``transformers``), in every decoding mode; with
    ``no_repeat_ngram_unit="word"`` the n-grams are of the text's whitespace-separated words,
    read off ``tokenizer`` (default: ``model.tokenizer``, as :func:`attnkit.from_pretrained`
    sets it; :func:`attnkit.generation.ngrams.no_repeat_word_ngram`), which also catches a
    repeat spelt by other pieces.

    The options of a checkpoint's ``generation_config.json`` come in through
    :meth:`Model.generate`: ``max_length`` (prompt + continuation, or the decoder sequence with
    its start token) where ``max_new_tokens`` is not given (default 20 new tokens);
    ``eos_token_id`` may list several end tokens; ``forced_bos_token_id`` /
    ``forced_eos_token_id`` force the first / last new token; ``bad_words_ids`` are never
    completed. ``streamer`` (greedy and sampling) is called with each step's new tokens (N,)
    as they are chosen, for output shown while it is decoded.

    ``grammar`` constrains every row's new tokens to a grammar (:mod:`attnkit.generation.grammar`):
    a JSON schema (a dict, or :meth:`Grammar.json_schema`), :meth:`Grammar.regex` or
    :meth:`Grammar.lark`, read through ``tokenizer``; each step allows only the tokens that keep
    the output inside it, and an end token once it is complete, in every decoding mode. Near the
    end of ``max_new_tokens`` it allows only tokens after which the output can still be completed
    in the tokens left, and then completes it (:mod:`attnkit.generation.closing`): an output that
    would run out is closed in time, valid. Only one whose smallest completion does not fit is
    cut: check its end token.

    ``compile=True`` runs each step after the first as one compiled graph
    (:mod:`attnkit.generation.compiled`): the first call for a model and shape loads it from the
    disk (seconds) or compiles it (seconds to a minute, logged), later ones reuse it. Beam search
    compiled keeps every example's rows in the step to the end (re-ranked in place; an example
    that is done is fed a filler token), where eagerly its rows leave the batch.
    ``"auto"`` (the default) decodes eagerly until the eager seconds of a shape reach what its
    step costs to load, then moves onto it where it is in the compile cache; one that is not is
    compiled by a background process for a model :func:`~attnkit.from_pretrained` loaded
    (:mod:`attnkit.generation.background`), in this process for one built here once its eager
    seconds reach a compile's (decoder-only greedy and sampling, on the CPU with a C++ compiler;
    everything else eagerly): a short job is never slower than eager. ``False`` is always eager.

    The decoding options are checked once, as a :class:`DecodingOptions`
    (:mod:`attnkit.generation.options`), which ``options=`` may pass made instead of the arguments.
    """
    given = DecodingOptions(
        max_new_tokens=max_new_tokens, max_length=max_length, num_beams=num_beams, length_penalty=length_penalty,
        length_penalty_style=length_penalty_style, early_stopping=early_stopping, do_sample=do_sample,
        temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
        seed=seed, source_length_offset=source_length_offset, no_repeat_ngram_size=no_repeat_ngram_size,
        no_repeat_ngram_unit=no_repeat_ngram_unit, forced_bos_token_id=forced_bos_token_id,
        forced_eos_token_id=forced_eos_token_id, bad_words_ids=bad_words_ids, grammar=grammar, compile=compile,
    )  # fmt: skip
    if options is None:
        options = given
    elif given != _DEFAULT:
        raise ValueError("pass the decoding options either as options= or as arguments, not both")
    return _decode(model, input_ids, attention_mask, options, model.tokenizer if tokenizer is None else tokenizer,
                   streamer)  # fmt: skip


_DEFAULT = DecodingOptions()


def _decode(
    model: Model, input_ids: Tensor, attention_mask: Tensor | None, options: DecodingOptions,
    tokenizer: Tokenizer | None, streamer: Callable[[Tensor], None] | None,
) -> Tensor:  # fmt: skip
    """:func:`generate` with its options made."""
    cfg = model.config
    max_new_tokens = _new_tokens(cfg, input_ids, options.max_new_tokens, options.max_length)
    _check_call(model, input_ids, attention_mask, options, max_new_tokens, tokenizer)
    ends = list(options.end_tokens(cfg.eos_token_id))
    eos = torch.tensor(ends, dtype=torch.long, device=input_ids.device) if ends else None
    pad = cfg.pad_token_id if options.pad_token_id is None else options.pad_token_id
    budget = None
    if options.source_length_offset is not None:
        lengths = (
            attention_mask.sum(-1)
            if attention_mask is not None
            else torch.full_like(input_ids[:, 0], input_ids.shape[1])
        )
        budget = (lengths + options.source_length_offset).clamp(min=1)
    longest = max_new_tokens if budget is None else min(max_new_tokens, int(budget.max()))  # what the cache holds
    beams = options.num_beams
    incremental = IncrementalModel(model, input_ids, attention_mask, beams, longest, options.compile)
    constraint = _constraint(incremental, options, max_new_tokens, ends, tokenizer)
    if streamer is not None and beams > 1:
        raise ValueError("streamer follows one path per input; beam search decides its tokens only at the end")
    if beams > 1:
        from attnkit.generation.beam import beam_search

        new = beam_search(
            incremental, beams, max_new_tokens, eos, pad, options.length_penalty, options.length_penalty_style,
            options.early_stopping, budget, constraint,
        )  # fmt: skip
    elif options.do_sample:
        generator = torch.Generator(device=input_ids.device)
        # Without a seed, draw one from the global generator: torch.manual_seed still governs it.
        generator.manual_seed(int(torch.randint(0, 2**62, ())) if options.seed is None else options.seed)
        choose = sampler(options.temperature, options.top_k, options.top_p, generator)
        new = decode_one_path(incremental, max_new_tokens, eos, pad, choose, budget, constraint, streamer)
    else:
        new = decode_one_path(incremental, max_new_tokens, eos, pad, budget=budget, constraint=constraint,
                              streamer=streamer)  # fmt: skip
    if cfg.is_encoder_decoder:
        start = torch.full_like(new[:, :1], cfg.decoder_start_token_id)
        return torch.cat([start, new], dim=1)
    return torch.cat([input_ids, new], dim=1)


def generate_with_defaults(
    model: Model, input_ids: Tensor, attention_mask: Tensor | None = None, **given: Any
) -> Tensor:
    """:meth:`Model.generate`: :func:`generate` with the options ``given`` over the checkpoint's
    ``generation_config.json`` ones (``model.generation_defaults``; :meth:`DecodingOptions.over`).
    Options made whole (``options=``) are taken as they are."""
    if "options" not in given:
        decoding = {k: given.pop(k) for k in [*given] if k in OPTION_NAMES}
        given["options"] = DecodingOptions.over(model.generation_defaults, **decoding)
    return generate(model, input_ids, attention_mask, **given)


# Every model's generate() is this front: decoding sits above the models and imports them, so
# it is what hands itself to them, never the models that import it (tests/test_imports.py).
Model.decoding = staticmethod(generate_with_defaults)
