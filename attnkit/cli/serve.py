"""``attnkit serve``: the model behind an HTTP API and a page that shows its attention."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Literal


# One flag per line, the server's every option and limit with its help: a table, long because
# the server has that many settings.
def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over HTTP: OpenAI-shaped completions, translation, attention, a live page",
        description="Serve a model over HTTP (Starlette + uvicorn, the serve extra):\n"
        "  GET  /                     a page: type a sentence, watch the output stream in and its attention\n"
        "  GET  /health, /metrics     {status, model, family, limits}; Prometheus text\n"
        "  GET  /v1/models            the served model, as OpenAI clients discover it\n"
        "  POST /v1/completions       OpenAI's (prompt: text, texts or ids; n, stop, logprobs, echo,\n"
        "                             penalties, logit_bias, stream + stream_options) [GPT]\n"
        "  POST /v1/chat/completions  the same over messages, through the model's chat template [GPT]\n"
        "  POST /v1/embeddings        OpenAI's: sentence embeddings, float or base64 [BERT]\n"
        "  POST /tokenize, /detokenize  vLLM's: text or messages to ids and back\n"
        "  POST /v1/translate         {text, num_beams?, max_new_tokens?, stream?} [encoder-decoder]\n"
        "  POST /v1/attention         {text, target?} -> tokens and every layer's and head's weights\n"
        "Completions share one continuous batch (a request joins the running batch at the next step);\n"
        "translations waiting together are decoded as one batch. stream: true answers with server-sent\n"
        "events, data: [DONE] last. OpenAI endpoints ignore fields they do not use (logged once); errors\n"
        "are {error: {message, type, param, code}}. SIGTERM finishes the requests in flight (new ones get\n"
        "503) within --drain-seconds, then exits.",
        epilog="examples:\n"
        "  attnkit serve --model runs/translate-en-fr/model --weights bf16\n"
        '  attnkit serve --model runs/smollm2 --port 8080 --api-key "$KEY"\n'
        '  curl -s localhost:8000/v1/completions -d \'{"prompt": "The capital of France is", "max_tokens": 8}\'',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from attnkit.cli.common import add_model_flag, add_weights_flag

    add_model_flag(parser)
    add_weights_flag(parser)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    parser.add_argument(
        "--api-key", metavar="KEY", default=os.environ.get("ATTNKIT_API_KEY"),
        help="require Authorization: Bearer KEY on the API and /metrics (default: $ATTNKIT_API_KEY, else none)",
    )  # fmt: skip
    parser.add_argument("--name", help="the model's name in answers (default: the directory's name)")
    parser.add_argument("--max-batch", type=int, default=32, metavar="N", help="rows decoded together (32)")
    parser.add_argument("--max-queue", type=int, default=256, metavar="N", help="requests waiting; more get 429 (256)")
    parser.add_argument(
        "--bound-schemas", action="store_true",
        help="close what a response_format schema or a tool's parameters leave open (strings 64 characters, arrays 8 "
        "items, numbers within 1e12; only values the schema allows), so that a small model that repeats inside a "
        "string or a list still ends within max_tokens",
    )  # fmt: skip
    parser.add_argument(
        "--max-new-tokens", type=int, metavar="N", help="most new tokens a request asks (default: the model's context)"
    )
    parser.add_argument(
        "--max-input-tokens", type=int, metavar="N", help="longest prompt or source (default: the model's context)"
    )
    parser.add_argument("--max-beams", type=int, default=8, metavar="K", help="most beams a translation asks (8)")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="N", help="largest request body (1 MiB)")
    parser.add_argument("--drain-seconds", type=float, default=30.0, metavar="S", help="shutdown deadline (30)")
    parser.add_argument(
        "--allowed-origins", metavar="ORIGINS",
        help="comma-separated web origins whose pages may call the API (CORS), e.g. http://localhost:3000; "
        "'*' for any (default: none)",
    )  # fmt: skip
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=None,
        help="decode completions through a compiled step (torch.compile; one graph per batch layout, each compiled "
        "once, the first before the server listens; seconds to a minute each, reported). Default: each layout "
        "decodes eagerly until its step is in the compile cache, compiled there by a background process at the "
        "lowest priority, so that no request waits on a compile (where a C++ compiler is found, else eager with a "
        "line saying so); --no-compile: always eager",
    )  # fmt: skip
    parser.set_defaults(run=run)


def _compile(asked: bool | None, model: object) -> bool | Literal["auto"]:
    """Whether completions decode compiled: as asked, else ``"auto"`` where inductor's C++
    compiler is found (a line saying why not where it is not) and ``ATTNKIT_AUTO_COMPILE`` is not
    0. Only decoder-only models decode completions."""
    from attnkit.generation.compiled import auto_allowed, compiler

    config = model.config  # type: ignore[attr-defined]
    if config.is_encoder_decoder or config.family == "bert":
        return False
    if asked is None and compiler() is None:
        print("no C++ compiler found (g++, or $CXX): completions decode eagerly; install g++ to compile them",
              file=sys.stderr)  # fmt: skip
        return False
    return asked if asked is not None else "auto" if auto_allowed() else False


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnkit.cli.common import compiles_so_far, load_model, report_compiles, say_choice
    from attnkit.serve import Limits, create_app
    from attnkit.serve.server import run as serve

    for flag in ("max_batch", "max_queue", "max_new_tokens", "max_input_tokens", "max_beams", "max_body_bytes"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key is empty; give a key, or leave the flag out to serve without one")
    origins = [o.strip() for o in (args.allowed_origins or "").split(",") if o.strip()]
    for origin in origins:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise ValueError(f"--allowed-origins: {origin!r} is not an origin; give e.g. http://localhost:3000 or '*'")
    model = load_model(args.model, args.weights)
    say_choice(model)
    if model.tokenizer is None:
        raise ValueError(f"{args.model} has no tokenizer, so the server cannot read text; put its tokenizer.json there")
    what = model.headless()
    if model.config.family == "gpt" and what is not None:  # an encoder without a vocabulary head serves embeddings
        raise ValueError(f"{args.model} is {what} and generates nothing to serve; label texts with attnkit classify")
    limits = Limits(
        max_body_bytes=args.max_body_bytes, max_input_tokens=args.max_input_tokens, max_new_tokens=args.max_new_tokens,
        max_beams=args.max_beams, max_batch=args.max_batch, max_queue=args.max_queue, bound_schemas=args.bound_schemas,
    )  # fmt: skip
    name = args.name or Path(args.model).resolve().name
    compile = _compile(args.compile, model)
    app = create_app(model, name, limits, args.api_key, own_thread=False, allowed_origins=origins, compile=compile)
    if compile is True:
        print("compiling the decoding step for one request (later batch layouts compile at their first step)",
              file=sys.stderr)  # fmt: skip
        since = compiles_so_far()
        app.state.attnkit.engine.warm()
        report_compiles(since)
    serve(app, args.host, args.port, args.drain_seconds)
    return 0
