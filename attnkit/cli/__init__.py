"""The ``attnkit`` command line: one module per command, each with its ``add_parser`` and
its ``run``; :func:`main` assembles them. The only package that prints.

Parsing imports no torch: each command imports what it uses when it runs, so ``--help`` and
a mistyped flag answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from attnkit import __version__

# In the order of `attnkit --help`; each names a module of this package.
COMMANDS = (
    "smoke", "convert", "prepare", "train", "evaluate", "fill_mask", "info", "average", "figures", "bench", "generate",
    "chat", "translate", "serve", "embed", "classify",
)  # fmt: skip
# Optional modules -> (the package that holds it, the extra of pyproject.toml that installs it).
EXTRAS = {
    "gguf": ("gguf", "gguf"),
    "matplotlib": ("matplotlib", "plots"),
    "sacrebleu": ("sacrebleu", "eval"),
    "starlette": ("starlette", "serve"),
    "uvicorn": ("uvicorn", "serve"),
    "transformers": ("transformers", "hf"),
    "yaml": ("PyYAML", "yaml"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnkit",
        description='The chapter "Attention and Transformers" as a library: train, translate, '
        "generate, evaluate, convert and draw its models.",
    )
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"attnkit.cli.{name}").add_parser(subparsers)
    return parser


def missing_extra(err: ModuleNotFoundError, command: str) -> str | None:
    """The one-line message for an optional package that is not installed, or None when
    ``err`` is about something else."""
    module = (err.name or "").split(".")[0]
    if module not in EXTRAS:
        return None
    package, extra = EXTRAS[module]
    return f"attnkit: error: {command} needs {package}, which is not installed: pip install 'attnkit[{extra}]'"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(message)s")
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError) as err:
        if args.debug:  # exit status 2: a usage error, in the arguments or the files they name
            raise
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # an optional package of an extra: exit 2, how to install it
        message = missing_extra(err, args.command)
        if args.debug or message is None:
            raise
        print(message, file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`attnkit translate ... | head`): stop quietly
        if args.debug:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        return 1
    except KeyboardInterrupt:
        if args.debug:
            raise
        return 130
    except Exception as err:  # exit status 1: the command failed (a permission, the disk, a bug)
        if args.debug:
            raise
        message = " ".join(str(err).split()) or "no message"
        print(f"attnkit: error: {type(err).__name__}: {message} (--debug shows the traceback)", file=sys.stderr)
        return 1
