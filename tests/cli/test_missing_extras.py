"""A command whose optional package is missing says so in one line, naming the command, the
package and the extra that installs it, exits 2 and writes nothing; found by hiding each
optional module (``sys.modules[name] = None`` makes importing it fail as if uninstalled)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnkit.cli import EXTRAS, main, missing_extra

CASES = [  # (command line, the module hidden, the package and the extra named)
    (["figures", "--quick", "--only", "variance", "--out", "{out}"], "matplotlib", "matplotlib", "plots"),
    (["train", "--preset", "numbers-en-de", "--out", "{out}", "--quiet"], "sacrebleu", "sacrebleu", "eval"),
    (["train", "--preset", "numbers-en-de", "--out", "{out}", "--quiet"], "matplotlib", "matplotlib", "plots"),
    (["train", "--config", "{config}", "--out", "{out}"], "yaml", "PyYAML", "yaml"),
]


@pytest.mark.parametrize(("argv", "module", "package", "extra"), CASES, ids=[f"{c[0][0]}-{c[1]}" for c in CASES])
def test_a_missing_extra_is_one_line_naming_the_fix(
    argv: list[str], module: str, package: str, extra: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:  # fmt: skip
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  family: gpt\n  vocab_size: 300\n", encoding="utf-8")
    out = tmp_path / "out"
    monkeypatch.setitem(__import__("sys").modules, module, None)
    code = main([a.replace("{out}", str(out)).replace("{config}", str(config)) for a in argv])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    fix = f"pip install 'attnkit[{extra}]'"
    assert err == [f"attnkit: error: {argv[0]} needs {package}, which is not installed: {fix}"]
    assert not out.exists() or not any(out.iterdir())


def test_every_extra_is_named_and_other_missing_modules_are_not_ours() -> None:
    for module, (_, extra) in EXTRAS.items():
        err = ModuleNotFoundError(f"No module named '{module}'", name=f"{module}.sub")
        assert f"pip install 'attnkit[{extra}]'" in (missing_extra(err, "translate") or "")
    assert missing_extra(ModuleNotFoundError("No module named 'attnkit.nope'", name="attnkit.nope"), "info") is None
