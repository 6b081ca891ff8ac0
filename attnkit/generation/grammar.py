"""Constrained decoding: each step's next-token scores masked to the tokens that keep the output
inside a grammar — a JSON schema, a regular expression or a Lark grammar — so that what is
decoded parses, whatever the model would have preferred. Once the grammar is complete only an
end token is allowed; given a budget (``max_new_tokens``), an output is closed within it
(:mod:`attnkit.generation.closing`).

The engine is llguidance (``pip install 'attnkit[grammar]'``), chosen by measurement
(``python -m benchmarks grammars``: the fastest compile and mask of the three engines on
SmolLM2's tokenizer, no dependencies; docs/serving.md). A grammar is compiled once per
tokenizer and source and cached; a :class:`Follower` walks one output through it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor

from attnkit.generation.closing import Nesting, candidates, completes, shortest_close
from attnkit.generation.continuous import Adjust
from attnkit.generation.ngrams import Constraint

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# JSON written on one line as Python's json.dumps writes it: no whitespace but after the
# separators. The engine's default, any whitespace anywhere, lets a small model pad an output
# with newlines until its length runs out.
JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Compiled grammars and engine tokenizers kept (least recently used dropped first).
CACHED = 64
# Closing within a budget (Follower.within_budget): the slack, in tokens, below which an output's
# next tokens are checked, and how many of the likeliest are checked at each step there.
MARGIN = 24
CHECKED = 2
# The tokens before its budget from which an output is watched (its first search costs up to
# 60 ms on the schema set; an output whose completion is longer than this less the margin is cut).
WATCHED = 128


class GrammarError(ValueError):
    """A grammar the engine cannot compile, or one that leaves an output no token."""


@dataclass(frozen=True)
class Grammar:
    """What an output must match: ``kind`` and its ``text`` (the schema as JSON, the pattern,
    the Lark grammar). Build one with :meth:`json_schema`, :meth:`regex` or :meth:`lark`."""

    kind: Literal["json_schema", "regex", "lark"]
    text: str

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool | str) -> Grammar:
        """Output one JSON value valid against ``schema`` (a dict, or its JSON text); ``{"type":
        "object"}`` is any JSON object."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"the JSON schema is not JSON: {e}") from None
        if not isinstance(schema, dict | bool):
            raise GrammarError(f"a JSON schema is an object (or true/false), got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema))  # its properties in order: the output keeps it

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        """Output a text that ``pattern`` matches whole."""
        return cls("regex", pattern)

    @classmethod
    def lark(cls, text: str) -> Grammar:
        """Output a text of the Lark grammar ``text`` (its rule ``start``), as llguidance reads Lark."""
        return cls("lark", text)


# What bounded() gives what a schema leaves open: characters of a string, items of an array,
# the magnitude of a number.
MAX_LENGTH, MAX_ITEMS, MAGNITUDE = 64, 8, 10**12
_SUBSCHEMAS = ("additionalProperties", "items", "not", "if", "then", "else", "contains")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def bounded(schema: dict[str, Any], max_length: int = MAX_LENGTH, max_items: int = MAX_ITEMS,
            magnitude: int = MAGNITUDE) -> dict[str, Any]:  # fmt: skip
    """A copy of a JSON ``schema`` whose open ends are closed: a string with no ``maxLength``,
    ``enum``, ``const``, ``pattern`` or ``format`` gets ``maxLength`` ``max_length``, an array
    with no ``maxItems`` gets ``max_items`` (at least its ``minItems``), a number with no bound
    on a side is bounded at ± ``magnitude``, an object that declares its properties and says
    nothing of others takes no others. Every value it allows the original allows; a small
    model that repeats inside a string, a list or a number's digits then ends within a budget
    of tokens (docs/serving.md measures it). A number's fractional digits stay open."""

    def walk(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = dict(node)
        for key in _SUBSCHEMAS:
            if isinstance(out.get(key), dict):
                out[key] = walk(out[key])
        for key in _SCHEMA_LISTS:
            if isinstance(out.get(key), list):
                out[key] = [walk(item) for item in out[key]]
        for key in _SCHEMA_MAPS:
            if isinstance(out.get(key), dict):
                out[key] = {name: walk(sub) for name, sub in out[key].items()}
        types = out.get("type", [])
        types = set(types) if isinstance(types, list) else {types}
        if "string" in types and not {"maxLength", "enum", "const", "pattern", "format"} & out.keys():
            out["maxLength"] = max(max_length, out.get("minLength", 0))
        if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
            out["additionalProperties"] = False  # no undeclared keys: a model may add them without end
        if "array" in types and "maxItems" not in out:
            out["maxItems"] = max(max_items, out.get("minItems", 0))
        if types & {"integer", "number"} and not {"enum", "const"} & out.keys():
            low, high = out.get("minimum", out.get("exclusiveMinimum")), out.get("maximum", out.get("exclusiveMaximum"))
            if high is None:
                out["maximum"] = magnitude if low is None else max(magnitude, low + 1)
            if low is None:
                out["minimum"] = -magnitude if high is None else min(-magnitude, high - 1)
        return out

    return walk(schema)


def as_grammar(grammar: Grammar | dict[str, Any]) -> Grammar:
    """A :class:`Grammar` as it is, a dict as a JSON schema."""
    if isinstance(grammar, Grammar):
        return grammar
    if isinstance(grammar, dict):
        return Grammar.json_schema(grammar)
    raise GrammarError(
        f"grammar must be a Grammar or a JSON schema dict, got {type(grammar).__name__}; "
        "build one with Grammar.json_schema, Grammar.regex or Grammar.lark"
    )


def _engine() -> Any:
    try:
        import llguidance
    except ImportError:
        raise GrammarError("constrained decoding needs llguidance: pip install 'attnkit[grammar]'") from None
    return llguidance


_tokenizers: OrderedDict[tuple[int, int, tuple[int, ...]], tuple[Tokenizer, Any, Spelling]] = OrderedDict()
_compiled: OrderedDict[tuple[int, Grammar], Compiled] = OrderedDict()


def _remember(cache: OrderedDict, key: Any, value: Any) -> Any:
    cache[key] = value
    if len(cache) > CACHED:
        cache.popitem(last=False)
    return value


@dataclass(frozen=True)
class Spelling:
    """A vocabulary as bytes: ``pieces[t]`` token t's, and the tokens a closing is spelled with
    (:func:`~attnkit.generation.closing.candidates`)."""

    pieces: tuple[bytes, ...]
    closers: np.ndarray


def _engine_tokenizer(tokenizer: Tokenizer, vocab_size: int, ends: tuple[int, ...]) -> tuple[Any, Spelling]:
    """llguidance's view of ``tokenizer`` (its vocabulary as bytes; about 0.2 s for 49k tokens)
    and its :class:`Spelling`, cached while the tokenizer lives (the cache holds it, so its id
    is not reused)."""
    key = (id(tokenizer), vocab_size, ends)
    if key in _tokenizers:
        _tokenizers.move_to_end(key)
        return _tokenizers[key][1:]
    try:
        engine = _engine().LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size, eos_token=list(ends))
    except ValueError as e:
        raise GrammarError(
            f"llguidance cannot read this tokenizer ({e}); constrained decoding needs a byte-level BPE or "
            "SentencePiece tokenizer, as attnkit's and the Hugging Face models' are"
        ) from None
    pieces = tuple(engine.decode_bytes([t]) for t in range(vocab_size))
    return _remember(_tokenizers, key, (tokenizer, engine, Spelling(pieces, candidates(pieces))))[1:]


@dataclass(frozen=True)
class Compiled:
    """A grammar compiled for one tokenizer: the engine's grammar and tokenizer."""

    grammar: Grammar
    source: str  # llguidance's grammar
    tokenizer: Any  # llguidance.LLTokenizer
    vocab_size: int
    ends: tuple[int, ...]  # the end tokens, the only ones allowed once the output is complete
    spelling: Spelling = field(compare=False, repr=False)

    def follower(self, budget: int | None = None) -> Follower:
        return Follower(self, budget)


def compile_grammar(
    grammar: Grammar | dict[str, Any], tokenizer: Tokenizer, vocab_size: int, ends: Sequence[int]
) -> Compiled:
    """``grammar`` compiled for ``tokenizer`` (``vocab_size`` scores a step, ``ends`` the end
    tokens allowed once it is complete), from the cache where it was compiled before; a
    :class:`GrammarError` naming the engine's reason where it cannot be."""
    if not ends:
        raise GrammarError("constrained decoding needs an end token (eos_token_id) to end a complete output with")
    grammar = as_grammar(grammar)
    engine = _engine()
    lltok, spelling = _engine_tokenizer(tokenizer, vocab_size, tuple(ends))
    key = (id(lltok), grammar)
    if key in _compiled:
        _compiled.move_to_end(key)
        return _compiled[key]
    build = {"json_schema": engine.LLMatcher.grammar_from_json_schema, "regex": engine.LLMatcher.grammar_from_regex,
             "lark": engine.LLMatcher.grammar_from_lark}[grammar.kind]  # fmt: skip
    what = grammar.kind.replace("_", " ")
    try:
        source = (build(json.loads(grammar.text), overrides=JSON_FORMAT) if grammar.kind == "json_schema"
                  else build(grammar.text))  # fmt: skip
    except (ValueError, TypeError) as e:
        raise GrammarError(f"the {what} cannot be compiled: {e}") from None
    if error := engine.LLMatcher.validate_grammar(source, lltok):
        raise GrammarError(f"the {what} cannot be compiled: {error}")
    compiled = Compiled(grammar, source, lltok, vocab_size, tuple(ends), spelling)
    try:  # one that cannot begin (a $ref that refers only to itself) is refused now, not mid-decode
        compiled.follower().mask_into(torch.zeros((vocab_size + 31) // 32, dtype=torch.int32))
    except GrammarError as e:
        raise GrammarError(
            f"the {what} cannot be compiled: nothing can begin it ({str(e).split(': ', 1)[-1]})"
        ) from None
    return _remember(_compiled, key, compiled)


_BITS = 1 << torch.arange(32, dtype=torch.int64)  # bit b of a mask word


def unpack(words: Tensor, vocab_size: int) -> Tensor:
    """llguidance's packed mask (N, ⌈V/32⌉) int32, bit b of word w = token 32w + b, as (N, V) bool."""
    bits = (words.to(torch.int64)[:, :, None] & _BITS) != 0  # (N, W, 32)
    return bits.flatten(1)[:, :vocab_size]


class Follower:
    """One output's place in a compiled grammar: :meth:`allowed` after the tokens it has
    produced so far. Tokens after an end token are not read (a finished row's padding).

    With a ``budget``, the tokens the output may take, its end token included
    (``max_new_tokens``), it also keeps the output completable within them
    (:meth:`within_budget`): an output the budget would cut is closed instead, and
    ``shortened`` says so."""

    def __init__(self, compiled: Compiled, budget: int | None = None) -> None:
        self.compiled = compiled
        self.matcher = _engine().LLMatcher(compiled.tokenizer, compiled.source, log_level=0)
        self.read = 0  # tokens of the output consumed
        self.refused: int | None = None  # a token the grammar did not take (a dead beam's padding)
        self.budget = budget
        self.nesting = Nesting()  # what the output's text leaves open
        self.shortened = False  # a token the scores preferred was refused for the budget
        self._closing: tuple[int, list[int] | None] = (-1, None)  # (read, its completion) last searched
        self._checked: dict[int, list[int] | None] = {}  # a next token's completion, searched this step

    def copy(self) -> Follower:
        twin = object.__new__(Follower)
        twin.__dict__.update(self.__dict__)
        twin.matcher, twin._checked = self.matcher.deep_copy(), dict(self._checked)
        return twin

    @property
    def stopped(self) -> bool:
        """The output is complete and has taken its end token (or was refused one)."""
        return self.refused is not None or self.matcher.is_stopped()

    def advance(self, tokens: Sequence[int]) -> None:
        """Consume ``tokens[self.read:]``, the output's tokens since the last call."""
        for token in map(int, tokens[self.read :]):
            if self.stopped:
                break
            if not self.matcher.consume_token(token):
                self.refused = token
            else:
                self.nesting = self.nesting.after(self.compiled.spelling.pieces[token])
                self._closing = self._closing_after(token)
            self._checked = {}
            self.read += 1
        self.read = len(tokens)

    def _closing_after(self, token: int) -> tuple[int, list[int] | None]:
        """The completion known after ``token``, the shorter of: its own, searched when it was
        checked, and the rest of the completion it begins (so that a completion being followed
        is followed to its end, not searched again)."""
        known = [self._checked[token]] if self._checked.get(token) is not None else []
        read, completion = self._closing
        if read == self.read and completion and completion[0] == token:
            known.append(completion[1:])
        return (self.read + 1, min(known, key=len)) if known else self._closing

    def mask_into(self, words: Tensor) -> None:
        """The allowed next tokens into ``words`` (⌈V/32⌉,) int32, packed; a
        :class:`GrammarError` where the engine fails (its state is checked after the mask: a
        failure while computing it leaves an end token allowed) or leaves no token."""
        self.matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        what = self.compiled.grammar.kind.replace("_", " ")
        if self.matcher.is_error():
            reason = self.matcher.get_error().splitlines()[0]  # the engine's first line, not its backtrace
            raise GrammarError(f"the {what} failed after {self.read} tokens: {reason}")
        if not bool(words.any()):
            raise GrammarError(f"the {what} leaves no token allowed after {self.read} tokens (an unsatisfiable "
                               "grammar, or one the tokenizer cannot spell)")  # fmt: skip

    def allowed(self, tokens: Sequence[int], scores: Tensor | None = None) -> Tensor:
        """After the output ``tokens``, the tokens that keep it inside the grammar (V,) bool:
        only the end tokens once it is complete and can go no further; within its budget
        (``scores`` (V,) rank the tokens checked, :meth:`within_budget`)."""
        self.advance(tokens)
        return allowed_rows(self.compiled, [self], None if scores is None else scores[None])[0]

    def within_budget(self, allowed: Tensor, scores: Tensor | None) -> Tensor:
        """``allowed`` (V,) bool, narrowed near the end of the budget to tokens after which the
        output can still be completed in the tokens left
        (:func:`~attnkit.generation.closing.shortest_close`). Where the slack (the tokens left
        less the completion's and its end token) is at most
        :data:`~attnkit.generation.grammar.MARGIN`, the
        :data:`~attnkit.generation.grammar.CHECKED` likeliest allowed tokens by ``scores`` are
        kept where they fit, beside the completion's next token; with no slack, that one alone.
        Where no completion is found, more than :data:`~attnkit.generation.grammar.WATCHED`
        tokens are left, or fewer than 2 (no room for a completion and its end), the grammar's
        tokens are left as they are."""
        left = None if self.budget is None else self.budget - self.read  # its end token included
        if left is None or left > WATCHED or left < 2 or self.stopped:  # far off; or no room for any completion
            return allowed
        completion = self._completion(left)
        if completion is None or left - len(completion) - 1 > MARGIN:
            return allowed
        keep = torch.zeros_like(allowed)
        keep[completion[0] if completion else list(self.compiled.ends)] = True
        if scores is not None:
            ranked = scores.masked_fill(~allowed, float("-inf"))
            if left - len(completion) - 1 > 0:
                for token in ranked.topk(CHECKED).indices.tolist():
                    keep[token] |= bool(allowed[token]) and self._fits(token, left - 1)
            self.shortened |= not bool(keep[int(ranked.argmax())])
        return keep

    def _completion(self, left: int) -> list[int] | None:
        """The output's completion from here: the last one found while the budget is far (more
        than twice the margin away, and it at most 8 tokens old), else that one where it still
        completes the output (a string's letters leave its closing as it was), else searched."""
        read, completion = self._closing
        if read == self.read:
            return completion
        if read >= 0 and completion is not None:
            if self.read - read < 8 and left > len(completion) + 1 + 2 * MARGIN:
                return completion
            if completes(self.matcher, completion):
                self._closing = (self.read, completion)
                return completion
        spelling = self.compiled.spelling
        self._closing = (self.read, shortest_close(self.matcher, self.nesting, spelling.closers, spelling.pieces))
        return self._closing[1]

    def _fits(self, token: int, left: int) -> bool:
        """Whether after ``token`` the output can be completed in ``left`` tokens, its end
        included: by the rest of this step's completion where the token begins it, by the
        whole of it where it still completes the output, else by one searched."""
        if token in self.compiled.ends:
            return True
        twin = self.matcher.deep_copy()
        if not twin.consume_token(token):
            return False
        completion = self._closing[1]  # this step's: within_budget found it first
        if completion and completion[0] == token:
            after: list[int] | None = completion[1:]
        elif completion is not None and completes(twin, completion):
            after = completion
        else:
            spelling = self.compiled.spelling
            after = shortest_close(twin, self.nesting.after(spelling.pieces[token]), spelling.closers, spelling.pieces)
        self._checked[token] = after
        return after is not None and len(after) + 1 <= left


def allowed_rows(compiled: Compiled, followers: Sequence[Follower | None], scores: Tensor | None = None) -> Tensor:
    """Each row's allowed next tokens (N, V) bool: the grammar's mask, within the row's budget
    (``scores`` (N, V) rank the tokens checked there); only the end tokens for a row that is
    stopped; none for a row with no follower or one the grammar refused."""
    words = torch.zeros(len(followers), (compiled.vocab_size + 31) // 32, dtype=torch.int32)
    stopped = torch.zeros(len(followers), dtype=torch.bool)
    for row, follower in enumerate(followers):
        if follower is None or follower.refused is not None:
            continue
        if follower.stopped:
            stopped[row] = True
        else:
            follower.mask_into(words[row])
    allowed = unpack(words, compiled.vocab_size)
    allowed[stopped.nonzero()[:, 0][:, None], torch.tensor(compiled.ends)] = True  # only an end token
    for row, follower in enumerate(followers):
        if follower is not None and follower.budget is not None and follower.refused is None:
            allowed[row] = follower.within_budget(allowed[row], None if scores is None else scores[row].cpu())
    return allowed


class Follow:
    """One request's adjustment in a continuous batch (:data:`~attnkit.generation.continuous.Adjust`):
    ``then``'s (penalties, a bias), then every token outside the grammar to -inf, the output
    kept within ``budget`` tokens (:meth:`Follower.within_budget`). Its state is its own: one
    per request; ``shortened`` once the budget refused a token the scores preferred."""

    def __init__(self, compiled: Compiled, then: Adjust | None = None, budget: int | None = None) -> None:
        self.follower, self.then = compiled.follower(budget), then

    @property
    def shortened(self) -> bool:
        return self.follower.shortened

    def __call__(self, logits: Tensor, tokens: Sequence[int]) -> Tensor:  # logits (vocab,)
        out = logits if self.then is None else self.then(logits, tokens)
        return out.masked_fill(~self.follower.allowed(tokens, out).to(out.device), float("-inf"))


def constrained(compiled: Compiled, read_before: int, budget: int | None = None) -> Constraint:
    """A decoding constraint (:data:`~attnkit.generation.ngrams.Constraint`) that keeps every
    row inside ``compiled``: greedy, sampled or beam rows, reordered or dropped between steps.

    A row's output is what follows the first ``read_before`` positions it has read (the prompt,
    or an encoder–decoder's start token). Rows are told apart by their output, so a beam's
    children each get a copy of their parent's state. A row that has finished (its end token
    taken), or whose output is complete and can go no further, is allowed only an end token (a
    finished row's is replaced by padding); a row the grammar refused (a dead beam's padding)
    gets none allowed. With a ``budget`` (``max_new_tokens``) every row's output is closed
    within it (:meth:`Follower.within_budget`), its likeliest tokens ranked by the scores."""
    states: dict[tuple[int, ...], Follower] = {(): compiled.follower(budget)}

    def constrain(scores: Tensor, sequences: Tensor, final: Tensor) -> Tensor:
        nonlocal states
        outputs = [tuple(row) for row in sequences[:, read_before:].tolist()]
        children: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for output in dict.fromkeys(outputs):  # distinct outputs, in order
            children.setdefault(output[:-1], []).append(output)
        now: dict[tuple[int, ...], Follower] = {}
        for parent, kids in children.items():
            state = states.get(parent)
            for i, kid in enumerate(kids):
                if state is None:  # a row whose parent was refused or finished: nothing to follow
                    continue
                now[kid] = state if i == len(kids) - 1 else state.copy()
                now[kid].advance(kid)
        states = now
        rows = [now.get(output) for output in outputs]
        masked = scores.masked_fill(~allowed_rows(compiled, rows, scores).to(scores.device), float("-inf"))
        followed = torch.tensor([r is not None and r.refused is None for r in rows], device=scores.device)
        stuck = followed & ~(masked > float("-inf")).any(dim=-1)  # (N,): the earlier constraints banned all it allows
        if bool(stuck.any()):
            row = int(stuck.nonzero()[0, 0])
            raise GrammarError(
                f"the grammar and the other constraints (no_repeat_ngram_size, bad_words_ids, a forced token) leave "
                f"no token allowed after {len(outputs[row])} tokens; drop one of them"
            )
        return masked

    return constrain
