"""The house's rooms import one way: a walk over every ``import`` in attnkit (function-level
ones too: a lazy import hides an arrow, it does not remove it) finds no cycle, config (the
floor) imports no other room, and the command line parses without importing torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "attnkit"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the attnkit modules it imports anywhere in its body."""
    known = modules()

    def owner(name: str) -> str:
        while name not in known:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {owner(a.name) for a in node.names if a.name.split(".")[0] == "attnkit"}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("attnkit"):
                for alias in node.names:  # `from pkg import submodule` imports the submodule
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in known else owner(node.module))  # type: ignore[arg-type]
            elif isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{path}: relative import; attnkit imports by absolute names")
        graph[name] = {t for t in targets if t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_function_level_imports_and_cycles() -> None:
    graph = import_graph()
    assert "attnkit.loading" in graph["attnkit.cli.common"]  # inside load_model
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_point_one_way() -> None:
    found = cycles(import_graph())
    described = [" <-> ".join(c) for c in found]
    assert not found, f"import cycles: {described}"


def test_lower_rooms_do_not_reach_up() -> None:
    """nn, models and generation know nothing of the rooms above them, nor nn, models and data
    of generation (which decodes the models: it gives them their generate()); interop, data and
    objectives do not import loading or the command line; loading (the one dispatcher between
    kinds of source) imports no training, which starts its fine-tuning from it; training
    imports no chapter (the chapter's figures are drawn by their callers); and only
    ``python -m attnkit`` imports the command line (no room reads a run directory through its
    helpers: :mod:`attnkit.models.run_dir` does)."""
    graph = import_graph()
    above = ("attnkit.interop", "attnkit.training", "attnkit.loading", "attnkit.cli", "attnkit.chapter")
    rules = {
        ("attnkit.nn", "attnkit.models", "attnkit.generation"): above,
        ("attnkit.interop", "attnkit.data", "attnkit.objectives"): ("attnkit.loading", "attnkit.cli"),
        ("attnkit.interop",): ("attnkit.training",),
        ("attnkit.nn", "attnkit.models", "attnkit.data"): ("attnkit.generation",),
        ("attnkit.loading", "attnkit.prepared"): ("attnkit.training", "attnkit.cli", "attnkit.chapter"),
        ("attnkit.training",): ("attnkit.cli", "attnkit.chapter"),
    }
    for lower, upper in rules.items():
        for module, targets in graph.items():
            if module.startswith(lower):
                bad = sorted(t for t in targets if t.startswith(upper))
                assert not bad, f"{module} imports {bad}"
    users = sorted(m for m, targets in graph.items() if not m.startswith("attnkit.cli") and "attnkit.cli" in targets)
    assert users == ["attnkit.__main__"], f"only the command line and python -m attnkit import attnkit.cli: {users}"


def test_a_run_directory_has_one_reader() -> None:
    """The names of a run directory's files (run.json, checkpoints/, the COMPLETE marker) are
    spelt only in :mod:`attnkit.models.run_dir`: whoever reads or writes one goes through it."""
    names = {"run.json", "checkpoints", "COMPLETE"}
    spelt = sorted(
        f"{name}: {node.value}"
        for name, path in modules().items()
        if name != "attnkit.models.run_dir"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value in names
    )
    assert not spelt, f"run directory files named outside attnkit.models.run_dir: {spelt}"


def test_config_is_the_floor() -> None:
    """attnkit.config imports no other room of attnkit, only its own modules: every room reads
    configs (data checks a run's Bible tasks against config's tables, not the reverse), and the
    command line reads them without torch."""
    graph = import_graph()

    def in_config(name: str) -> bool:
        return name == "attnkit.config" or name.startswith("attnkit.config.")

    assert "attnkit.config.bible" in graph["attnkit.config.run"]  # the walk sees the package's modules
    for module, targets in graph.items():
        if in_config(module):
            bad = sorted(t for t in targets if not in_config(t))
            assert not bad, f"{module} imports {bad}"


def test_what_decodes_a_model_imports_the_room_that_decodes() -> None:
    """``model.generate`` is attnkit.generation's, given to the models when it is imported
    (``Model.decoding``): a module that calls it reaches attnkit.generation through its imports.
    Model.generate itself is the models' and attnkit.models.auto runs inside attnkit.loading."""
    graph = import_graph()
    exempt = {"attnkit.models.core", "attnkit.models.auto"}
    for module, path in modules().items():
        calls = any(
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "generate"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
        if not calls or module in exempt:
            continue
        reached, todo = {module}, [module]
        while todo:
            for target in graph[todo.pop()] - reached:
                reached.add(target)
                todo.append(target)
        assert any(m.startswith("attnkit.generation") for m in reached), f"{module} calls generate()"
    assert "attnkit.generation" in graph["attnkit.loading"]


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["translate", "--help"], ["figures", "--help"]])
def test_parsing_the_command_line_imports_no_torch(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "from attnkit.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'tokenizers', 'numpy') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_import_attnkit_and_loading_leave_dynamo_and_distributed_checkpoint_alone() -> None:
    code = (
        "import sys, attnkit\n"
        "attnkit.from_pretrained\n"
        "print([m for m in ('torch._dynamo', 'torch.distributed.checkpoint') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_building_a_kernel_knows_nothing_of_its_op() -> None:
    """kernels.build compiles and loads the C code; kernels.ops registers the op and multiplies
    through it: the building imports neither the op nor anything that uses it."""
    graph = import_graph()
    for module in ("attnkit.kernels.build", "attnkit.kernels.blocks"):
        bad = sorted(
            t for t in graph[module] if t.startswith(("attnkit.kernels.ops", "attnkit.kernels.gemm", "attnkit.nn"))
        )
        assert not bad, f"{module} imports {bad}"
