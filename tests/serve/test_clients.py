"""The clients people use, unchanged, against a live ``attnkit serve`` on loopback: the openai
SDK and LangChain (chat, completions and embeddings, streamed and not) on the real SmolLM2 and
all-MiniLM-L6-v2, each answer against attnkit's own ``generate``/``encode`` in this process;
and lm-evaluation-harness's ``local-completions`` and ``local-chat-completions`` on a small
task of our own against its ``hf`` model on ``export_hf``'s directory of the same weights."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from pydantic import BaseModel, Field
from torch.testing import assert_close

import attnkit
from attnkit.generation.text import chat_prompt
from attnkit.models import Model
from attnkit.serve.server import spawn

openai = pytest.importorskip("openai", reason="the clients extra is not installed: pip install 'attnkit[clients]'")
pytest.importorskip("uvicorn", reason="the serve extra is not installed: pip install 'attnkit[serve]'")


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> Model:
    return attnkit.from_pretrained(smollm2_gguf)


@pytest.fixture(scope="module")
def chat_server(smollm2_gguf: Path) -> Iterator[str]:
    # fp32, as the library's model it is compared with (the command's default, auto, would be int8); the
    # server's default flags, its step kept eager by the suite's ATTNKIT_AUTO_COMPILE=0 (a background compile of
    # SmolLM2 takes minutes)
    with spawn(smollm2_gguf, "--name", "smollm2", "--weights", "fp32", threads=1) as (url, _, _):
        yield url


@pytest.fixture(scope="module")
def client(chat_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{chat_server}/v1", api_key="unused", max_retries=0)


def generated(model: Model, ids: list[int], new: int, **options: object) -> str:
    """What attnkit's ``generate`` makes of ``ids`` in this process (greedy unless ``options`` say
    otherwise), up to its end token."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=new, **options)[0, len(ids) :].tolist()
    eos = model.config.eos_token_id
    return model.tokenizer.decode(out[: out.index(eos)] if eos in out else out, skip_special_tokens=True)


def test_the_openai_sdk_chats(smollm2: Model, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["smollm2"]
    assert client.models.retrieve("smollm2").owned_by == "attnkit"
    ids = chat_prompt(smollm2.chat_template, smollm2.tokenizer, smollm2.config, QUESTION)
    expected = generated(smollm2, ids, 12)
    answer = client.chat.completions.create(model="smollm2", messages=QUESTION, max_completion_tokens=12, temperature=0)  # type: ignore[call-overload]
    assert answer.choices[0].message.content == expected and "Paris" in expected
    assert answer.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == answer.usage.completion_tokens
    parts = [{"role": "user", "content": [{"type": "text", "text": QUESTION[0]["content"]}]}]
    stopped = client.chat.completions.create(
        model="smollm2", messages=parts, max_tokens=12, temperature=0, stop=["Paris"], frequency_penalty=0,
        presence_penalty=0, logprobs=True, top_logprobs=3, user="someone",
    )  # fmt: skip
    choice = stopped.choices[0]
    assert choice.message.content == expected[: expected.index("Paris")] and choice.finish_reason == "stop"
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in choice.logprobs.content)
    two = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=6, n=2, seed=3)
    # choice j samples with seed + j (docs/serving.md), at the server's defaults: temperature 1, top_p 1
    samples = [generated(smollm2, ids, 6, do_sample=True, seed=3 + j, temperature=1.0, top_p=1.0) for j in (0, 1)]
    assert samples[0] != samples[1]  # so that a repeated or swapped seed shows
    assert [(c.index, c.message.content) for c in two.choices] == [(0, samples[0]), (1, samples[1])]


def test_the_openai_sdk_completes_and_scores(smollm2: Model, client: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    ids = smollm2.tokenizer.encode(prompt).ids
    answer = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0)
    assert answer.choices[0].text == generated(smollm2, ids, 8)
    streamed = client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == answer.choices[0].text
    scored = client.completions.create(
        model="smollm2", prompt=[ids, ids[:3]], max_tokens=1, temperature=0, logprobs=1, echo=True
    )
    with torch.no_grad():
        oracle = torch.log_softmax(smollm2(torch.tensor([ids])).logits[0].float(), dim=-1)
    logprobs = scored.choices[0].logprobs.token_logprobs
    assert logprobs[0] is None and len(logprobs) == len(ids) + 1
    assert_close(torch.tensor(logprobs[1 : len(ids)]), oracle[range(len(ids) - 1), ids[1:]], atol=1e-3, rtol=1e-3)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.completions.create(model="gpt-4", prompt=prompt, max_tokens=2)
    with pytest.raises(openai.UnprocessableEntityError, match="logprobs must be between 0 and 5"):
        client.completions.create(model="smollm2", prompt=prompt, max_tokens=2, logprobs=9)


def test_langchain_chats(chat_server: str, client: openai.OpenAI) -> None:
    chat_openai = pytest.importorskip("langchain_openai").ChatOpenAI
    llm = chat_openai(base_url=f"{chat_server}/v1", api_key="unused", model="smollm2", temperature=0,
                      max_completion_tokens=12, max_retries=0)  # fmt: skip
    expected = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=12, temperature=0)
    text = expected.choices[0].message.content
    assert llm.invoke(QUESTION[0]["content"]).content == text
    assert "".join(chunk.content for chunk in llm.stream(QUESTION[0]["content"])) == text


class Person(BaseModel):
    """What the SDK and LangChain turn into a response_format json_schema."""

    name: str
    age: int = Field(ge=0, le=150)


PERSON = [{"role": "user", "content": "Describe a person called Ada, aged 36, as JSON."}]


def test_the_openai_sdk_parses_structured_output(smollm2: Model, client: openai.OpenAI) -> None:
    """``chat.completions.parse`` with a Pydantic model: the strict schema the SDK sends keeps
    SmolLM2's answer to it (alone it answers in prose), the same as ``generate`` under that schema."""
    from openai.lib._pydantic import to_strict_json_schema  # the schema the SDK sends for Person

    parsed = client.chat.completions.parse(model="smollm2", messages=PERSON, response_format=Person,
                                           max_tokens=48, temperature=0)  # type: ignore[arg-type]  # fmt: skip
    message = parsed.choices[0].message
    assert parsed.choices[0].finish_reason == "stop" and message.parsed == Person(name="Ada", age=36)
    ids = chat_prompt(smollm2.chat_template, smollm2.tokenizer, smollm2.config, PERSON)
    out = smollm2.generate(torch.tensor([ids]), max_new_tokens=48, grammar=to_strict_json_schema(Person))
    new = out[0, len(ids) :].tolist()
    assert message.content == smollm2.tokenizer.decode(new[: new.index(2)], skip_special_tokens=True)
    fmt = {"type": "json_schema", "json_schema": {"name": "Person", "schema": to_strict_json_schema(Person),
                                                  "strict": True}}  # fmt: skip
    stream = client.chat.completions.create(model="smollm2", messages=PERSON, response_format=fmt, max_tokens=48,
                                            temperature=0, stream=True)  # type: ignore[call-overload]  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == message.content
    unique = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError, match="Unimplemented keys"):
        client.chat.completions.create(model="smollm2", messages=PERSON, max_tokens=4, response_format=unique)


def test_langchain_structured_output(chat_server: str, client: openai.OpenAI) -> None:
    """``with_structured_output(Person)`` (json_schema), LangChain unchanged; an answer cut by its
    token cap is LangChain's length error, not a parse of broken JSON."""
    chat_openai = pytest.importorskip("langchain_openai").ChatOpenAI
    llm = chat_openai(base_url=f"{chat_server}/v1", api_key="unused", model="smollm2", temperature=0,
                      max_completion_tokens=48, max_retries=0)  # fmt: skip
    assert llm.with_structured_output(Person, method="json_schema").invoke(PERSON[0]["content"]) == Person(
        name="Ada", age=36
    )
    with pytest.raises(openai.LengthFinishReasonError):
        llm.with_structured_output(Person, method="json_schema").invoke(PERSON[0]["content"], max_completion_tokens=4)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def weather(city: str) -> str:
    """The tool the tests call: a fixed answer per city."""
    return f"18 degrees and sunny in {city}"


def test_the_openai_sdk_calls_a_tool_and_reads_its_result(client: openai.OpenAI) -> None:
    """A tool call (required, one: with more allowed SmolLM2 repeats the same call until its
    tokens run out), streamed the same, executed, and its result carried back in."""
    asked = dict(model="smollm2", tools=[WEATHER_TOOL], max_tokens=64, temperature=0, parallel_tool_calls=False)
    answer = client.chat.completions.create(messages=ASK_WEATHER, tool_choice="required", **asked)  # type: ignore[call-overload]
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and set(arguments) == {"city"}, arguments
    stream = client.chat.completions.create(messages=ASK_WEATHER, tool_choice="required", stream=True, **asked)  # type: ignore[call-overload]
    deltas = [c.choices[0].delta for c in stream if c.choices]
    gathered = [t for d in deltas for t in d.tool_calls or []]
    assert [(t.function.name, t.function.arguments) for t in gathered] == [("get_weather", call.function.arguments)]
    turns = [*ASK_WEATHER, choice.message, {"role": "tool", "tool_call_id": call.id, "content": weather(**arguments)}]
    final = client.chat.completions.create(messages=turns, tool_choice="none", **asked)  # type: ignore[call-overload]
    assert final.choices[0].message.content and final.choices[0].message.tool_calls is None
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        client.chat.completions.create(messages=ASK_WEATHER, tool_choice={"type": "function", "function": {
            "name": "get_time"}}, **asked)  # type: ignore[call-overload]  # fmt: skip


def test_langchain_binds_a_tool_and_answers_with_its_result(chat_server: str) -> None:
    """``bind_tools`` as an agent loop uses it: the call executed, a ToolMessage answered."""
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    get_weather = tool(weather)
    llm = langchain_openai.ChatOpenAI(base_url=f"{chat_server}/v1", api_key="unused", model="smollm2", temperature=0,
                                      max_completion_tokens=64, max_retries=0)  # fmt: skip
    asked = [HumanMessage(ASK_WEATHER[0]["content"])]
    message = llm.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False).invoke(asked)
    (call,) = message.tool_calls
    assert call["name"] == "weather" and set(call["args"]) == {"city"}
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    answer = llm.bind_tools([get_weather], tool_choice="none", parallel_tool_calls=False).invoke(
        [*asked, message, result]
    )
    assert answer.content and not answer.tool_calls


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path) -> Iterator[tuple[Model, str]]:
    with spawn(minilm_dir, "--name", "minilm", "--weights", "fp32", threads=1) as (url, _, _):
        yield attnkit.from_pretrained(minilm_dir), url


def test_embeddings_through_the_sdk_and_langchain(minilm: tuple[Model, str]) -> None:
    model, url = minilm
    texts = ["The Lord is my shepherd; I shall not want.", "Jesus wept."]
    expected = model.encode(texts)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    packed = client.embeddings.create(model="minilm", input=texts)  # the SDK asks for base64
    assert_close(torch.tensor([d.embedding for d in packed.data]), expected, atol=1e-6, rtol=0)
    floats = client.embeddings.create(model="minilm", input=texts[1], encoding_format="float")
    assert_close(torch.tensor(floats.data[0].embedding), expected[1], atol=1e-6, rtol=0)
    assert packed.usage.prompt_tokens == sum(map(len, model.text_ids(texts)))
    embeddings = pytest.importorskip("langchain_openai").OpenAIEmbeddings(
        model="minilm", base_url=f"{url}/v1", api_key="unused", check_embedding_ctx_length=False, max_retries=0
    )  # check_embedding_ctx_length=False: LangChain would send OpenAI's own (tiktoken) ids otherwise
    assert_close(torch.tensor(embeddings.embed_documents(texts)), expected, atol=1e-6, rtol=0)
    assert_close(torch.tensor(embeddings.embed_query(texts[0])), expected[0], atol=1e-6, rtol=0)


# A multiple-choice task of our own (lm-eval's YAML, data from a local file) in two forms:
# scored by log-likelihood, and answered by generation.
CAPITALS = [
    ("France", ["Paris", "Lyon", "Nice", "Lille"], 0),
    ("Italy", ["Milan", "Rome", "Naples", "Turin"], 1),
    ("Germany", ["Munich", "Hamburg", "Berlin", "Cologne"], 2),
    ("Spain", ["Seville", "Valencia", "Bilbao", "Madrid"], 3),
    ("Japan", ["Tokyo", "Osaka", "Kyoto", "Nagoya"], 0),
    ("Egypt", ["Alexandria", "Cairo", "Giza", "Luxor"], 1),
]
TASKS = {
    "attnkit_capitals": {
        "output_type": "multiple_choice",
        "doc_to_text": "Question: What is the capital of {{country}}?\nAnswer:",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "acc"}],
    },
    "attnkit_capitals_gen": {
        "output_type": "generate_until",
        "doc_to_text": "The capital of {{country}} is",
        "doc_to_target": "{{choices[answer]}}",
        "generation_kwargs": {"until": ["\n", "."], "max_gen_toks": 8, "do_sample": False, "temperature": 0},
        "metric_list": [
            {"metric": "exact_match", "ignore_case": True, "ignore_punctuation": True, "regexes_to_ignore": [" "]}
        ],
    },
}


@pytest.fixture(scope="module")
def lm_eval_setup(smollm2: Model, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pytest.importorskip("lm_eval", reason="the clients extra is not installed: pip install 'attnkit[clients]'")
    root = tmp_path_factory.mktemp("lm-eval")
    data = root / "capitals.jsonl"
    data.write_text("".join(json.dumps({"country": c, "choices": ch, "answer": a}) + "\n" for c, ch, a in CAPITALS))
    for name, spec in TASKS.items():
        task = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
                "test_split": "test", **spec}  # fmt: skip
        (root / f"{name}.yaml").write_text(json.dumps(task))  # JSON is YAML
    export = root / "smollm2-hf"
    attnkit.export_hf(smollm2, export)
    return root, export


def evaluate(tasks: Path, task: str, model: str, model_args: dict, chat: bool = False) -> tuple[dict, list]:
    """lm-eval's ``simple_evaluate`` of ``task``: its metrics and its samples."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    out = lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=[task], task_manager=TaskManager(include_path=str(tasks)),
        log_samples=True, apply_chat_template=chat, batch_size=1,
    )  # fmt: skip
    assert out is not None
    return out["results"][task], sorted(out["samples"][task], key=lambda s: s["doc_id"])


def test_lm_eval_through_the_server_equals_lm_eval_on_the_export(
    chat_server: str, lm_eval_setup: tuple[Path, Path]
) -> None:
    tasks, export = lm_eval_setup
    hf = {"pretrained": str(export), "dtype": "float32", "device": "cpu"}
    api = {"model": "smollm2", "tokenizer": str(export), "tokenizer_backend": "huggingface", "max_retries": 1,
           "num_concurrent": 1}  # fmt: skip
    reference, reference_samples = evaluate(tasks, "attnkit_capitals", "hf", hf)
    served, served_samples = evaluate(
        tasks, "attnkit_capitals", "local-completions", {**api, "base_url": f"{chat_server}/v1/completions"}
    )
    assert served["acc,none"] == reference["acc,none"] >= 0.5
    for ours, theirs in zip(served_samples, reference_samples, strict=True):  # per choice: (log-likelihood, greedy)
        assert_close(torch.tensor([r[0][0] for r in ours["resps"]]), torch.tensor([r[0][0] for r in theirs["resps"]]),
                     atol=2e-3, rtol=0)  # fmt: skip
        assert [r[0][1] for r in ours["resps"]] == [r[0][1] for r in theirs["resps"]]
    generated = {}
    for model, args, chat in (
        ("hf", hf, False),
        ("local-completions", {**api, "base_url": f"{chat_server}/v1/completions"}, False),
        ("hf", hf, True),
        ("local-chat-completions", {**api, "base_url": f"{chat_server}/v1/chat/completions",
                                    "tokenized_requests": False}, True),
    ):  # fmt: skip
        samples = evaluate(tasks, "attnkit_capitals_gen", model, args, chat)[1]
        generated[f"{model}{' chat' if chat else ''}"] = [s["resps"][0][0] for s in samples]
    assert generated["local-completions"] == generated["hf"]  # cut at the task's stop sequences
    assert generated["local-chat-completions chat"] == generated["hf chat"]
    assert generated["hf"][0] == " Paris"
    assert not any("\n" in answer or "." in answer for answer in generated["local-completions"])
