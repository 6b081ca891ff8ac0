"""The site's home page: README.md, copied to ``index.md`` at build time (mkdocs-gen-files).

The README's links are written for the repository's root. In the site, ``docs/`` is the root:
``docs/translation.md`` becomes ``translation.md`` and ``docs/figures/x.png`` becomes
``figures/x.png``. A link to a repository file outside ``docs/`` (``benchmarks/gpu.sh``,
``Makefile``, ``attnkit/...``) has no page in the site, so it becomes its text followed by the
path as code, and ``mkdocs build --strict`` has nothing to flag. Fenced code blocks and inline
code are left exactly as they are. Nothing is written into the repository.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
DOCS = "docs/"

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
# [text](target "title") and ![alt](target); text may hold code spans but no nested brackets.
INLINE_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
# [id]: target "title" (reference-style definitions)
LINK_DEFINITION = re.compile(r"^(?P<lead> {0,3}\[[^\]]+\]:\s*)(?P<target>\S+)(?P<rest>.*)$")
EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//|#)")


def site_target(target: str) -> str | None:
    """The target as seen from the site's root, or None for a repository file outside docs/."""
    if EXTERNAL.match(target):
        return target
    path, sep, fragment = target.partition("#")
    path = posixpath.normpath(path.removeprefix("./")) if path else path
    if path in ("README.md", "."):
        return "index.md" + sep + fragment if path == "README.md" else "./" + sep + fragment
    if path == "docs":
        return "./" + sep + fragment
    if path.startswith(DOCS):
        return path[len(DOCS) :] + sep + fragment
    return None


def rewrite_link(match: re.Match[str]) -> str:
    target = site_target(match["target"])
    if target is not None:
        return f"{match['bang']}[{match['text']}]({target}{match['title'] or ''})"
    path = match["target"].partition("#")[0]
    text = match["text"].strip()
    if text in (path, f"`{path}`") or not text:
        return f"`{path}`"
    return f"{text} (`{path}`)"


def rewrite_prose(text: str) -> str:
    """Rewrite the links of one line of prose, leaving its code spans alone."""
    out, last = [], 0
    for span in CODE_SPAN.finditer(text):
        out.append(INLINE_LINK.sub(rewrite_link, text[last : span.start()]))
        out.append(span.group(0))
        last = span.end()
    out.append(INLINE_LINK.sub(rewrite_link, text[last:]))
    return "".join(out)


def rewrite_readme(markdown: str) -> str:
    lines, fence = [], None
    for line in markdown.splitlines():
        opened = FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            lines.append(line)
            continue
        if opened:
            fence = opened.group(1)
            lines.append(line)
            continue
        definition = LINK_DEFINITION.match(line)
        if definition and (target := site_target(definition["target"])) is not None:
            lines.append(definition["lead"] + target + definition["rest"])
            continue
        lines.append(rewrite_prose(line))
    return "\n".join(lines) + "\n"


with mkdocs_gen_files.open("index.md", "w") as index:
    index.write(rewrite_readme((ROOT / "README.md").read_text(encoding="utf-8")))
