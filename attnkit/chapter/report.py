"""The pieces every chapter experiment shares: what it is given (:class:`Context`), what it
returns (:class:`Section`: Markdown with measured numbers, figures, and the same numbers as
data), and the plotting set-up. ``attnkit figures`` runs the experiments and writes
``REPORT.md`` and ``report.json`` (see :mod:`attnkit.chapter.figures`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Context:
    """``out``: the directory figures go to; ``quick``: the CI-sized variant (every experiment
    still runs, on smaller shapes and budgets); ``seed``: seeds every random draw; ``model``: a
    trained translator (run directory or model directory) for the experiments that read one."""

    out: Path
    quick: bool = False
    seed: int = 0
    model: str | None = None


@dataclass
class Section:
    """One experiment's part of the report. ``labels`` are the chapter labels it shows;
    ``text`` is Markdown whose every number was measured; ``figures`` are file names in the
    output directory; ``numbers`` holds the same measurements as JSON-able data."""

    title: str
    labels: tuple[str, ...]
    text: str
    figures: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "labels": list(self.labels), "text": self.text, "figures": self.figures,
                "numbers": self.numbers}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Section:
        """The section :meth:`to_json` wrote (extra keys, such as a report's timings, ignored)."""
        return cls(data["title"], tuple(data["labels"]), data["text"], data["figures"], data["numbers"])

    def markdown(self) -> str:
        cites = " ".join(f"[{label}]" for label in self.labels)
        images = "".join(f"\n![{name}]({name})\n" for name in self.figures)
        return f"## {self.title}\n\n*Chapter: {cites}*\n\n{self.text.strip()}\n{images}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    return "\n".join(f"| {' | '.join(row)} |" for row in [header, ["---"] * len(header), *rows])


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, ctx: Context, name: str) -> str:
    """Write ``fig`` as ``ctx.out / name`` (PNG), close it, and return ``name`` for the section."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(ctx.out / name, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return name
