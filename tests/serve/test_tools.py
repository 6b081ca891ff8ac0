"""Tool calls through the server's chat API (Starlette's test client, the tiny trained GPT):
``tools`` with ``tool_choice`` required, a named function and auto, ``parallel_tool_calls``,
each call's name among the tools and its arguments valid against the tool's parameters
(jsonschema), the answer the library's ``generate`` under the same grammar, streamed as the SDK
gathers ``tool_calls`` deltas; a conversation carrying calls and results back in; every refusal
naming its field."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch

from attnkit.generation.text import chat_prompt
from attnkit.models import Model

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'attnkit[serve]'")
pytest.importorskip("llguidance", reason="the grammar extra is not installed: pip install 'attnkit[grammar]'")
jsonschema = pytest.importorskip("jsonschema", reason="the test extra is not installed: pip install 'attnkit[test]'")
from starlette.testclient import TestClient  # noqa: E402

from attnkit.serve import Limits, create_app  # noqa: E402
from attnkit.serve.tools import Tools, calls_of, response  # noqa: E402
from tests.serve.test_api import error_of, sse_events  # noqa: E402

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}  # fmt: skip
DAYS = {"type": "object", "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["days"],
        "additionalProperties": False}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "count_days", "parameters": DAYS}}]  # fmt: skip
PARAMETERS = {"get_weather": WEATHER, "count_days": DAYS}
MESSAGES = [{"role": "user", "content": "What is the weather in Jerusalem?"}]


@pytest.fixture(scope="module")
def gpt(long_gpt: Model) -> Model:
    return long_gpt


@pytest.fixture(scope="module")
def client(gpt: Model) -> Iterator[TestClient]:
    with TestClient(create_app(gpt, "tiny-gpt", Limits(max_new_tokens=96, max_batch=8))) as client:
        yield client


def chat(client: TestClient, **fields: object) -> dict:
    body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 96, "temperature": 0, **fields}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def checked(calls: list[dict]) -> list[tuple[str, dict]]:
    """Each call's name and arguments, the arguments valid against the tool's parameters."""
    out = []
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
        jsonschema.validate(arguments, PARAMETERS[name])
        out.append((name, arguments))
    return out


def test_required_calls_are_valid_and_generates(gpt: Model, client: TestClient) -> None:
    answer = chat(client, tool_choice="required")
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    got = checked(choice["message"]["tool_calls"])
    tools = Tools(PARAMETERS, TOOLS, "required", True)
    system = [{"role": "system", "content": tools.prompt()}, *MESSAGES]
    ids = chat_prompt(gpt.chat_template, gpt.tokenizer, gpt.config, system)
    out = gpt.generate(torch.tensor([ids]), max_new_tokens=96, grammar=tools.grammar())[0, len(ids) :].tolist()
    text = gpt.tokenizer.decode(out[: out.index(gpt.config.eos_token_id)], skip_special_tokens=True)
    assert got == checked(calls_of(text) or [])


def test_a_named_function_and_one_call(client: TestClient) -> None:
    named = {"type": "function", "function": {"name": "count_days"}}
    calls = chat(client, tool_choice=named, parallel_tool_calls=False)["choices"][0]["message"]["tool_calls"]
    assert [name for name, _ in checked(calls)] == ["count_days"]
    sampled = chat(client, tool_choice="required", parallel_tool_calls=False, temperature=1.0, n=4, seed=2)
    assert all(len(c["message"]["tool_calls"]) == 1 for c in sampled["choices"] if c["finish_reason"] == "tool_calls")
    assert sum(c["finish_reason"] == "tool_calls" for c in sampled["choices"]) >= 3


def test_streamed_calls_gather_to_the_whole_answer(client: TestClient) -> None:
    whole = chat(client, tool_choice="required")["choices"][0]["message"]["tool_calls"]
    events = sse_events(client.post("/v1/chat/completions", json={
        "messages": MESSAGES, "tools": TOOLS, "max_tokens": 96, "temperature": 0, "tool_choice": "required",
        "stream": True}).text)  # fmt: skip
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"] for e in events[1:-1]]
    assert all("content" not in d for d in deltas)  # nothing of the calls' text leaks as content
    streamed = [call for d in deltas for call in d.get("tool_calls", [])]
    assert [c["index"] for c in streamed] == list(range(len(whole)))
    assert [c["function"] for c in streamed] == [c["function"] for c in whole]
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_auto_answers_text_or_calls(client: TestClient) -> None:
    choice = chat(client)["choices"][0]
    if choice["finish_reason"] == "tool_calls":
        checked(choice["message"]["tool_calls"])
    else:
        assert not choice["message"]["content"].startswith("<")
    free = chat(client, tool_choice="none")["choices"][0]  # no tools offered: the plain chat
    plain = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 96, "temperature": 0})
    assert free["message"] == plain.json()["choices"][0]["message"]


def test_a_conversation_carries_calls_and_results_back(gpt: Model, client: TestClient) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
            "arguments": json.dumps({"city": "Jerusalem", "unit": "celsius"})}}  # fmt: skip
    turns = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"}]  # fmt: skip
    tokens = client.post("/tokenize", json={"messages": turns}).json()["tokens"]
    written = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Jerusalem", "unit": "celsius"}}\n</tool_call>\n'
    )
    seen = [
        *MESSAGES,
        {"role": "assistant", "content": written},
        {"role": "user", "content": response("21 degrees, sunny")},
    ]
    assert tokens == chat_prompt(gpt.chat_template, gpt.tokenizer, gpt.config, seen)
    assert chat(client, messages=turns)["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(
    ("fields", "status", "fragment", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, 400,
         "must be a JSON schema of an object", "tools[0].function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "uniqueItems": True}}}], "tool_choice": "required"}, 400, 'Unimplemented keys: ["uniqueItems"]', "tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, 422, "1 to 64 letters",
         "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, 422, '{"type": "function"', "tools[0]"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, "'nope', which is not among",
         "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, 400, "needs tools", "tool_choice"),
        ({"tool_choice": "sometimes"}, 422, 'tool_choice must be "none"', "tool_choice"),
        ({"parallel_tool_calls": "yes"}, 422, "parallel_tool_calls", "parallel_tool_calls"),
        ({"response_format": {"type": "json_object"}}, 400, "response_format with tools", "response_format"),
        ({"functions": [{"name": "f"}]}, 400, "deprecated form; send tools", "functions"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]}, 422,
         "tool_calls[0] must be a function with a name and JSON arguments", "messages"),
    ],
)  # fmt: skip
def test_tools_the_server_cannot_call_are_refused_by_name(
    client: TestClient, fields: dict, status: int, fragment: str, param: str
) -> None:
    body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 4, **fields}
    error_of(client.post("/v1/chat/completions", json=body), status, fragment, param)
    completions = client.post("/v1/completions", json={"prompt": "x", "tools": TOOLS})
    error_of(completions, 400, "the completions API has no tool calls", "tools")
    assert client.get("/health").status_code == 200


def test_a_server_that_bounds_schemas_bounds_the_arguments(gpt: Model) -> None:
    from attnkit.generation.grammar import bounded

    free = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}
    tool = {"type": "function", "function": {"name": "write", "parameters": free}}
    body = {"messages": MESSAGES, "tools": [tool], "tool_choice": "required", "parallel_tool_calls": False,
            "max_tokens": 240, "temperature": 0}  # fmt: skip  # 64 characters take many of this tokenizer's tokens
    with TestClient(create_app(gpt, "tiny-gpt", Limits(max_new_tokens=240, bound_schemas=True))) as client:
        choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, bounded(free))
    jsonschema.validate(arguments, free)
