"""Regenerate docs/serving.md's picture of ``attnkit serve``'s page: the demo translator serving
one verse, its cross-attention drawn. ``python tools/serve_screenshot.py RUN [--out PNG]``;
needs the serve and browser extras and Debian's chromium."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnkit.serve.browser import screenshot
from attnkit.serve.server import spawn

SENTENCE = "Blessed are the merciful, for they shall obtain mercy."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run", type=Path, help="a trained translator's run (or model) directory")
    parser.add_argument("--out", type=Path, default=Path("docs/figures/serve-page.png"))
    parser.add_argument("--layer", type=int, default=-1, help="the decoder layer shown (0-based; -1: the last)")
    parser.add_argument("--head", type=int, default=0)
    args = parser.parse_args()
    with spawn(args.run, "--weights", "fp32") as (url, _, _):
        output = screenshot(url, SENTENCE, args.out, "cross", args.layer, args.head)
    print(f"{args.out}: {SENTENCE!r} -> {output!r}")


if __name__ == "__main__":
    main()
