"""Constrained decoding (``generate(grammar=...)``): each step's allowed tokens within a
brute-force oracle over the whole vocabulary, the tokenizer's own spelling always among them;
the committed schema set decoded by a random-weight model in every mode, each output that ends
parsing and validating against its schema (jsonschema, not the engine); the engine's refusals
named, in the library and on the command line."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models

import attnkit
from attnkit.config import preset
from attnkit.data.tokenizer import train_tokenizer
from attnkit.generation import Grammar, generate
from attnkit.generation.closing import Nesting, shortest_close
from attnkit.generation.grammar import Compiled, Follower, GrammarError, bounded, compile_grammar, constrained

pytest.importorskip("llguidance", reason="the grammar extra is not installed: pip install 'attnkit[grammar]'")
jsonschema = pytest.importorskip("jsonschema", reason="the test extra is not installed: pip install 'attnkit[test]'")

SCHEMAS = json.loads((Path(__file__).parents[2] / "benchmarks" / "schemas.json").read_text(encoding="utf-8"))
TEXTS = [json.dumps(s["example"]) for s in SCHEMAS] + ['{"name": "Ada", "age": 36, "ok": true}', "yes no maybe 123"]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(TEXTS * 4, vocab_size=400)


@pytest.fixture(scope="module")
def gpt(tokenizer: Tokenizer) -> torch.nn.Module:
    torch.manual_seed(0)
    config = preset("gpt-tiny", vocab_size=tokenizer.get_vocab_size(), eos_token_id=end_of(tokenizer), dropout=0.0)
    model = attnkit.build_model(config).eval()
    model.tokenizer = tokenizer
    return model


def end_of(tokenizer: Tokenizer) -> int:
    return tokenizer.token_to_id("</s>")


def oracle(tokenizer: Tokenizer, words: list[str], prefix: list[int], ends: list[int]) -> set[int]:
    """The tokens a grammar of the finite language ``words`` allows after ``prefix``, by trying
    every token of the vocabulary: those that keep the text a prefix of a word, and an end token
    where it is a whole word."""
    text = tokenizer.decode(prefix)
    allowed = {e for e in ends if text in words}
    for token in range(tokenizer.get_vocab_size()):
        piece = tokenizer.decode([*prefix, token], skip_special_tokens=False)
        if token not in ends and piece != text and any(w.startswith(piece) for w in words):
            allowed.add(token)
    return allowed


def test_each_steps_allowed_tokens_are_within_the_oracles(tokenizer: Tokenizer) -> None:
    words = ["yes", "no", "maybe", "123", "12"]
    ends = [end_of(tokenizer)]
    compiled = compile_grammar(Grammar.regex("|".join(words)), tokenizer, tokenizer.get_vocab_size(), ends)
    constraint = constrained(compiled, read_before=1)
    prompt = [ends[0]]  # what the decoder read before its output: one token
    paths = [tokenizer.encode(w).ids for w in words]
    for path in paths:
        for t in range(len(path) + 1):
            row = torch.tensor([[*prompt, *path[:t]]])
            scores = constraint(torch.zeros(1, tokenizer.get_vocab_size()), row, torch.tensor([False]))
            got = set((scores[0] > float("-inf")).nonzero()[:, 0].tolist())
            # Every token allowed keeps the text inside the language; the tokenizer's own next
            # token (or the end) is among them; the engine may leave out a token that would
            # spell the text in pieces the tokenizer never makes ("y" "e" "s" for "y" "es").
            assert got <= oracle(tokenizer, words, path[:t], ends), (path, t)
            assert (path[t] if t < len(path) else ends[0]) in got, (path, t)
        constraint = constrained(compiled, read_before=1)  # a fresh decode for the next path


@pytest.mark.parametrize("mode", [{}, {"do_sample": True, "seed": 3}, {"num_beams": 3}])
def test_every_schema_decodes_valid_json_from_random_weights(
    gpt: torch.nn.Module, tokenizer: Tokenizer, mode: dict
) -> None:
    """A random model writes no JSON by itself, and repeats inside it until any budget runs out;
    constrained, every output ends within max_new_tokens, valid (its numbers read as the
    decimals they are: 0.999…9 is below an exclusive maximum of 1, which a float rounds onto)."""
    prompt = torch.tensor([tokenizer.encode("{").ids])
    eos = end_of(tokenizer)
    for entry in SCHEMAS:
        out = generate(gpt, prompt, max_new_tokens=96, grammar=entry["schema"], eos_token_id=eos, **mode)
        new = out[0, prompt.shape[1] :].tolist()
        assert eos in new, (entry["name"], tokenizer.decode(new))
        text = tokenizer.decode(new[: new.index(eos)])
        jsonschema.validate(json.loads(text, parse_float=Decimal), entry["schema"],
                            format_checker=jsonschema.FormatChecker())  # fmt: skip
        unconstrained = generate(gpt, prompt, max_new_tokens=len(new), eos_token_id=eos, **mode)[0, prompt.shape[1] :]
        assert unconstrained.tolist() != new, entry["name"]  # the grammar decided the output


def test_beams_each_follow_their_own_state(gpt: torch.nn.Module, tokenizer: Tokenizer) -> None:
    """Beam search reorders rows every step: every finished hypothesis of a regex with a shared
    prefix matches it whole."""
    eos = end_of(tokenizer)
    prompt = torch.tensor([tokenizer.encode("yes").ids] * 2)
    pattern = r"(12|123|no|maybe) (yes|no)"
    out = generate(gpt, prompt, max_new_tokens=12, num_beams=4, grammar=Grammar.regex(pattern), eos_token_id=eos)
    for row in out[:, prompt.shape[1] :].tolist():
        assert eos in row
        assert re.fullmatch(pattern, tokenizer.decode(row[: row.index(eos)])), tokenizer.decode(row)


def test_an_encoder_decoder_is_constrained_after_its_start_token(tokenizer: Tokenizer) -> None:
    torch.manual_seed(0)
    model = attnkit.build_model(preset("transformer-tiny", vocab_size=tokenizer.get_vocab_size(), dropout=0.0)).eval()
    model.tokenizer = tokenizer
    eos = end_of(tokenizer)
    out = generate(model, torch.tensor([tokenizer.encode("yes no").ids]), max_new_tokens=8, eos_token_id=eos,
                   grammar=Grammar.lark('start: "maybe" | "no"'))  # fmt: skip
    new = out[0, 1:].tolist()
    assert tokenizer.decode(new[: new.index(eos)]) in ("maybe", "no")


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "properties": {"x": {"type": "strin"}}}, "strin"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum (5) is greater than maximum (1)"),
        ({"not": {"type": "string"}}, "not"),
        ('{"type": ', "not JSON"),
        (["type", "object"], "a JSON schema is an object"),
        (
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
            "nothing can begin it",
        ),
    ],
)
def test_a_schema_the_engine_cannot_compile_is_named(tokenizer: Tokenizer, schema: object, reason: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(reason)):
        compile_grammar(Grammar.json_schema(schema), tokenizer, tokenizer.get_vocab_size(), [0])  # type: ignore[arg-type]


def test_a_grammar_the_tokenizer_cannot_spell_ends_with_an_error(gpt: torch.nn.Module, tokenizer: Tokenizer) -> None:
    """A vocabulary of a and b with no unknown token: nothing can spell "c"; refused before
    decoding with the engine's error, its first line, not a hang or a token outside the grammar."""
    words = Tokenizer(models.WordLevel({"a": 0, "b": 1, "</s>": 2}, unk_token="[UNK]"))
    words.decoder = decoders.ByteLevel()
    gpt.tokenizer = words
    try:
        failed = r"^the regex cannot be compiled: nothing can begin it \(panic: tokenizer error: MissingUnkToken\)$"
        with pytest.raises(GrammarError, match=failed):
            generate(gpt, torch.tensor([[0, 1]]), max_new_tokens=4, grammar=Grammar.regex("c"), eos_token_id=2)
    finally:
        gpt.tokenizer = tokenizer


def test_a_tokenizer_the_engine_cannot_read_is_named(gpt: torch.nn.Module) -> None:
    words = Tokenizer(models.WordLevel({"a": 0, "b": 1, "</s>": 2}, unk_token="a"))  # no decoder: bytes unknown
    with pytest.raises(GrammarError, match="llguidance cannot read this tokenizer"):
        compile_grammar(Grammar.regex("a"), words, 3, [2])


def test_grammar_needs_a_tokenizer(tokenizer: Tokenizer) -> None:
    model = attnkit.build_model(preset("gpt-tiny", vocab_size=tokenizer.get_vocab_size())).eval()
    with pytest.raises(ValueError, match="grammar= reads the output's text through a tokenizer"):
        generate(model, torch.tensor([[1, 2]]), max_new_tokens=2, grammar={"type": "object"})


def test_a_compiled_grammar_is_cached(tokenizer: Tokenizer) -> None:
    size = tokenizer.get_vocab_size()
    first = compile_grammar({"type": "object"}, tokenizer, size, [2])
    assert compile_grammar(Grammar.json_schema({"type": "object"}), tokenizer, size, [2]) is first
    assert compile_grammar({"type": "array"}, tokenizer, size, [2]) is not first


def test_the_command_line_prints_what_generate_gives(gpt: torch.nn.Module, tokenizer: Tokenizer, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    """``attnkit generate --json-schema FILE``: the library's constrained output, valid JSON;
    one cut short is said on stderr; a schema file that is missing or not compilable is a
    one-line error naming it."""
    from attnkit.cli import main

    gpt.save_pretrained(tmp_path / "gpt")
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}, "ok": {"type": "boolean"}},
              "required": ["colour", "ok"], "additionalProperties": False}  # fmt: skip
    (tmp_path / "schema.json").write_text(json.dumps(schema), encoding="utf-8")
    argv = ["generate", "--model", str(tmp_path / "gpt"), "--weights", "fp32", "--only-new", "--no-compile",
            "--json-schema", str(tmp_path / "schema.json")]  # fmt: skip
    prompt = tokenizer.encode('{"name": "Ada"}').ids
    new = generate(gpt, torch.tensor([prompt]), max_new_tokens=30, grammar=schema, compile=False)[0, len(prompt) :]
    expected = tokenizer.decode(new.tolist(), skip_special_tokens=True)
    assert main([*argv, "--max-new-tokens", "30", '{"name": "Ada"}']) == 0
    out = capsys.readouterr()
    assert out.out == expected + "\n" and out.err == ""
    jsonschema.validate(json.loads(out.out), schema)
    assert main([*argv, "--max-new-tokens", "3", '{"name": "Ada"}']) == 0
    assert "output 1 was cut at --max-new-tokens 3 before its JSON was complete" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"type": "array", "uniqueItems": true}', encoding="utf-8")
    for path, reason in [("missing.json", "cannot read it"), ("bad.json", 'Unimplemented keys: ["uniqueItems"]')]:
        assert main([*argv[:-1], str(tmp_path / path), "x"]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and path in err[0] and reason in err[0], err


def test_constraints_that_together_allow_nothing_end_with_an_error(gpt: torch.nn.Module, tokenizer: Tokenizer) -> None:
    """Banned words that take every token the grammar allows: an error naming both, not a token
    outside the grammar (every score -inf would pick token 0)."""
    words = ["yes", "no"]
    banned = [tokenizer.encode(w).ids[:1] for w in words]  # the first token of each word
    with pytest.raises(GrammarError, match=r"the grammar and the other constraints .* leave no token allowed after 0"):
        generate(gpt, torch.tensor([[1, 2]]), max_new_tokens=4, grammar=Grammar.regex("yes|no"), bad_words_ids=banned)


def test_bounded_closes_every_open_end_and_keeps_the_rest() -> None:
    schema = {
        "type": "object", "$defs": {"tag": {"type": "string"}},
        "properties": {
            "name": {"type": "string"}, "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "colour": {"enum": ["red"]}, "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 10},
            "n": {"type": "integer", "minimum": 3}, "big": {"type": "number", "exclusiveMinimum": 10**13},
            "either": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": ["number", "null"]}]},
        },
    }  # fmt: skip
    got = bounded(schema, max_length=20, max_items=4, magnitude=1000)
    assert got["additionalProperties"] is False  # it declares its properties and said nothing of others
    assert got["$defs"]["tag"] == {"type": "string", "maxLength": 20}
    props = got["properties"]
    assert props["name"] == {"type": "string", "maxLength": 20}
    assert props["code"] == schema["properties"]["code"] and props["colour"] == {"enum": ["red"]}
    assert props["tags"]["maxItems"] == 10  # at least its minItems
    assert props["n"] == {"type": "integer", "minimum": 3, "maximum": 1000}
    assert props["big"] == {"type": "number", "exclusiveMinimum": 10**13, "maximum": 10**13 + 1}
    assert props["either"]["anyOf"] == [{"type": "string", "maxLength": 3},
                                        {"type": ["number", "null"], "maximum": 1000, "minimum": -1000}]  # fmt: skip
    assert schema["properties"]["name"] == {"type": "string"}  # a copy: the caller's schema untouched


def test_bounded_outputs_are_valid_against_the_original(gpt: torch.nn.Module, tokenizer: Tokenizer) -> None:
    """What the bounded schema lets a random model write is valid against the original schema."""
    prompt = torch.tensor([tokenizer.encode("{").ids])
    eos = end_of(tokenizer)
    for entry in SCHEMAS:
        narrow = bounded(entry["schema"], max_length=8, max_items=2)
        new = generate(gpt, prompt, max_new_tokens=96, grammar=narrow, eos_token_id=eos)[0, prompt.shape[1] :].tolist()
        assert eos in new, entry["name"]
        value = json.loads(tokenizer.decode(new[: new.index(eos)]), parse_float=Decimal)
        jsonschema.validate(value, narrow)
        jsonschema.validate(value, entry["schema"], format_checker=jsonschema.FormatChecker())


def test_a_completion_is_found_from_every_prefix_of_every_example(tokenizer: Tokenizer) -> None:
    """From every token of every schema's example, the closing search finds tokens that make
    the text so far a valid instance of the schema (jsonschema is the oracle); none where it
    is complete already."""
    eos = end_of(tokenizer)
    for entry in SCHEMAS:
        compiled = compile_grammar(entry["schema"], tokenizer, tokenizer.get_vocab_size(), [eos])
        ids = tokenizer.encode(json.dumps(entry["example"])).ids
        for t in range(len(ids) + 1):
            follower = compiled.follower()
            follower.advance(ids[:t])
            spelling = compiled.spelling
            completion = shortest_close(follower.matcher, follower.nesting, spelling.closers, spelling.pieces)
            assert completion is not None, (entry["name"], t)
            assert (completion == []) == follower.matcher.is_accepting()
            text = tokenizer.decode(ids[:t] + completion)
            value = json.loads(text, parse_float=Decimal)
            jsonschema.validate(value, entry["schema"], format_checker=jsonschema.FormatChecker())


def repeating(compiled: Compiled, budget: int, favourite: int) -> tuple[list[int], Follower]:
    """Greedy decoding by a "model" that prefers ``favourite`` (a letter) above all else, then
    the end token: it would write the letter forever inside a string."""
    follower, out = compiled.follower(budget), []
    scores = torch.zeros(compiled.vocab_size)
    scores[favourite], scores[list(compiled.ends)] = 2.0, 1.0
    while len(out) < budget and (not out or out[-1] not in compiled.ends):
        allowed = follower.allowed(out, scores)
        out.append(int(scores.masked_fill(~allowed, float("-inf")).argmax()))
    return out, follower


def test_an_output_is_closed_within_its_budget(tokenizer: Tokenizer) -> None:
    """A decoding that would repeat a letter inside a string until its tokens run out is closed
    in time: for every budget that leaves room for the smallest instance, it ends with its end
    token within the budget, valid, and says it was shortened; one that ends by itself is not."""
    eos = end_of(tokenizer)
    schema = {"type": "object", "properties": {"said": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["said", "n"], "additionalProperties": False}  # fmt: skip
    compiled = compile_grammar(schema, tokenizer, tokenizer.get_vocab_size(), [eos])
    spelling = compiled.spelling
    smallest = shortest_close(compiled.follower().matcher, Nesting(), spelling.closers, spelling.pieces)
    letter = tokenizer.token_to_id("a")
    for budget in range(len(smallest) + 1, len(smallest) + 40, 3):
        out, follower = repeating(compiled, budget, letter)
        assert len(out) <= budget and out[-1] == eos, budget
        value = json.loads(tokenizer.decode(out[:-1]))
        jsonschema.validate(value, schema)
        assert set(value["said"]) <= {"a"} and follower.shortened
    assert len(value["said"]) > 10  # with room to spare, the model's letters come first
    out, follower = repeating(compiled, len(smallest), letter)  # no room for its end token: cut, no claim
    assert len(out) == len(smallest) and eos not in out
    enum = compile_grammar({"enum": ["yes", "no"]}, tokenizer, tokenizer.get_vocab_size(), [eos])
    out, follower = repeating(enum, 64, letter)
    assert tokenizer.decode(out[:-1]) in ('"yes"', '"no"') and not follower.shortened
