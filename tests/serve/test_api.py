"""The server's API through Starlette's test client, on tiny trained models: every endpoint,
the streamed chunks and their order, served outputs equal to ``model.generate`` for the same
settings, and every error with its status and ``{"error": {"message", "type"}}``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import torch
from torch.testing import assert_close

from attnkit.generation.text import chat_prompt, prompt_ids, source_ids
from attnkit.models import Model

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'attnkit[serve]'")
httpx = pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from attnkit.serve import Limits, create_app  # noqa: E402

PROMPTS = ["In the beginning God created", "And the earth was"]
TEXTS = ["In the beginning God created the heavens and the earth.", "And God said, let there be light."]


@pytest.fixture(scope="module")
def gpt_client(gpt: Model) -> Iterator[TestClient]:
    with TestClient(create_app(gpt, "tiny-gpt", Limits(max_new_tokens=64, max_batch=8))) as client:
        yield client


@pytest.fixture(scope="module")
def translator_client(translator: Model) -> Iterator[TestClient]:
    with TestClient(create_app(translator, "tiny-translator", Limits(max_new_tokens=40, max_beams=4))) as client:
        yield client


def sse_events(text: str) -> list:
    """The data of each server-sent event, in order; [DONE] as the string."""
    blocks = [b for b in text.split("\n\n") if b.strip()]
    assert all(b.startswith("data: ") for b in blocks), blocks
    return [b[6:] if b[6:] == "[DONE]" else json.loads(b[6:]) for b in blocks]


def continuation(model: Model, ids: list[int], new: int, **options: object) -> list[int]:
    """What ``model.generate`` makes of ``ids`` (after the prompt, or after the decoder's start
    token), up to (without) the end token."""
    start = 1 if model.config.is_encoder_decoder else len(ids)
    out = model.generate(torch.tensor([ids]), max_new_tokens=new, **options)[0, start:].tolist()
    eos = model.config.eos_token_id
    return out[: out.index(eos)] if eos in out else out


def error_of(response: httpx.Response, status: int, fragment: str, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert fragment in body["error"]["message"], body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param
    assert "Traceback" not in response.text


def test_health(gpt_client: TestClient, translator_client: TestClient) -> None:
    health = gpt_client.get("/health").json()
    limits = {
        "max_new_tokens": 64,
        "max_input_tokens": gpt_client.app.state.attnkit.model.config.max_len,
        "max_beams": 8,
    }
    assert health == {"status": "ok", "model": "tiny-gpt", "family": "gpt", "limits": limits}
    assert translator_client.get("/health").json()["family"] == "transformer"
    page = gpt_client.get("/")
    assert (
        page.status_code == 200 and '<canvas id="heatmap"' in page.text and "http" not in page.text.split("<script>")[1]
    )


def test_completions_equal_generate(gpt: Model, gpt_client: TestClient) -> None:
    tokenizer = gpt.tokenizer
    ids = prompt_ids(tokenizer, gpt.config, PROMPTS)
    body = {"prompt": PROMPTS, "max_tokens": 12, "temperature": 0}
    answer = gpt_client.post("/v1/completions", json=body).json()
    assert answer["object"] == "text_completion" and answer["model"] == "tiny-gpt"
    expected = [tokenizer.decode(continuation(gpt, p, 12), skip_special_tokens=True) for p in ids]
    assert [c["text"] for c in answer["choices"]] == expected
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert answer["usage"]["prompt_tokens"] == sum(map(len, ids))
    # A prompt given as token ids, and seeded sampling: the same as generate's.
    sampled = {"prompt": ids[0], "max_tokens": 10, "temperature": 0.8, "top_p": 0.9, "seed": 7}
    text = gpt_client.post("/v1/completions", json=sampled).json()["choices"][0]["text"]
    options = dict(do_sample=True, temperature=0.8, top_p=0.9, seed=7)
    assert text == tokenizer.decode(continuation(gpt, ids[0], 10, **options), skip_special_tokens=True)


def test_streamed_completion_is_the_same_text_in_order(gpt_client: TestClient) -> None:
    body = {"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0}
    whole = gpt_client.post("/v1/completions", json=body).json()["choices"][0]
    response = gpt_client.post("/v1/completions", json={**body, "stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons[:-1] == [None] * (len(chunks) - 1) and reasons[-1] == whole["finish_reason"]


def test_chat_completions(gpt: Model, gpt_client: TestClient) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who made the earth?"}]
    body = {"messages": messages, "max_tokens": 8, "temperature": 0}
    answer = gpt_client.post("/v1/chat/completions", json=body).json()
    ids = chat_prompt(gpt.chat_template, gpt.tokenizer, gpt.config, messages)
    expected = gpt.tokenizer.decode(continuation(gpt, ids, 8), skip_special_tokens=True)
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": expected}
    events = sse_events(gpt_client.post("/v1/chat/completions", json={**body, "stream": True}).text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""} and events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == expected


@pytest.mark.parametrize("beams", [1, 3])
def test_translate_equals_generate(translator: Model, translator_client: TestClient, beams: int) -> None:
    sources = source_ids(translator.tokenizer, translator.config.eos_token_id, TEXTS)
    expected = []
    for ids in sources:  # one at a time: the server's batch must not change a translation
        new = continuation(translator, ids, 20, num_beams=beams)
        expected.append(translator.tokenizer.decode(new, skip_special_tokens=True))
    body = {"text": TEXTS, "num_beams": beams, "max_new_tokens": 20}
    assert translator_client.post("/v1/translate", json=body).json() == {"translations": expected}
    if beams == 1:
        events = sse_events(translator_client.post("/v1/translate", json={**body, "stream": True}).text)
        assert events[-1] == "[DONE]" and events[-2] == {"translations": expected}
        for row in (0, 1):
            assert "".join(e["delta"] for e in events[:-2] if e["index"] == row) == expected[row]


def test_translate_ends_at_every_end_token_the_checkpoint_lists(translator: Model) -> None:
    """A generation_config.json's eos_token_id list ends each translation at the first of its
    tokens, answered whole and streamed, as generate() ends it."""
    import copy

    listing = copy.deepcopy(translator)
    eos = translator.config.eos_token_id
    ids = source_ids(translator.tokenizer, eos, TEXTS[:1])[0]
    greedy = continuation(translator, ids, 20, num_beams=1)
    assert eos not in greedy[:3], greedy  # the test needs a third token that is not already the end
    stop = greedy[2]
    listing.generation_defaults = {"eos_token_id": [eos, stop]}
    expected = translator.tokenizer.decode(greedy[: greedy.index(stop)], skip_special_tokens=True)
    body = {"text": TEXTS[:1], "num_beams": 1, "max_new_tokens": 20}
    with TestClient(create_app(listing, "tiny-translator", Limits(max_new_tokens=40))) as client:
        assert client.post("/v1/translate", json=body).json() == {"translations": [expected]}
        events = sse_events(client.post("/v1/translate", json={**body, "stream": True}).text)
    assert events[-2] == {"translations": [expected]}
    assert "".join(e["delta"] for e in events[:-2]) == expected


def test_t5_translates(t5: Model) -> None:
    with TestClient(create_app(t5, "tiny-t5")) as client:
        ids = source_ids(t5.tokenizer, t5.config.eos_token_id, TEXTS[:1])[0]
        new = continuation(t5, ids, 12, num_beams=1)
        answer = client.post("/v1/translate", json={"text": TEXTS[0], "num_beams": 1, "max_new_tokens": 12})
        assert answer.json() == {"translations": [t5.tokenizer.decode(new, skip_special_tokens=True)]}


def test_attention_weights_are_the_models(
    translator: Model, translator_client: TestClient, gpt_client: TestClient
) -> None:
    answer = translator_client.post("/v1/attention", json={"text": TEXTS[0], "target": "Au commencement"}).json()
    source, target = answer["tokens"]["source"], answer["tokens"]["target"]
    cfg = translator.config
    src = source_ids(translator.tokenizer, cfg.eos_token_id, TEXTS[:1])[0]
    tgt = [cfg.decoder_start_token_id, *translator.tokenizer.encode("Au commencement", add_special_tokens=False).ids]
    assert (len(source), len(target)) == (len(src), len(tgt)) and target[0] == "<s>"
    with torch.no_grad():
        out = translator(torch.tensor([src]), decoder_input_ids=torch.tensor([tgt]), output_attentions=True)
    recorded = {
        "encoder_self": out.attentions["encoder"]["self"],
        "cross": out.attentions["decoder"]["cross"],
        "decoder_self": out.attentions["decoder"]["self"],
    }
    for name, layers in recorded.items():
        served = torch.tensor(answer["attention"][name])  # (layers, heads, queries, keys)
        assert served.shape == (cfg.n_layers, cfg.n_heads, *layers[0].shape[-2:])
        assert_close(served, torch.stack([w[0] for w in layers]), atol=1e-4, rtol=0)
    assert_close(
        torch.tensor(answer["attention"]["cross"]).sum(-1),
        torch.ones(cfg.n_layers, cfg.n_heads, len(tgt)),
        atol=1e-3,
        rtol=0,
    )
    only_self = gpt_client.post("/v1/attention", json={"text": PROMPTS[0]}).json()
    assert list(only_self["attention"]) == ["decoder_self"] and list(only_self["tokens"]) == ["target"]
    causal = torch.tensor(only_self["attention"]["decoder_self"])
    assert (causal.triu(1) == 0).all()  # [eq:att-mask]: no query reads a later key


def test_metrics_count_requests_and_tokens(gpt_client: TestClient) -> None:
    gpt_client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0})
    gpt_client.post("/v1/completions", json={"prompt": ""})
    text = gpt_client.get("/metrics").text
    samples = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    assert samples['attnkit_requests_total{endpoint="/v1/completions",status="200"}'] >= 1
    assert samples['attnkit_requests_total{endpoint="/v1/completions",status="400"}'] >= 1
    assert samples["attnkit_generated_tokens_total"] >= 4
    assert samples["attnkit_batch_rows_count"] >= 1 and samples["attnkit_queue_length"] == 0
    assert samples['attnkit_request_duration_seconds_bucket{endpoint="/v1/completions",le="+Inf"}'] >= 2


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment", "param"),
    [
        ("/v1/completions", b"{not json", 400, "is not valid JSON", None),
        ("/v1/completions", b"[1, 2]", 400, "send a JSON object", None),
        ("/v1/completions", {"max_tokens": 3}, 422, "'prompt' is required", "prompt"),
        (
            "/v1/completions",
            {"prompt": 5},
            422,
            "prompt must be a string, a list of strings, a list of token ids",
            "prompt",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "max_tokens": "3"},
            422,
            'max_tokens must be an integer, got "3"',
            "max_tokens",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "max_tokens": -1},
            422,
            "max_tokens must be between 0 and 64",
            "max_tokens",
        ),
        ("/v1/completions", {"prompt": "x", "max_tokens": 65}, 413, "over this server's limit of 64", "max_tokens"),
        (
            "/v1/completions",
            {"prompt": "x", "temperature": -1},
            422,
            "temperature must be between 0.0 and 2.0",
            "temperature",
        ),
        ("/v1/completions", {"prompt": "x", "top_p": 0}, 422, "top_p must be in (0, 1]", "top_p"),
        (
            "/v1/completions",
            {"prompt": "x", "temperature": 1e-40},
            422,
            "temperature must be 0 (greedy) or at least 0.01",
            "temperature",
        ),
        ("/v1/completions", {"prompt": "x", "seed": 2**64}, 422, "seed must be between 0 and", "seed"),
        ("/v1/completions", b"[" * 100000, 400, "is not valid JSON", None),
        ("/v1/completions", {"prompt": "x", "n": 9}, 413, "n=9 is over this server's limit of 8", "n"),
        ("/v1/completions", {"prompt": ["x", "y"], "n": 5}, 413, "2 prompts x n=5 are 10 choices", "n"),
        ("/v1/completions", {"prompt": "x", "n": 0}, 422, "n must be between 1 and 8", "n"),
        ("/v1/completions", {"prompt": "x", "logprobs": 6}, 422, "logprobs must be between 0 and 5", "logprobs"),
        ("/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 422, "give at most 4", "stop"),
        ("/v1/completions", {"prompt": "x", "stop": [1]}, 422, "stop must be a string or a list of strings", "stop"),
        ("/v1/completions", {"prompt": "x", "frequency_penalty": 3}, 422, "between -2.0 and 2.0", "frequency_penalty"),
        ("/v1/completions", {"prompt": "x", "logit_bias": {"9999": 1}}, 422, "not a token id in 0..599", "logit_bias"),
        ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 101}}, 422, "a number in -100..100", "logit_bias"),
        ("/v1/completions", {"prompt": "x", "logit_bias": {"²": 1}}, 422, "not a token id", "logit_bias"),
        (
            "/v1/completions",
            {"prompt": "x", "stream_options": {"include_usage": True}},
            422,
            "stream_options is only for stream: true",
            "stream_options",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "echo": True, "logprobs": 1, "stream": True},
            422,
            "set stream to false",
            "echo",
        ),
        ("/v1/completions", {"prompt": "x", "suffix": "end"}, 400, "suffix is not supported", "suffix"),
        ("/v1/completions", {"prompt": "x", "n": 1, "best_of": 3}, 400, "best_of must equal n (1)", "best_of"),
        ("/v1/completions", {"prompt": "   "}, 400, "a prompt is empty", "prompt"),
        ("/v1/completions", {"prompt": []}, 422, "prompt is an empty list", "prompt"),
        ("/v1/completions", {"prompt": [[3, 4], []]}, 422, "a prompt of token ids is empty", "prompt"),
        ("/v1/completions", {"prompt": [3, 10**6]}, 422, "token id 1000000, out of range", "prompt"),
        (
            "/v1/completions",
            {"prompt": ["a"] * 9},
            413,
            "prompt holds 9 prompts, over this server's limit of 8",
            "prompt",
        ),
        ("/v1/completions", {"prompt": "x " * 600}, 413, "over this server's limit of", None),
        ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "model 'gpt-4' is not served here", "model"),
        (
            "/v1/completions",
            {"prompt": "x", "tools": [{"type": "function"}]},
            400,
            "the completions API has no tool calls",
            "tools",
        ),
        ("/v1/chat/completions", {"messages": []}, 422, "messages is empty", "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            422,
            "messages[0].role must be one of system, developer, user, assistant",
            "messages[0].role",
        ),
        ("/v1/chat/completions", {"messages": "hi"}, 422, "messages must be a list of", "messages"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": 3}]},
            422,
            "messages[0].content must be a string or a list of text parts",
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            400,
            "content[0] is a 'image_url' part",
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "robot", "content": "42"}]},
            422,
            "messages[0].role must be one of",
            "messages[0].role",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            422,
            "top_logprobs needs logprobs: true",
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
            422,
            "top_logprobs must be between 0 and 20",
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}},
            422,
            "response_format.type must be one of text, json_object, json_schema, got 'yaml'",
            "response_format",
        ),
        ("/v1/embeddings", {"input": "hi"}, 400, "needs an encoder (BERT-family) model", "model"),
        ("/v1/models/gpt-4", None, 404, "model 'gpt-4' is not served here", "model"),
        ("/tokenize", {"prompt": "x", "messages": []}, 422, "send either prompt", "prompt"),
        ("/detokenize", {"tokens": [10**6]}, 422, "out of range", "tokens"),
        ("/v1/translate", {"text": "hi"}, 400, "needs an encoder-decoder model", "model"),
        ("/v1/attention", {"text": ""}, 400, "text is empty", None),
        ("/v1/attention", {"text": "x", "layers": 2}, 422, "unknown field(s) layers", "layers"),
        ("/v1/attention", {"text": "x " * 90}, 413, "attention maps are drawn for at most 128", None),
    ],
)
def test_bad_requests_get_their_status_and_json(
    gpt_client: TestClient, path: str, body: object, status: int, fragment: str, param: str | None
) -> None:
    if body is None:
        response = gpt_client.get(path)
    else:
        response = gpt_client.post(path, **({"content": body} if isinstance(body, bytes) else {"json": body}))
    error_of(response, status, fragment, param)
    assert gpt_client.get("/health").status_code == 200  # and the server goes on


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"text": []}, 422, "text is an empty list"),
        ({"text": ["a", ""]}, 400, "a text is empty"),
        ({"text": "a", "num_beams": 9}, 413, "num_beams=9 is over this server's limit of 4"),
        ({"text": "a", "num_beams": 0}, 422, "num_beams must be between 1 and 4"),
        ({"text": "a", "num_beams": 2, "stream": True}, 422, "stream needs num_beams 1"),
        ({"text": ["a"] * 33}, 413, "33 texts are over this server's limit of 32"),
        ({"text": "a", "max_new_tokens": True}, 422, "max_new_tokens must be an integer, got true"),
    ],
)
def test_bad_translations(translator_client: TestClient, body: object, status: int, fragment: str) -> None:
    error_of(translator_client.post("/v1/translate", json=body), status, fragment)
    error_of(translator_client.post("/v1/completions", json={"prompt": "x"}), 400, "needs a GPT-family model")


def test_paths_methods_sizes_and_keys(gpt: Model) -> None:
    with TestClient(create_app(gpt, "g", Limits(max_body_bytes=100), api_key="s3cret")) as client:
        error_of(client.get("/nope", headers={"Authorization": "Bearer s3cret"}), 404, "no endpoint /nope")
        error_of(client.get("/v1/completions", headers={"Authorization": "Bearer s3cret"}), 405, "GET is not allowed")
        error_of(client.post("/v1/completions", json={"prompt": "x"}), 401, "the API key is missing")
        error_of(client.get("/metrics", headers={"Authorization": "Bearer nope"}), 401, "the API key is wrong")
        assert client.get("/health").status_code == 200 and client.get("/").status_code == 200  # open
        key = {"Authorization": "Bearer s3cret"}
        error_of(
            client.post("/v1/completions", json={"prompt": "x" * 200}, headers=key),
            413,
            "over this server's limit of 100",
        )
        ok = client.post("/v1/completions", json={"prompt": "In", "max_tokens": 2}, headers=key)
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 1


def test_model_errors_are_a_500_line_and_the_server_goes_on(gpt: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    with TestClient(create_app(gpt, "g")) as client:
        original = type(gpt.decoder).forward
        calls = {"n": 0}

        def failing(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            raise RuntimeError("simulated kernel failure")

        monkeypatch.setattr(type(gpt.decoder), "forward", failing)
        error_of(
            client.post("/v1/completions", json={"prompt": "In", "max_tokens": 3}), 500, "simulated kernel failure"
        )
        events = sse_events(client.post("/v1/completions", json={"prompt": "In", "max_tokens": 3, "stream": True}).text)
        assert "simulated kernel failure" in events[0]["error"]["message"] and events[-1] == "[DONE]"
        monkeypatch.setattr(type(gpt.decoder), "forward", original)
        assert calls["n"] == 2
        assert client.post("/v1/completions", json={"prompt": "In", "max_tokens": 3}).status_code == 200


def test_a_full_queue_is_429_and_a_draining_server_503(gpt: Model) -> None:
    app = create_app(gpt, "g", Limits(max_queue=1))  # no lifespan here: the model thread never takes a job

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            waiting = asyncio.create_task(client.post("/v1/completions", json={"prompt": "In"}))
            await asyncio.sleep(0.2)
            refused = await client.post("/v1/completions", json={"prompt": "In"})
            waiting.cancel()
            app.state.attnkit.draining = True
            return refused, await client.post("/v1/completions", json={"prompt": "In"})

    refused, draining = asyncio.run(scenario())
    error_of(refused, 429, "1 requests are waiting (--max-queue 1)")
    error_of(draining, 503, "the server is shutting down")


def test_a_template_that_refuses_a_conversation_is_a_400(gpt: Model) -> None:
    strict = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system messages') }}{% endif %}x"
    original = gpt.chat_template
    gpt.chat_template = strict
    try:
        with TestClient(create_app(gpt, "g")) as client:
            body = {"messages": [{"role": "system", "content": "be brief"}], "max_tokens": 2}
            error_of(
                client.post("/v1/chat/completions", json=body), 400, "refuses this conversation: no system messages"
            )
    finally:
        gpt.chat_template = original


def test_a_request_of_several_prompts_is_queued_whole_or_not_at_all(gpt: Model) -> None:
    app = create_app(gpt, "g", Limits(max_queue=2))  # no lifespan: nothing leaves the queue
    client = TestClient(app)
    error_of(client.post("/v1/completions", json={"prompt": ["a", "b", "c"]}), 429, "requests are waiting")
    assert app.state.attnkit.engine.pending() == 0  # none of the three was left behind


def test_serve_compiles_completions_where_a_compiler_is_found(
    gpt: Model, translator: Model, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnkit.cli.serve import _compile

    monkeypatch.setenv("CXX", "/bin/true")  # a compiler is found: compiled in the background unless told not to
    monkeypatch.setenv("ATTNKIT_AUTO_COMPILE", "1")
    assert _compile(None, gpt) == "auto" and _compile(True, gpt) is True and _compile(False, gpt) is False
    monkeypatch.setenv("ATTNKIT_AUTO_COMPILE", "0")  # the suite's: "auto" is eager
    assert _compile(None, gpt) is False and _compile(True, gpt) is True
    assert not _compile(None, translator) and not _compile(True, translator)  # no completions to compile
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert not _compile(None, gpt)
    assert "no C++ compiler found (g++, or $CXX): completions decode eagerly" in capsys.readouterr().err
    assert _compile(True, gpt)  # asked for: inductor's own error names what is missing at the first step
