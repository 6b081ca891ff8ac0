"""mkdocs hooks: the chapter's labels, linked to the chapter map (``hooks:`` in mkdocs.yml).

Docstrings and pages cite the textbook chapter by its labels in brackets: ``[eq:att-addnorm]``,
``[tab:att-families]``, ``[alg:att-decode]``. docs/chapter.md is the map of those labels: a
table with one row per label (``| `eq:att-addnorm` | what | code | test | figure |``).

- On the chapter page, each row gets an anchor, ``id="eq-att-addnorm"`` (the label with ``-``
  for ``:``), and each file in its *code* column links to that module's API reference page.
- On every other page (the API reference, the README as home page, the user guide), each
  ``[label]`` outside code and links becomes a link to its row, ``<a href="../../chapter/#eq-att-addnorm">``,
  relative to the page's own URL, with the row's *what* as its tooltip.

Before Markdown sees a page, the brackets of each label are escaped (``\\[eq:att-sdpa\\]``):
otherwise ``[eq:att-sdpa] [eq:att-alpha]`` reads as a reference link ``[title] [identifier]``
(mkdocs-autorefs would report it unresolved). docs/griffe_docstrings.py does the same in the
docstrings.

The labels come from docs/chapter.md itself, so a link always has its anchor. A ``[label]``
that the map does not list is a warning (so ``mkdocs build --strict`` fails), except section
labels (``sec:``), which the map does not list by design: they link to the chapter page.
"""

from __future__ import annotations

import html
import re
from typing import Any

from mkdocs.plugins import get_plugin_logger
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page

log = get_plugin_logger("chapter_tags")

CHAPTER_PAGE = "chapter.md"
REFERENCE_DIR = "reference/"
LABEL = r"[a-z]+:att-[a-z0-9-]+"
# A row of the map: | `label` | what | ...
MAP_ROW = re.compile(rf"^\|\s*`(?P<label>{LABEL})`\s*\|(?P<what>[^|]*)\|", re.MULTILINE)
# The rendered row: <tr> then the first cell, holding the label as code.
HTML_ROW = re.compile(rf"<tr>(?P<cell>\s*<td[^>]*>\s*<code>(?P<label>{LABEL})</code>)")
TAG = re.compile(rf"\[(?P<label>{LABEL})\]")
MODULE_FILE = re.compile(r"\b(?P<path>attnkit(?:/\w+)*\.py)\b")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
HTML_TOKEN = re.compile(r"(<[^>]*>)")
TAG_NAME = re.compile(r"^</?\s*([a-zA-Z][\w-]*)")
# Text inside these elements is left alone: code shows the label as written, a link is a link.
SKIP = {"a", "code", "pre", "script", "style", "textarea", "autoref", "kbd", "samp"}

AUTOREF_TITLE = re.compile(r'(?P<head><a class="autorefs[^"]*" title=")(?P<title>[^"]*)"')

_labels: dict[str, str] = {}  # label -> its "what" in the map


def anchor(label: str) -> str:
    return label.replace(":", "-")


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    _labels.clear()
    chapter = files.get_file_from_path(CHAPTER_PAGE)
    if chapter is None:
        log.warning(f"{CHAPTER_PAGE} is missing: chapter labels will not be linked")
        return files
    for row in MAP_ROW.finditer(chapter.content_string):
        _labels[row["label"]] = " ".join(row["what"].split())
    if not _labels:
        log.warning(f"{CHAPTER_PAGE} lists no labels (rows of the form | `eq:att-x` | what | ...)")
    return files


def on_nav(nav: Any, config: Any, files: Files, **kwargs: Any) -> Any:
    # reference/SUMMARY.md (docs/gen_ref_pages.py) is the API reference's navigation, read by
    # mkdocs-literate-nav in on_files; it is not a page of its own.
    summary = files.get_file_from_path(f"{REFERENCE_DIR}SUMMARY.md")
    if summary is not None:
        summary.inclusion = InclusionLevel.EXCLUDED
    return nav


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files, **kwargs: Any) -> str:
    out, fence = [], None
    for line in markdown.split("\n"):
        opened = FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
        elif opened:
            fence = opened.group(1)
        else:
            line = _outside_code_spans(line, lambda prose: TAG.sub(r"\\[\g<label>\\]", prose))
        out.append(line)
    return "\n".join(out)


def _outside_code_spans(line: str, change) -> str:
    pieces, last = [], 0
    for span in CODE_SPAN.finditer(line):
        pieces.append(change(line[last : span.start()]))
        pieces.append(span.group(0))
        last = span.end()
    pieces.append(change(line[last:]))
    return "".join(pieces)


def on_page_content(html_text: str, page: Page, config: Any, files: Files, **kwargs: Any) -> str:
    chapter = files.get_file_from_path(CHAPTER_PAGE)
    if chapter is None:
        return html_text
    if page.file.src_uri == CHAPTER_PAGE:
        html_text = _anchor_rows(html_text)
        html_text = _transform_text(html_text, lambda text: _link_modules(text, page.file, files))
    return _transform_text(html_text, lambda text: _link_tags(text, page, chapter))


def on_post_page(output: str, page: Page, config: Any, **kwargs: Any) -> str:
    # mkdocs-autorefs titles its links with the target's heading text, template whitespace and
    # all ("ModelConfig\n\n   dataclass (attnkit.config.ModelConfig)"): one line is enough.
    return AUTOREF_TITLE.sub(lambda m: m["head"] + " ".join(m["title"].split()) + '"', output)


def _anchor_rows(html_text: str) -> str:
    found: set[str] = set()

    def add_id(row: re.Match[str]) -> str:
        found.add(row["label"])
        return f'<tr id="{anchor(row["label"])}">{row["cell"]}'

    html_text = HTML_ROW.sub(add_id, html_text)
    for label in sorted(set(_labels) - found):
        log.warning(f"{CHAPTER_PAGE}: the row of {label} was not found in the rendered table: it has no anchor")
    return html_text


def _link_tags(text: str, page: Page, chapter: File) -> str:
    def link(tag: re.Match[str]) -> str:
        label = tag["label"]
        base = "" if page.file is chapter else chapter.url_relative_to(page.file)
        if label in _labels:
            title = html.escape(f"{label}: {_labels[label]}", quote=True)
            return f'<a class="chapter-label" href="{base}#{anchor(label)}" title="{title}">{tag.group(0)}</a>'
        if label.startswith("sec:"):
            return f'<a class="chapter-label" href="{base or "#"}" title="{label}">{tag.group(0)}</a>'
        log.warning(f"{page.file.src_uri}: the chapter label {tag.group(0)} is not in {CHAPTER_PAGE}")
        return tag.group(0)

    return TAG.sub(link, text)


def _link_modules(text: str, page_file: File, files: Files) -> str:
    def link(match: re.Match[str]) -> str:
        module = match["path"].removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        target = files.get_file_from_path(f"{REFERENCE_DIR}{module}.md") or files.get_file_from_path(
            f"{REFERENCE_DIR}{module}/index.md"
        )
        if target is None:
            return match.group(0)
        return f'<a href="{target.url_relative_to(page_file)}" title="{module}">{match.group(0)}</a>'

    return MODULE_FILE.sub(link, text)


def _transform_text(html_text: str, change) -> str:
    """Apply ``change`` to the text of the HTML, not to tags, nor inside code or links."""
    out, skipped = [], 0
    for token in HTML_TOKEN.split(html_text):
        if token.startswith("<"):
            name = TAG_NAME.match(token)
            if name and name.group(1).lower() in SKIP and not token.endswith("/>"):
                skipped += -1 if token.startswith("</") else 1
                skipped = max(skipped, 0)
            out.append(token)
        elif skipped or not token:
            out.append(token)
        else:
            out.append(change(token))
    return "".join(out)
