"""The API reference: one page per module of attnkit, found by walking the package at build time.

Each page is ``reference/<dotted.module>.md`` (``reference/<dotted.package>/index.md`` for a
package with modules, so that it is its navigation section's index page) holding
``::: dotted.module``: mkdocstrings renders it from the docstrings by static analysis (nothing
is imported). ``reference/SUMMARY.md`` is the navigation that mkdocs-literate-nav reads. No
module name is written here: a module added, moved or renamed in attnkit/ gets its page on the
next build.

Skipped: ``__main__.py``, private modules and packages (``_name``), directories that are not
packages (no ``__init__.py``), and the command line (``attnkit.cli``, module or package): its
documentation is its ``--help``.
"""

from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "attnkit"
SKIPPED = {("attnkit", "cli")}


def modules(root: Path, package: str) -> list[tuple[str, ...]]:
    found = []
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        elif parts[-1] == "__main__":
            continue
        if any(part.startswith("_") for part in parts):
            continue
        if any(parts[: len(skipped)] == skipped for skipped in SKIPPED):
            continue
        # Only what Python can import as a module of the package: every directory a package.
        if not all((root / parent / "__init__.py").is_file() for parent in path.relative_to(root).parents[:-1]):
            continue
        found.append(parts)
    return found


nav = mkdocs_gen_files.Nav()
found = modules(ROOT, PACKAGE)
packages = {parts[:i] for parts in found for i in range(1, len(parts))}
for parts in found:
    dotted = ".".join(parts)
    # A package's page is its section's index (reference/attnkit.nn/index.md): the same URL,
    # reference/attnkit.nn/, and the section's title links to it (navigation.indexes).
    page = f"{dotted}/index.md" if parts in packages else f"{dotted}.md"
    nav[parts] = page
    with mkdocs_gen_files.open(f"reference/{page}", "w") as out:
        out.write(f"::: {dotted}\n")

with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as summary:
    summary.writelines(nav.build_literate_nav())
