"""Structured outputs through the server's API (Starlette's test client, the tiny trained GPT):
``response_format`` json_schema and json_object on chat and completions, greedy equal to the
library's ``generate(grammar=...)``, sampled choices each valid (jsonschema), streamed the same
as whole; an answer closed early for ``max_tokens`` valid and said so, one too short for any
instance cut and said so; a schema the engine refuses a 400 naming
the field, the server unaffected."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from attnkit.generation.text import chat_prompt
from attnkit.models import Model

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'attnkit[serve]'")
pytest.importorskip("llguidance", reason="the grammar extra is not installed: pip install 'attnkit[grammar]'")
jsonschema = pytest.importorskip("jsonschema", reason="the test extra is not installed: pip install 'attnkit[test]'")
from starlette.testclient import TestClient  # noqa: E402

from attnkit.serve import Limits, create_app  # noqa: E402
from tests.serve.test_api import continuation, error_of, sse_events  # noqa: E402

MESSAGES = [{"role": "user", "content": "Who made the earth, and in how many days?"}]
SCHEMA = {
    "type": "object",
    "properties": {"who": {"enum": ["God", "Moses", "Noah"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                   "light": {"type": "boolean"}},
    "required": ["who", "days", "light"], "additionalProperties": False,
}  # fmt: skip
CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}  # refs, nothing else
EMPTY_RANGE = {"type": "integer", "minimum": 3, "maximum": 1}
FORMAT = {"type": "json_schema", "json_schema": {"name": "creation", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def client(gpt: Model) -> Iterator[TestClient]:
    with TestClient(create_app(gpt, "tiny-gpt", Limits(max_new_tokens=64, max_batch=8))) as client:
        yield client


def valid(text: str, schema: dict) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


def test_a_json_schema_answer_is_generates_and_valid(gpt: Model, client: TestClient) -> None:
    body = {"messages": MESSAGES, "max_tokens": 48, "temperature": 0, "response_format": FORMAT}
    answer = client.post("/v1/chat/completions", json=body).json()
    ids = chat_prompt(gpt.chat_template, gpt.tokenizer, gpt.config, MESSAGES)
    expected = gpt.tokenizer.decode(continuation(gpt, ids, 48, grammar=SCHEMA), skip_special_tokens=True)
    choice = answer["choices"][0]
    assert choice["message"]["content"] == expected and choice["finish_reason"] == "stop"
    valid(expected, SCHEMA)
    unconstrained = client.post("/v1/chat/completions", json={**body, "response_format": {"type": "text"}}).json()
    assert unconstrained["choices"][0]["message"]["content"] != expected  # the model alone writes no such JSON
    events = sse_events(client.post("/v1/chat/completions", json={**body, "stream": True}).text)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == expected


def test_sampled_choices_are_each_valid(client: TestClient) -> None:
    body = {"messages": MESSAGES, "max_tokens": 48, "temperature": 1.0, "n": 4, "seed": 1, "response_format": FORMAT}
    choices = client.post("/v1/chat/completions", json=body).json()["choices"]
    assert {c["finish_reason"] for c in choices} <= {"stop", "length"}  # length: closed early for max_tokens
    values = [valid(c["message"]["content"], SCHEMA) for c in choices]
    assert len({json.dumps(v, sort_keys=True) for v in values}) > 1  # each choice its own grammar state


def test_an_answer_max_tokens_would_cut_is_closed_valid_and_said_so(gpt: Model, client: TestClient) -> None:
    """An open string the tiny model would write past ``max_tokens`` is closed in time: the
    answer is the library's (generate's budget is the same), valid, and its finish reason
    "length" says it was shortened; streamed the same."""
    open_ended = {"type": "object", "properties": {"said": {"type": "string"}}, "required": ["said"],
                  "additionalProperties": False}  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "said", "schema": open_ended}}
    body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "response_format": fmt}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    ids = chat_prompt(gpt.chat_template, gpt.tokenizer, gpt.config, MESSAGES)
    expected = continuation(gpt, ids, 12, grammar=open_ended)
    assert len(expected) < 12  # its end token within the 12 (continuation leaves it out)
    assert choice["message"]["content"] == gpt.tokenizer.decode(expected, skip_special_tokens=True)
    assert choice["finish_reason"] == "length" and valid(choice["message"]["content"], open_ended)["said"]
    events = sse_events(client.post("/v1/chat/completions", json={**body, "stream": True}).text)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == choice["message"]["content"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"  # the last before [DONE]


def test_json_object_and_completions(client: TestClient) -> None:
    body = {
        "prompt": "In the beginning",
        "max_tokens": 64,
        "temperature": 0,
        "response_format": {"type": "json_object"},
    }
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert isinstance(json.loads(choice["text"]), dict)  # closed within max_tokens ("length" if early)


def test_a_cut_answer_is_length_not_valid(client: TestClient) -> None:
    body = {"messages": MESSAGES, "max_tokens": 3, "temperature": 0, "response_format": FORMAT}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice["message"]["content"])


@pytest.mark.parametrize(
    ("response_format", "status", "fragment", "param"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}},
         400, 'Unimplemented keys: ["uniqueItems"]', "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
         400, "Invalid type: strin", "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": EMPTY_RANGE}},
         400, "minimum (3) is greater than maximum (1)", "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": CYCLE}},
         400, "nothing can begin it", "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}},
         400, "must be a JSON object, got list", "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, 422, 'with a "name"',
         "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}, 422, "strict must be true or false",
         "response_format.json_schema.strict"),
        ({"type": "xml"}, 422, "must be one of text, json_object, json_schema, got 'xml'", "response_format"),
        ("json", 422, "must be one of", "response_format"),
    ],
)  # fmt: skip
def test_a_format_the_server_cannot_keep_is_refused_by_name(
    client: TestClient, response_format: object, status: int, fragment: str, param: str
) -> None:
    body = {"messages": MESSAGES, "max_tokens": 4, "response_format": response_format}
    error_of(client.post("/v1/chat/completions", json=body), status, fragment, param)
    assert client.get("/health").status_code == 200


def test_a_server_that_bounds_schemas_keeps_answers_short(gpt: Model) -> None:
    """``--bound-schemas`` (Limits.bound_schemas): the answer is generate's under the bounded
    schema, its string within 64 characters, valid against the schema as sent."""
    from attnkit.generation.grammar import bounded

    open_ended = {"type": "object", "properties": {"said": {"type": "string"}}, "required": ["said"],
                  "additionalProperties": False}  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": "said", "schema": open_ended}}
    body = {"messages": MESSAGES, "max_tokens": 64, "temperature": 0, "response_format": fmt}
    with TestClient(create_app(gpt, "tiny-gpt", Limits(max_new_tokens=64, bound_schemas=True))) as client:
        choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    ids = chat_prompt(gpt.chat_template, gpt.tokenizer, gpt.config, MESSAGES)
    expected = continuation(gpt, ids, 64, grammar=bounded(open_ended))
    assert choice["message"]["content"] == gpt.tokenizer.decode(expected, skip_special_tokens=True)
    assert choice["finish_reason"] == "stop" and len(valid(choice["message"]["content"], open_ended)["said"]) <= 64
