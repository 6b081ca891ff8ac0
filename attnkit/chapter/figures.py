"""``attnkit figures``: run the chapter's experiments and write their figures, ``REPORT.md``
(each section citing its chapter labels, every number measured) and ``report.json`` (the same
numbers as data), stating the machine, the seed, the mode and the time each section took."""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from attnkit.chapter import EXPERIMENTS
from attnkit.chapter.report import Context, Section
from attnkit.machine import machine

REPORT, NUMBERS = "REPORT.md", "report.json"


def check_output_dir(out: Path, force: bool) -> None:
    """Refuse to write into a directory that holds anything but an earlier report, unless forced:
    the figures must never overwrite a user's files."""
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"--out {out} is a file; name a directory")
    if force or not any(out.iterdir()) or (out / NUMBERS).is_file():
        return
    raise FileExistsError(f"--out {out} is not empty and holds no earlier report; choose a new directory or --force")


@dataclass(frozen=True)
class _Ran:
    """A section with the seconds it took and torch's thread count while it ran."""

    section: Section
    seconds: float
    threads: int


def _earlier(ctx: Context) -> dict[str, _Ran]:
    """The sections of an earlier report in ``ctx.out`` (none if there is none), which a run of
    some experiments updates; refused when it was made in the other mode or with another seed."""
    path = ctx.out / NUMBERS
    if not path.is_file():
        return {}
    earlier = json.loads(path.read_text(encoding="utf-8"))
    if earlier.get("quick") != ctx.quick or earlier.get("seed") != ctx.seed:
        was = f"{'--quick' if earlier.get('quick') else 'full'} mode, seed {earlier.get('seed')}"
        raise ValueError(f"{ctx.out} holds a report made in {was}; use the same mode and seed, or another --out")
    return {
        name: _Ran(Section.from_json(s), s["seconds"], s["threads"])
        for name, s in earlier["sections"].items()
        if name in EXPERIMENTS
    }


def write_report(
    ctx: Context,
    names: Sequence[str] = EXPERIMENTS,
    on_section: Callable[[str, Section, float], None] | None = None,
) -> Path:
    """Run the experiments ``names`` into ``ctx.out``; return the path of ``REPORT.md``.

    Sections of an earlier report in ``ctx.out`` that are not rerun are kept, so ``names`` can
    update one experiment of a full report. ``on_section(name, section, seconds)`` is called
    after each experiment, e.g. to print progress."""
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"unknown experiment {unknown[0]!r}; choose from {', '.join(EXPERIMENTS)}")
    found = _earlier(ctx)
    ctx.out.mkdir(parents=True, exist_ok=True)
    about = machine()
    for name in names:
        begin = time.perf_counter()
        section = importlib.import_module(f"attnkit.chapter.{name}").run(ctx)
        found[name] = _Ran(section, time.perf_counter() - begin, torch.get_num_threads())
        if on_section is not None:
            on_section(name, section, found[name].seconds)
    sections = {name: found[name] for name in EXPERIMENTS if name in found}
    total = sum(ran.seconds for ran in sections.values())
    mode = "quick (CI-sized)" if ctx.quick else "full"
    header = [
        "# The chapter, executable: measured report",
        "",
        f"Written by `attnkit figures{' --quick' if ctx.quick else ''}` on {about['date']}: {total / 60:.1f} "
        f"minutes of experiments ({mode} mode, seed {ctx.seed}). Every number below was measured by the code in "
        "`attnkit/chapter/`; the labels in brackets are those of `06-attention.tex`.",
        "",
        f"Machine: {about['processor']}, {about['cores']} cores, torch {about['torch']}"
        f"{', GPU ' + str(about['gpu']) if 'gpu' in about else ''}; {about['platform']}. Each section's time "
        "and torch's thread count:",
        "",
        *(
            f"- [{r.section.title}](#{_anchor(r.section.title)}) ({r.seconds:.0f} s, {r.threads} "
            f"thread{'s' if r.threads != 1 else ''})"
            for r in sections.values()
        ),
        "",
    ]
    body = [ran.section.markdown() for ran in sections.values()]
    path = ctx.out / REPORT
    path.write_text("\n".join(header) + "\n" + "\n".join(body), encoding="utf-8")
    numbers = {
        "machine": about,
        "seed": ctx.seed,
        "quick": ctx.quick,
        "seconds": total,
        "sections": {
            name: {**r.section.to_json(), "seconds": r.seconds, "threads": r.threads} for name, r in sections.items()
        },
    }
    (ctx.out / NUMBERS).write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
    return path


def _anchor(title: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")
