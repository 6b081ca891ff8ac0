"""The house's rooms stay small: a function over 60 lines or 10 parameters says why in a comment
right above it or on its ``def`` line (issue 48). A long function is sometimes right (an experiment read top to bottom,
a pinned signature); an unexplained one is a room to split."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "attnkit"
MAX_LINES, MAX_PARAMETERS = 60, 10


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return len(names) - (1 if names and names[0].arg in ("self", "cls") else 0)


def unexplained(source: str) -> list[str]:
    """The functions of ``source`` over the limits with no comment on the line above them (above
    their decorators) or on their ``def`` line."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
        if length <= MAX_LINES and parameters(node) <= MAX_PARAMETERS:
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        if not lines[first - 2].strip().startswith("#") and "  # " not in lines[node.lineno - 1]:
            found.append(f"{node.name} (line {node.lineno}: {length} lines, {parameters(node)} parameters)")
    return found


def test_the_check_sees_length_parameters_and_the_comment() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    long = f"def f():\n{body}\n"
    assert unexplained(long) == [f"f (line 1: {MAX_LINES + 1} lines, 0 parameters)"]
    assert unexplained(f"# Why: one table.\n{long}") == []
    assert unexplained(long.replace("def f():", "def f():  # why: one table")) == []
    assert unexplained("\n@decorator\ndef g(self, a, b, c, d, e, f, g, h, i, j, k):\n    pass\n") == [
        "g (line 3: 2 lines, 11 parameters)"
    ]


def test_every_long_function_says_why() -> None:
    found = {
        str(path.relative_to(PACKAGE.parent)): bad
        for path in sorted(PACKAGE.rglob("*.py"))
        if (bad := unexplained(path.read_text(encoding="utf-8")))
    }
    assert not found, (
        f"functions over {MAX_LINES} lines or {MAX_PARAMETERS} parameters with no comment saying why: {found}"
    )
