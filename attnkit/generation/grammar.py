"""Constrained decoding: each step's next-token scores masked to the tokens that keep the output
inside a grammar — a JSON schema, a regular expression or a Lark grammar — so that what is
decoded parses, whatever the model would have preferred. Once the grammar is complete only an
end token is allowed.

The engine is llguidance (``pip install 'attnkit[grammar]'``), chosen by measurement
(``python -m benchmarks grammars``: the fastest compile and mask of the three engines on
SmolLM2's tokenizer, no dependencies; docs/serving.md). A grammar is compiled once per
tokenizer and source and cached; a :class:`Follower` walks one output through it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

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


_tokenizers: OrderedDict[tuple[int, int, tuple[int, ...]], tuple[Tokenizer, Any]] = OrderedDict()
_compiled: OrderedDict[tuple[int, Grammar], Compiled] = OrderedDict()


def _remember(cache: OrderedDict, key: Any, value: Any) -> Any:
    cache[key] = value
    if len(cache) > CACHED:
        cache.popitem(last=False)
    return value


def _engine_tokenizer(tokenizer: Tokenizer, vocab_size: int, ends: tuple[int, ...]) -> Any:
    """llguidance's view of ``tokenizer`` (its vocabulary as bytes; about 0.2 s for 49k tokens),
    cached while the tokenizer lives (the cache holds it, so its id is not reused)."""
    key = (id(tokenizer), vocab_size, ends)
    if key in _tokenizers:
        _tokenizers.move_to_end(key)
        return _tokenizers[key][1]
    try:
        engine = _engine().LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size, eos_token=list(ends))
    except ValueError as e:
        raise GrammarError(
            f"llguidance cannot read this tokenizer ({e}); constrained decoding needs a byte-level BPE or "
            "SentencePiece tokenizer, as attnkit's and the Hugging Face models' are"
        ) from None
    return _remember(_tokenizers, key, (tokenizer, engine))[1]


@dataclass(frozen=True)
class Compiled:
    """A grammar compiled for one tokenizer: the engine's grammar and tokenizer."""

    grammar: Grammar
    source: str  # llguidance's grammar
    tokenizer: Any  # llguidance.LLTokenizer
    vocab_size: int
    ends: tuple[int, ...]  # the end tokens, the only ones allowed once the output is complete

    def follower(self) -> Follower:
        return Follower(self)


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
    lltok = _engine_tokenizer(tokenizer, vocab_size, tuple(ends))
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
    compiled = Compiled(grammar, source, lltok, vocab_size, tuple(ends))
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
    produced so far. Tokens after an end token are not read (a finished row's padding)."""

    def __init__(self, compiled: Compiled) -> None:
        self.compiled = compiled
        self.matcher = _engine().LLMatcher(compiled.tokenizer, compiled.source, log_level=0)
        self.read = 0  # tokens of the output consumed
        self.refused: int | None = None  # a token the grammar did not take (a dead beam's padding)

    def copy(self) -> Follower:
        twin = object.__new__(Follower)
        twin.compiled, twin.matcher = self.compiled, self.matcher.deep_copy()
        twin.read, twin.refused = self.read, self.refused
        return twin

    @property
    def stopped(self) -> bool:
        """The output is complete and has taken its end token (or was refused one)."""
        return self.refused is not None or self.matcher.is_stopped()

    def advance(self, tokens: Sequence[int]) -> None:
        """Consume ``tokens[self.read:]``, the output's tokens since the last call."""
        for token in tokens[self.read :]:
            if self.stopped:
                break
            if not self.matcher.consume_token(int(token)):
                self.refused = int(token)
        self.read = len(tokens)

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

    def allowed(self, tokens: Sequence[int]) -> Tensor:
        """After the output ``tokens``, the tokens that keep it inside the grammar (V,) bool:
        only the end tokens once it is complete and can go no further."""
        self.advance(tokens)
        return allowed_rows(self.compiled, [self])[0]


def allowed_rows(compiled: Compiled, followers: Sequence[Follower | None]) -> Tensor:
    """Each row's allowed next tokens (N, V) bool: the grammar's mask; only the end tokens for a
    row that is stopped; none for a row with no follower or one the grammar refused."""
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
    return allowed


def follow(compiled: Compiled, then: Adjust | None = None) -> Adjust:
    """One request's adjustment in a continuous batch (:data:`~attnkit.generation.continuous.Adjust`):
    ``then``'s (penalties, a bias), then every token outside the grammar to -inf. Its state is
    its own: one per request."""
    follower = compiled.follower()

    def adjust(logits: Tensor, tokens: Sequence[int]) -> Tensor:  # logits (vocab,)
        out = logits if then is None else then(logits, tokens)
        return out.masked_fill(~follower.allowed(tokens).to(out.device), float("-inf"))

    return adjust


def constrained(compiled: Compiled, read_before: int) -> Constraint:
    """A decoding constraint (:data:`~attnkit.generation.ngrams.Constraint`) that keeps every
    row inside ``compiled``: greedy, sampled or beam rows, reordered or dropped between steps.

    A row's output is what follows the first ``read_before`` positions it has read (the prompt,
    or an encoder–decoder's start token). Rows are told apart by their output, so a beam's
    children each get a copy of their parent's state. A row that has finished (its end token
    taken), or whose output is complete and can go no further, is allowed only an end token (a
    finished row's is replaced by padding); a row the grammar refused (a dead beam's padding)
    gets none allowed."""
    states: dict[tuple[int, ...], Follower] = {(): compiled.follower()}

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
        masked = scores.masked_fill(~allowed_rows(compiled, rows).to(scores.device), float("-inf"))
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
