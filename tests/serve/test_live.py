"""``attnkit serve`` as a real process on loopback: a load of 32 concurrent clients x 8
mixed requests (every valid one answered correctly, every invalid one with its 4xx, no 5xx,
memory bounded), a client that goes away mid-stream dropped from the batch, and SIGTERM
under load finishing every request in flight."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.generation.text import prompt_ids
from attnkit.models import Model

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn", reason="the serve extra is not installed: pip install 'attnkit[serve]'")

PROMPTS = ["In the beginning", "And God said", "The earth was", "Blessed are the"]


@pytest.fixture(scope="module")
def gpt_dir(gpt: Model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("serve") / "tiny-gpt"
    gpt.save_pretrained(path)
    return path


def expected_texts(directory: Path, max_tokens: int) -> dict[str, str]:
    model = attnkit.from_pretrained(directory)
    out = {}
    for text in PROMPTS:
        ids = prompt_ids(model.tokenizer, model.config, [text])[0]
        new = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens)[0, len(ids) :].tolist()
        eos = model.config.eos_token_id
        out[text] = model.tokenizer.decode(new[: new.index(eos)] if eos in new else new, skip_special_tokens=True)
    return out


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]


def streamed_text(body: str) -> tuple[str, bool]:
    """The text of a streamed completion and whether it ended with [DONE]."""
    events = [b[6:] for b in body.split("\n\n") if b.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    return "".join(c["choices"][0]["text"] for c in chunks), bool(events) and events[-1] == "[DONE]"


def test_a_compiled_server_answers_as_generate(gpt_dir: Path, serving: Callable) -> None:
    """``--compile`` (the default where g++ is found): the one-request step compiles before the
    server listens, a batch of four compiles its own layout, and the answers are ``generate``'s."""
    expected = expected_texts(gpt_dir, 12)
    with serving(gpt_dir, "--compile") as (url, _, lines):
        assert any("compiled the decoding step (DecoderOnlyModel, 1 row, 64" in line for line in lines), lines
        alone = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0})
        assert alone.json()["choices"][0]["text"] == expected[PROMPTS[0]]

        async def together() -> list[str]:
            async with httpx.AsyncClient(timeout=120) as client:
                body = {"prompt": PROMPTS, "max_tokens": 12, "temperature": 0}
                answer = await client.post(f"{url}/v1/completions", json=body)
                return [choice["text"] for choice in sorted(answer.json()["choices"], key=lambda c: c["index"])]

        assert asyncio.run(together()) == [expected[text] for text in PROMPTS]
        metrics = httpx.get(f"{url}/metrics").text
        compiled = re.search(r"^attnkit_compiled_steps (\d+)", metrics, re.M)
        assert compiled is not None and int(compiled.group(1)) == 2, metrics  # 1 row, then 4


def test_32_clients_of_mixed_requests(gpt_dir: Path, serving: Callable) -> None:
    expected = expected_texts(gpt_dir, 8)
    with serving(gpt_dir, "--max-new-tokens", "32", "--max-batch", "16") as (url, process, _):
        invalid = [
            (b"{broken", 400),
            (json.dumps({"prompt": "x", "max_tokens": 33}).encode(), 413),
            (json.dumps({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}).encode(), 422),
            (json.dumps({"prompt": [10**7]}).encode(), 400),
        ]
        statuses: list[int] = []
        wrong: list[str] = []

        async def client(number: int, http: httpx.AsyncClient) -> None:
            for i in range(8):
                kind = (number + i) % 4
                text = PROMPTS[(number * 8 + i) % len(PROMPTS)]
                if kind == 0:
                    r = await http.post("/v1/completions", json={"prompt": text, "max_tokens": 8, "temperature": 0})
                    if r.status_code == 200 and r.json()["choices"][0]["text"] != expected[text]:
                        wrong.append(text)
                elif kind == 1:
                    body = {"prompt": text, "max_tokens": 8, "temperature": 0, "stream": True}
                    r = await http.post("/v1/completions", json=body)
                    if r.status_code == 200 and streamed_text(r.text) != (expected[text], True):
                        wrong.append(f"stream {text}")
                elif kind == 2:
                    content, status = invalid[(number + i) % len(invalid)]
                    r = await http.post(
                        "/v1/completions", content=content, headers={"Content-Type": "application/json"}
                    )
                    if r.status_code != status or "error" not in r.json():
                        wrong.append(f"{content!r} -> {r.status_code}")
                else:
                    r = await http.get("/health")
                statuses.append(r.status_code)

        async def load() -> None:
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
                await client(0, http)  # warm-up
                warm = rss_bytes(process.pid)
                started = time.monotonic()
                await asyncio.gather(*(client(n, http) for n in range(32)))
                assert time.monotonic() - started < 240
                grown = rss_bytes(process.pid) - warm
                assert grown < 300 * 2**20, f"the server grew by {grown / 2**20:.0f} MiB under load"
                metrics = (await http.get("/metrics")).text
                assert "attnkit_queue_length 0" in metrics and "attnkit_running_rows 0" in metrics

        asyncio.run(load())
        assert not wrong, wrong[:5]
        assert len(statuses) == 33 * 8 and not [s for s in statuses if s >= 500]
        assert process.poll() is None and httpx.get(f"{url}/health").json()["status"] == "ok"


def _completions_arrived(url: str) -> int:
    """Completion requests the server has received: in flight (less the /metrics request
    itself) plus those answered."""
    text = httpx.get(f"{url}/metrics").text
    in_flight = int(float(_metric_in(text, "attnkit_in_flight_requests")))
    answered = re.findall(r'^attnkit_requests_total\{endpoint="/v1/completions",[^}]*\} (\d+)$', text, re.MULTILINE)
    return in_flight - 1 + sum(int(n) for n in answered)


def _metric_in(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert found is not None, name
    return float(found.group(1))


def _metric(url: str, name: str) -> float:
    return _metric_in(httpx.get(f"{url}/metrics").text, name)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_is_dropped_from_the_batch(
    gpt: Model, tmp_path: Path, serving: Callable, stream: bool
) -> None:
    long = attnkit.build_model(attnkit.preset("gpt-tiny", vocab_size=gpt.config.vocab_size, max_len=8192))
    long.tokenizer = gpt.tokenizer
    long.save_pretrained(tmp_path / "long")  # room for 4000 tokens, seconds of decoding
    with serving(tmp_path / "long", "--max-new-tokens", "4000") as (url, _, _):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        body = json.dumps({"prompt": "In the beginning", "max_tokens": 4000, "temperature": 0, "stream": stream})
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
            )
            if stream:
                received = b""
                while b"data: " not in received:  # streaming has begun
                    chunk = sock.recv(65536)
                    assert chunk, received
                    received += chunk
            else:
                while _metric(url, "attnkit_running_rows") != 1:  # it is decoding
                    time.sleep(0.01)
        deadline = time.monotonic() + 30
        while _metric(url, "attnkit_running_rows") != 0:
            assert time.monotonic() < deadline, "the abandoned request kept decoding"
            time.sleep(0.05)
        assert _metric(url, "attnkit_batch_rows_count") < 4000  # model calls: it stopped long before its 4000 tokens
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": "And", "max_tokens": 3}, timeout=30)
        assert answer.status_code == 200


def test_sigterm_finishes_every_request_in_flight(gpt_dir: Path, serving: Callable) -> None:
    expected = expected_texts(gpt_dir, 48)
    # One row at a time: the 12 requests queue, so SIGTERM lands while most are still waiting.
    with serving(gpt_dir, "--max-batch", "1", "--drain-seconds", "60") as (url, process, lines):
        results: list[tuple[str, str, bool]] = []
        first = threading.Event()

        def ask(text: str) -> None:
            body = {"prompt": text, "max_tokens": 48, "temperature": 0, "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
                chunks = []
                for chunk in r.iter_text():
                    chunks.append(chunk)
                    first.set()
                results.append((text, *streamed_text("".join(chunks))))

        threads = [threading.Thread(target=ask, args=(PROMPTS[n % 4],)) for n in range(12)]
        for thread in threads:
            thread.start()
        assert first.wait(60)
        # Every request has arrived (on a loaded machine 50 ms was not always enough): those in
        # flight, less the /metrics request that counts them, and those already answered.
        deadline = time.monotonic() + 60
        while _completions_arrived(url) < 12:
            assert time.monotonic() < deadline, "the 12 requests did not all reach the server in 60 s"
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        late = None
        with contextlib.suppress(httpx.TransportError):  # already closed: refused is fine too
            late = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
        for thread in threads:
            thread.join(120)
        assert process.wait(60) == 0
        assert sorted(results) == sorted((PROMPTS[n % 4], expected[PROMPTS[n % 4]], True) for n in range(12))
        assert late is None or late.status_code == 503
        drained = [re.search(r"SIGTERM, finishing (\d+) request", line) for line in lines]
        counts = [int(m.group(1)) for m in drained if m]
        assert counts and counts[0] >= 2, lines  # the signal came while requests were still in flight


def test_the_serve_benchmark_runs(gpt_dir: Path, tmp_path: Path) -> None:
    """``python -m benchmarks serve`` end to end on the tiny model (its numbers are not checked)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "serve.json"
    command = [sys.executable, "-m", "benchmarks", "serve", "--small", "--model", str(gpt_dir), "--out", str(out)]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    served = json.loads(out.read_text())["serve"]["served"]
    assert set(served) == {"1", "8", "32"} and all(row["tokens"] > 0 for row in served.values())


def test_an_over_long_body_gets_a_413_the_client_can_read(gpt_dir: Path, serving: Callable) -> None:
    """A client still sending a 4 MB body (against the 1 MiB default) reads the 413: the server
    reads and drops the rest first, instead of closing on unread data (a reset)."""
    body = json.dumps({"prompt": "x" * (4 << 20)}).encode()

    def post(sock: socket.socket, chunked: bool) -> bytes:
        length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
        sock.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{length}\r\n\r\n".encode()
        )
        for start in range(0, len(body), 1 << 16):  # slowly: the answer is ready long before the body is sent
            piece = body[start : start + (1 << 16)]
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            time.sleep(0.002)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}}"):
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
        return answer

    with serving(gpt_dir) as (url, _, _):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        for chunked in (False, True):
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                answer = post(sock, chunked)
            assert answer.startswith(b"HTTP/1.1 413") and b"over this server's limit of 1048576" in answer
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "And", "max_tokens": 2}).status_code == 200
