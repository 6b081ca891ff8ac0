"""The command line: help for every subcommand, conversion both ways, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.cli import build_parser, main
from attnkit.models import build_model

SUBCOMMANDS = ["smoke", "convert"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnkit", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help(command: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    assert exit_.value.code == 0
    assert "example" in capsys.readouterr().out


def test_convert_both_ways(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    transformers = pytest.importorskip("transformers")
    model = build_model("gpt-tiny").eval()
    model.save_pretrained(tmp_path / "ours")
    assert main(["convert", str(tmp_path / "ours"), str(tmp_path / "hf")]) == 0
    assert "hf format" in capsys.readouterr().out
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    back = attnkit.from_pretrained(tmp_path / "back")
    ids = torch.randint(0, 1000, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits, atol=0, rtol=0)
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-5)


def test_convert_refuses_to_overwrite(tmp_path: Path) -> None:
    build_model("gpt-tiny").save_pretrained(tmp_path / "ours")
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep.txt").write_text("mine")
    result = run("convert", str(tmp_path / "ours"), str(tmp_path / "dst"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"attnkit: error: {tmp_path / 'dst'} already exists and is not empty; pass --force to replace it"
    ]
    assert (tmp_path / "dst" / "keep.txt").read_text() == "mine"


def test_missing_source_is_one_line(tmp_path: Path) -> None:
    result = run("convert", str(tmp_path / "nope"), str(tmp_path / "dst"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"attnkit: error: {tmp_path / 'nope'} is not a directory; pass a directory written by save_pretrained "
        "(or a .gguf file)"
    ]
    assert not (tmp_path / "dst").exists()


def test_unknown_subcommand_is_a_usage_error() -> None:
    result = run("trian")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr
