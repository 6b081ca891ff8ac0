"""A griffe extension that makes attnkit's reST-flavoured docstrings read right as Markdown.

attnkit's docstrings are prose with Sphinx cross-reference roles (``:func:`attention_math```,
``:class:`~attnkit.nn.attention.MultiHeadAttention```, ``:meth:`IncrementalModel.step```) and
double-backtick literals (which Markdown already reads as code). Before mkdocstrings renders a
docstring, this extension:

- turns each role into a link: the name is resolved as Python would see it from the object
  (its members, then its parents', then the module's imports); a name inside attnkit becomes
  a cross-reference to its documentation (mkdocs-autorefs), a name outside it (``torch...``)
  plain code. A bare name that names nothing in its scope, or a path into attnkit that does
  not exist, is a warning, which ``mkdocs build --strict`` turns into a failure: the docstring
  points at something that does not exist;
- escapes ``<`` outside code (``source<TAB>target``, ``<extra_id_i>``), which Markdown would
  otherwise take for an HTML tag and swallow;
- documents each public re-export (a name in a module's ``__all__`` imported from elsewhere in
  attnkit, ``attnkit.nn.MultiHeadAttention``) once, where it is defined: the module's page lists its
  re-exported names, each linked to that documentation, instead of rendering them a second time;
- escapes the brackets of the chapter's labels, ``[eq:att-sdpa] [eq:att-alpha]``, which Markdown
  (and mkdocs-autorefs) would otherwise read as a reference link ``[title] [identifier]``; the
  text stays ``[eq:att-sdpa]`` and docs/hooks.py links it to the chapter map.

Loaded by mkdocstrings (``extensions:`` in mkdocs.yml); nothing is imported from attnkit.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

logger = griffe.get_logger("griffe_docstrings")

PACKAGE = "attnkit"

ROLE = re.compile(
    r":(?:py:)?(?P<role>func|class|meth|mod|attr|data|exc|obj|const|type):"
    r"`(?P<tilde>~?)(?P<body>[^`]+)`"
)
EXPLICIT_TITLE = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1", re.DOTALL)
AUTOLINK = re.compile(r"<(?:https?|mailto):[^>\s]+>")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
CHAPTER_LABEL = re.compile(r"\[(?P<label>[a-z]+:att-[a-z0-9-]+)\]")


class DocstringMarkdown(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != PACKAGE:
            return
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = self._rewrite(obj, obj.docstring.value, loader)
        for module in _walk(pkg):
            if module.is_module:
                _list_reexports(module)

    def _rewrite(self, obj: griffe.Object, text: str, loader: griffe.GriffeLoader) -> str:
        roles: list[str] = []

        def stash(match: re.Match[str]) -> str:
            roles.append(self._role(obj, match, loader))
            return f"\x00{len(roles) - 1}\x00"

        def change(prose: str) -> str:
            return CHAPTER_LABEL.sub(r"\\[\g<label>\\]", _escape_lt(prose))

        # Roles first: their `target` would otherwise be taken for a code span.
        text = _outside_code(ROLE.sub(stash, text), change)
        return re.sub(r"\x00(\d+)\x00", lambda m: roles[int(m.group(1))], text)

    def _role(self, obj: griffe.Object, match: re.Match[str], loader: griffe.GriffeLoader) -> str:
        body = match["body"].strip()
        explicit = EXPLICIT_TITLE.match(body)
        target = explicit["target"].strip() if explicit else body
        target = target.removesuffix("()").lstrip(".")
        if explicit:
            title = explicit["title"]
        elif match["tilde"]:
            title = target.rsplit(".", 1)[-1]
        else:
            title = body.lstrip(".")
        code = f"`{title}`" if "`" not in title else title

        path = _resolve(obj, target)
        if path is None:
            where = f"{obj.relative_filepath}:{obj.docstring.lineno if obj.docstring else obj.lineno}"
            logger.warning(f"{where}: {match.group(0)} in the docstring of {obj.path} names nothing in its scope")
            return code
        if path.split(".", 1)[0] != PACKAGE:
            return code  # torch, the standard library: no page of ours to link to
        if not _exists(loader, path):
            where = f"{obj.relative_filepath}:{obj.docstring.lineno if obj.docstring else obj.lineno}"
            logger.warning(f"{where}: {match.group(0)} in the docstring of {obj.path}: {path} does not exist")
            return code
        return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'


def _list_reexports(module: griffe.Module) -> None:
    """Hide the module's public aliases from its page and list them, linked, in its docstring."""
    by_origin: dict[str, list[tuple[str, str]]] = {}
    for name, member in module.members.items():
        if not member.is_alias or not member.is_public or name.startswith("_"):
            continue
        target = member.target_path
        if target.split(".", 1)[0] != PACKAGE:
            continue
        member.public = False
        by_origin.setdefault(target.rsplit(".", 1)[0], []).append((name, target))
    if not by_origin:
        return
    lines = ["", "", "**Re-exported here**, documented where each is defined:", ""]
    for origin, names in sorted(by_origin.items()):
        links = ", ".join(
            f'<autoref identifier="{html.escape(target)}" optional>`{name}`</autoref>' for name, target in names
        )
        lines.append(f'- from <autoref identifier="{html.escape(origin)}" optional>`{origin}`</autoref>: {links}')
    text = "\n".join(lines) + "\n"
    if module.docstring is None:
        module.docstring = griffe.Docstring(text.lstrip(), parent=module)
    else:
        module.docstring.value = module.docstring.value.rstrip() + text


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


def _resolve(obj: griffe.Object, target: str) -> str | None:
    """The full path of ``target`` as seen from ``obj``, or None when nothing has that name."""
    head, _, rest = target.partition(".")
    try:
        path = obj.resolve(head)
    except griffe.NameResolutionError:
        if head != PACKAGE and not rest:
            return None
        path = head  # attnkit.x.y, or a full path outside attnkit (numpy.x): taken as written
    return f"{path}.{rest}" if rest else path


def _exists(loader: griffe.GriffeLoader, path: str) -> bool:
    try:
        loader.modules_collection.get_member(path)
    except Exception:  # KeyError, or an alias that does not resolve
        return False
    return True


def _escape_lt(prose: str) -> str:
    out, last = [], 0
    for link in AUTOLINK.finditer(prose):
        out.append(prose[last : link.start()].replace("<", "&lt;"))
        out.append(link.group(0))
        last = link.end()
    out.append(prose[last:].replace("<", "&lt;"))
    return "".join(out)


def _outside_code(text: str, change) -> str:
    """Apply ``change`` to the prose of a Markdown text: not to code spans, fences or indented code."""
    out: list[str] = []
    prose: list[str] = []
    fence: str | None = None
    indented = False
    previous_blank = True

    def flush() -> None:
        if prose:
            joined = "\n".join(prose)
            pieces, last = [], 0
            for span in CODE_SPAN.finditer(joined):
                pieces.append(change(joined[last : span.start()]))
                pieces.append(span.group(0))
                last = span.end()
            pieces.append(change(joined[last:]))
            out.append("".join(pieces))
            prose.clear()

    for line in text.split("\n"):
        blank = not line.strip()
        opened = FENCE.match(line)
        if fence is not None:
            out.append(line)
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
        elif opened:
            flush()
            fence = opened.group(1)
            out.append(line)
        elif indented and (blank or line.startswith("    ")):
            out.append(line)
        elif previous_blank and line.startswith("    ") and not blank:
            flush()
            indented = True
            out.append(line)
        else:
            indented = False
            prose.append(line)
        previous_blank = blank
    flush()
    return "\n".join(out)
