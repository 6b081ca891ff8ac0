"""The OpenAI fields clients send, through Starlette's test client on tiny trained models, each
against something the server did not compute: stop sequences against the unstopped text,
log-probabilities (chosen, top, echoed prompt) against one full forward pass, ``n`` choices
against seeded ``generate``, ``logit_bias`` against its effect, streamed usage against the
whole answer's, embeddings against ``model.encode``, tokenize against the prompt builders;
and the edges: unknown fields ignored and logged once, CORS only when asked."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from torch.testing import assert_close

import attnkit
from attnkit.data.tokenizer import specials_of
from attnkit.generation.text import chat_prompt, prompt_ids
from attnkit.models import Model

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'attnkit[serve]'")
from starlette.testclient import TestClient

from attnkit.serve import Limits, create_app

PROMPT = "In the beginning God created"
MESSAGES = [{"role": "user", "content": "Who made the earth?"}]


@pytest.fixture(scope="module")
def client(gpt: Model) -> Iterator[TestClient]:
    with TestClient(create_app(gpt, "tiny-gpt", Limits(max_new_tokens=64, max_batch=8))) as c:
        yield c


def complete(client: TestClient, **body: object) -> dict:
    response = client.post("/v1/completions", json={"prompt": PROMPT, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()


def sse_chunks(text: str) -> list[dict]:
    events = [b[6:] for b in text.split("\n\n") if b.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def logprobs_of(model: Model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t + 1] | ids[:t + 1]) over the vocabulary at every position, one forward pass (T, vocab)."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_stop_sequences_cut_the_text_whole_and_streamed(client: TestClient) -> None:
    free = complete(client, max_tokens=24)["choices"][0]
    assert len(free["text"]) > 12
    stop = free["text"][6:9]
    cut = free["text"][: free["text"].index(stop)]
    stopped = complete(client, max_tokens=24, stop=["never in this text", stop])["choices"][0]
    assert stopped["text"] == cut and stopped["finish_reason"] == "stop"
    chunks = sse_chunks(client.post("/v1/completions", json={"prompt": PROMPT, "temperature": 0, "max_tokens": 24,
                                                              "stop": stop, "stream": True}).text)  # fmt: skip
    texts = [c["choices"][0]["text"] for c in chunks]
    assert "".join(texts) == cut and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any(stop in t for t in texts)  # held back, never sent
    absent = complete(client, max_tokens=24, stop="never in this text")["choices"][0]
    assert absent == free


def test_completion_logprobs_are_one_forward_passs(gpt: Model, client: TestClient) -> None:
    ids = prompt_ids(gpt.tokenizer, gpt.config, [PROMPT])[0]
    answer = complete(client, prompt=ids, max_tokens=6, logprobs=3)
    choice = answer["choices"][0]
    text = gpt.tokenizer.decode
    new = gpt.generate(torch.tensor([ids]), max_new_tokens=6)[0, len(ids) :].tolist()
    oracle = logprobs_of(gpt, [*ids, *new])[len(ids) - 1 : -1]  # the positions that chose the new tokens
    lp = choice["logprobs"]
    assert lp["tokens"] == [text([t], skip_special_tokens=False) for t in new]
    assert_close(torch.tensor(lp["token_logprobs"]), oracle[range(6), new], atol=1e-4, rtol=1e-4)
    for position, top in enumerate(lp["top_logprobs"]):
        values, token_ids = oracle[position].topk(3)
        pairs = zip(token_ids.tolist(), values.tolist(), strict=True)
        assert top == pytest.approx({text([i], skip_special_tokens=False): v for i, v in pairs}, abs=1e-4)
        assert max(top.values()) == pytest.approx(lp["token_logprobs"][position], abs=1e-5)  # greedy: the top one
    offsets = lp["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] <= len(choice["text"])


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_scores_the_prompt_as_lm_eval_reads_it(gpt: Model, client: TestClient, max_tokens: int) -> None:
    rows = [prompt_ids(gpt.tokenizer, gpt.config, [t])[0] for t in (PROMPT, "And the earth was without form")]
    answer = complete(client, prompt=rows, max_tokens=max_tokens, logprobs=1, echo=True)
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    for ids, choice in zip(rows, answer["choices"], strict=True):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(ids) + max_tokens and lp["token_logprobs"][0] is None
        assert lp["top_logprobs"][0] is None
        generated = gpt.generate(torch.tensor([ids]), max_new_tokens=1)[0, len(ids) :].tolist()[:max_tokens]
        sequence = [*ids, *generated]
        oracle = logprobs_of(gpt, sequence)
        expected = oracle[range(len(sequence) - 1), sequence[1:]]
        assert_close(torch.tensor(lp["token_logprobs"][1:]), expected, atol=1e-4, rtol=1e-4)
        prompt_text = gpt.tokenizer.decode(ids, skip_special_tokens=True)
        assert choice["text"].startswith(prompt_text) and lp["text_offset"][: len(ids)] == sorted(lp["text_offset"])[
            : len(ids)
        ]  # fmt: skip
        if max_tokens == 0:
            assert choice["text"] == prompt_text and choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 2 * max_tokens


def test_scores_with_a_stop_sequence_and_their_offsets(gpt: Model, client: TestClient) -> None:
    free = complete(client, max_tokens=24, logprobs=1)["choices"][0]
    stop = free["text"][8:10]
    ids = prompt_ids(gpt.tokenizer, gpt.config, [PROMPT])[0]
    for echo in (False, True):
        choice = complete(client, prompt=ids, max_tokens=24, logprobs=1, echo=echo, stop=stop)["choices"][0]
        lp, start = choice["logprobs"], len(ids) if echo else 0
        assert choice["finish_reason"] == "stop" and (lp["token_logprobs"][0] is None) == echo
        new = lp["tokens"][start:]  # the generated tokens, up to the one that completed the stop
        assert lp["token_logprobs"][start:] == pytest.approx(free["logprobs"]["token_logprobs"][: len(new)], abs=1e-5)
        tokens = gpt.generate(torch.tensor([ids]), max_new_tokens=len(new))[0, len(ids) :].tolist()
        prompt_text = gpt.tokenizer.decode(ids, skip_special_tokens=True) if echo else ""
        expected = [len(prompt_text) + len(gpt.tokenizer.decode(tokens[:i])) for i in range(len(tokens))]
        assert lp["text_offset"][start:] == expected  # offsets in all the text, held-back stop included


def test_chat_logprobs_in_the_chat_shape(gpt: Model, client: TestClient) -> None:
    body = {"messages": MESSAGES, "temperature": 0, "max_completion_tokens": 5, "logprobs": True, "top_logprobs": 2}
    answer = client.post("/v1/chat/completions", json=body).json()
    content = answer["choices"][0]["logprobs"]["content"]
    ids = chat_prompt(gpt.chat_template, gpt.tokenizer, gpt.config, MESSAGES)
    new = gpt.generate(torch.tensor([ids]), max_new_tokens=5)[0, len(ids) :].tolist()
    new = new[: new.index(gpt.config.eos_token_id) + 1] if gpt.config.eos_token_id in new else new
    oracle = logprobs_of(gpt, [*ids, *new])[len(ids) - 1 : -1]
    assert len(content) == len(new) == answer["usage"]["completion_tokens"]
    assert_close(torch.tensor([e["logprob"] for e in content]), oracle[range(len(new)), new], atol=1e-4, rtol=1e-4)
    for entry, row in zip(content, oracle, strict=True):
        assert entry["bytes"] == list(entry["token"].encode())
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(row.topk(2).values.tolist(), abs=1e-4)
    streamed = sse_chunks(client.post("/v1/chat/completions", json={**body, "stream": True}).text)
    scored = [c["choices"][0]["logprobs"] for c in streamed if c["choices"] and c["choices"][0]["logprobs"]]
    entries = [e for lp in scored for e in lp["content"]]
    assert [e["logprob"] for e in entries] == pytest.approx([e["logprob"] for e in content], abs=1e-5)


def test_n_choices_are_seeded_samples_of_one_prompt(gpt: Model, client: TestClient) -> None:
    answer = complete(client, max_tokens=8, n=3, temperature=0.9, seed=11)
    ids = prompt_ids(gpt.tokenizer, gpt.config, [PROMPT])[0]
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    for j, choice in enumerate(answer["choices"]):  # choice j samples with seed + j
        new = gpt.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=True, temperature=0.9, seed=11 + j)
        tokens = new[0, len(ids) :].tolist()
        eos = gpt.config.eos_token_id
        tokens = tokens[: tokens.index(eos)] if eos in tokens else tokens
        assert choice["text"] == gpt.tokenizer.decode(tokens, skip_special_tokens=True)
    assert answer["usage"]["prompt_tokens"] == len(ids)  # the prompt counted (and prefilled) once
    greedy = complete(client, max_tokens=8, n=2)["choices"]
    assert greedy[0]["text"] == greedy[1]["text"]
    streamed = sse_chunks(
        client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "n": 3, "temperature": 0.9,
                                             "seed": 11, "stream": True}).text
    )  # fmt: skip
    for j, choice in enumerate(answer["choices"]):
        assert "".join(c["choices"][0]["text"] for c in streamed if c["choices"][0]["index"] == j) == choice["text"]


def test_logit_bias_and_penalties_change_the_choice(gpt: Model, client: TestClient) -> None:
    token = gpt.tokenizer.token_to_id("the") or 100
    forced = complete(client, max_tokens=5, logit_bias={str(token): 100}, logprobs=0)["choices"][0]
    assert forced["logprobs"]["tokens"] == [gpt.tokenizer.decode([token], skip_special_tokens=False)] * 5
    plain = complete(client, max_tokens=16)["choices"][0]["text"]
    penalised = complete(client, max_tokens=16, frequency_penalty=2.0, presence_penalty=2.0)["choices"][0]["text"]
    assert penalised != plain
    assert complete(client, max_tokens=16, frequency_penalty=0, presence_penalty=0)["choices"][0]["text"] == plain


def test_streamed_usage_and_content_parts(client: TestClient) -> None:
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": 6}
    whole = client.post("/v1/chat/completions", json=body).json()
    chunks = sse_chunks(
        client.post(
            "/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
        ).text
    )
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert all(c["usage"] is None for c in chunks[:-1])
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert text == whole["choices"][0]["message"]["content"]
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "Who made"}, {"type": "text", "text": "the earth?"}]}
    ]
    joined = [{"role": "user", "content": "Who made\nthe earth?"}]
    assert (
        client.post("/v1/chat/completions", json={**body, "messages": parts}).json()["choices"]
        == client.post("/v1/chat/completions", json={**body, "messages": joined}).json()["choices"]
    )


def test_unknown_fields_are_ignored_and_logged_once(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    unused = {"metadata": {"a": "b"}, "store": False, "service_tier": "auto"}
    body = {
        "messages": MESSAGES,
        "temperature": 0,
        "max_completion_tokens": 4,
        "response_format": {"type": "text"},
        **unused,
    }
    with caplog.at_level(logging.WARNING, logger="attnkit.serve"):
        first = client.post("/v1/chat/completions", json=body)
        second = client.post("/v1/chat/completions", json=body)
    assert first.status_code == second.status_code == 200
    assert first.json()["choices"] == second.json()["choices"] and first.json()["usage"]["completion_tokens"] <= 4
    logged = [r.getMessage() for r in caplog.records if "is not used by attnkit" in r.getMessage()]
    assert sum("'metadata'" in m for m in logged) <= 1 and sum("'store'" in m for m in logged) <= 1


def test_models_and_tokenize(gpt: Model, client: TestClient) -> None:
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == ["tiny-gpt"]
    assert client.get("/v1/models/tiny-gpt").json() == listed["data"][0]
    tokens = client.post("/tokenize", json={"prompt": PROMPT, "return_token_strs": True}).json()
    ids = prompt_ids(gpt.tokenizer, gpt.config, [PROMPT])[0]
    assert tokens["tokens"] == ids and tokens["count"] == len(ids) and tokens["max_model_len"] == gpt.config.max_len
    assert tokens["token_strs"] == [gpt.tokenizer.id_to_token(i) for i in ids]
    bare = client.post("/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}).json()["tokens"]
    assert bare == gpt.tokenizer.encode(PROMPT, add_special_tokens=False).ids
    chat = client.post("/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    assert chat == chat_prompt(gpt.chat_template, gpt.tokenizer, gpt.config, MESSAGES)
    text = client.post("/detokenize", json={"tokens": bare}).json()["prompt"]
    assert text == gpt.tokenizer.decode(bare, skip_special_tokens=False)


@pytest.fixture(scope="module")
def encoder(tokenizer: Tokenizer) -> Model:
    s = specials_of(tokenizer)
    torch.manual_seed(0)
    model = attnkit.build_model(attnkit.preset("bert-tiny", vocab_size=s.vocab_size, pad_token_id=s.pad)).eval()
    model.tokenizer = tokenizer
    return model


def test_embeddings_equal_encode(encoder: Model) -> None:
    texts = ["In the beginning God created the heavens", "Jesus wept."]
    expected = encoder.encode(texts)
    with TestClient(create_app(encoder, "tiny-bert")) as c:
        answer = c.post("/v1/embeddings", json={"input": texts, "model": "tiny-bert"}).json()
        assert answer["object"] == "list" and [d["index"] for d in answer["data"]] == [0, 1]
        assert_close(torch.tensor([d["embedding"] for d in answer["data"]]), expected)
        ids = encoder.text_ids(texts)
        assert answer["usage"] == {"prompt_tokens": sum(map(len, ids)), "total_tokens": sum(map(len, ids))}
        packed = c.post("/v1/embeddings", json={"input": texts[1], "encoding_format": "base64"}).json()
        vector = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
        assert_close(torch.from_numpy(vector.copy()), expected[1])
        by_ids = c.post("/v1/embeddings", json={"input": ids}).json()
        assert_close(torch.tensor([d["embedding"] for d in by_ids["data"]]), expected)
        one = c.post("/v1/embeddings", json={"input": ids[0]}).json()
        assert_close(torch.tensor(one["data"][0]["embedding"]), expected[0])
        refused = c.post("/v1/embeddings", json={"input": "x", "dimensions": 7})
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "dimensions"
        refused = c.post("/v1/completions", json={"prompt": "x"})
        assert refused.status_code == 400 and "needs a GPT-family model" in refused.json()["error"]["message"]


def test_cors_only_when_asked(gpt: Model) -> None:
    origin = {"Origin": "http://localhost:3000"}
    preflight = {**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    with TestClient(create_app(gpt, "g")) as c:
        assert "access-control-allow-origin" not in c.get("/v1/models", headers=origin).headers
        assert c.options("/v1/completions", headers=preflight).status_code == 405
    app = create_app(gpt, "g", api_key="k", allowed_origins=["http://localhost:3000"])
    with TestClient(app) as c:
        answer = c.options("/v1/completions", headers=preflight)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://localhost:3000"
        refused = c.get("/v1/models", headers=origin)  # no key: a 401 the page can read
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "http://localhost:3000"
        other = c.get("/v1/models", headers={"Origin": "http://evil.example", "Authorization": "Bearer k"})
        assert "access-control-allow-origin" not in other.headers
