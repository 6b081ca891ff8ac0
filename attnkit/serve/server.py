"""Running the app under uvicorn with a graceful shutdown: the first SIGTERM (or Ctrl-C)
stops taking requests (503) and lets the ones in flight finish, up to a deadline; a second
one stops at once."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import uvicorn

from attnkit.serve.handling import State

log = logging.getLogger("attnkit.serve")


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose exit first drains: ``state.draining`` refuses new requests while
    those in flight (``state.in_flight``) finish, for at most ``deadline`` seconds."""

    def __init__(self, config: uvicorn.Config, state: State, deadline: float) -> None:
        super().__init__(config)
        self.state, self.deadline = state, deadline

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.state.draining:  # a second signal: stop now
            self.force_exit = self.should_exit = True
            return
        self.state.draining = True
        print(
            f"attnkit serve: {signal.Signals(sig).name}, finishing {self.state.in_flight} request(s)", file=sys.stderr
        )
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        end = time.monotonic() + self.deadline
        while self.state.in_flight and time.monotonic() < end:
            time.sleep(0.02)
        if self.state.in_flight:
            log.warning("%d request(s) still running at the %.0f s deadline", self.state.in_flight, self.deadline)
        self.should_exit = True


def run(app: object, host: str, port: int, deadline: float = 30.0) -> None:
    """Serve ``app`` (made with ``own_thread=False``) on ``host:port`` (0: a free port) until a
    signal, its model loop on this thread; prints the address once listening (``attnkit serve:
    listening on http://HOST:PORT``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # connections wait in the backlog until uvicorn accepts them
    except OSError as err:
        raise ValueError(f"cannot listen on {host}:{port} ({err.strerror}); choose another --port") from None
    state: State = app.state.attnkit  # type: ignore[attr-defined]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, access_log=False)  # type: ignore[arg-type]
    server = DrainingServer(config, state, deadline)
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if family == socket.AF_INET6 else bound[0]
    print(
        f"attnkit serve: listening on http://{shown}:{bound[1]} ({state.name}, {state.family})",
        file=sys.stderr,
        flush=True,
    )
    engine = state.engine
    failed: list[BaseException] = []

    def http() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as err:  # the loop below must not outlive the HTTP side
            failed.append(err)
        finally:
            engine.stop()

    # The model runs here, on the main thread that loaded it (Engine.run says why); HTTP on
    # another thread, whose signals this thread catches and hands to the server.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, server.handle_exit)
    worker = threading.Thread(target=http, name="attnkit-http", daemon=True)
    worker.start()
    engine.run()
    worker.join(timeout=30)
    if failed:
        raise failed[0]


@contextmanager
def spawn(
    directory: str | Path, *flags: str, threads: int | None = None, timeout: float = 90.0
) -> Iterator[tuple[str, subprocess.Popen, list[str]]]:
    """``attnkit serve --model directory`` in a child process on a free port, for tests and
    benchmarks: yields (its base URL, the process, its stderr lines so far) once it listens,
    and kills it on the way out if it is still running. ``threads``: its OMP_NUM_THREADS."""
    command = [sys.executable, "-m", "attnkit", "serve", "--model", str(directory), "--port", "0", *flags]
    env = {**os.environ, **({} if threads is None else {"OMP_NUM_THREADS": str(threads)})}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if "listening on" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(timeout):
            raise RuntimeError(f"attnkit serve did not start within {timeout:.0f} s: {''.join(lines)[-2000:]}")
        found = re.search(r"listening on (http://\S+)", "".join(lines))
        assert found is not None
        yield found.group(1), process, lines
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
