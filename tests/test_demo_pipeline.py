"""The main job's pipeline end to end, in seconds: train a translator on the numbers corpus,
evaluate it with greedy and beam decoding, draw the alignment figure, translate from the CLI."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

import attnkit
from attnkit.cli import build_parser, main

pytest.importorskip("num2words")
pytest.importorskip("sacrebleu")
pytest.importorskip("matplotlib")

QUICK = ["--preset", "numbers-en-de", "--data.numbers=1500", "--train.max_steps=60", "--quiet"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo") / "run"
    result = subprocess.run(
        [sys.executable, "-m", "attnkit", "train", *QUICK, "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_training_reports_bleu_samples_and_figure(run_dir: tuple[Path, str]) -> None:
    out, stdout = run_dir
    assert "sacreBLEU nrefs:1|case:mixed|eff:no|tok:13a" in stdout
    assert (
        "  greedy                               BLEU" in stdout
        and "  beam 4, α=0.6                        BLEU" in stdout
    )
    assert "  beam 4, α=1.0, no word 3-gram twice  BLEU" in stdout
    assert stdout.count("  reference: ") == 5
    figure = out / "alignment.png"
    assert figure.exists() and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"attnkit translate --model {out}" in stdout
    assert "target tokens in" in stdout and "(seed 0, " in stdout and "target tokens/s)" in stdout
    curve = out / "curve.png"
    assert f"training curve (loss and learning rate against seconds): {curve}" in stdout
    assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_translate_from_the_cli(run_dir: tuple[Path, str], capsys: pytest.CaptureFixture) -> None:
    out, _ = run_dir
    assert main(["translate", "--model", str(out), "twenty-one", "three hundred and five"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(lines)
    model = attnkit.from_pretrained(out)
    assert model.config.family == "transformer" and model.tokenizer is not None


def test_evaluate_and_info(run_dir: tuple[Path, str], capsys: pytest.CaptureFixture) -> None:
    out, _ = run_dir
    assert main(["evaluate", "--model", str(out), "--split", "test", "--num-beams", "1"]) == 0
    assert "BLEU" in capsys.readouterr().out
    assert main(["info", str(out)]) == 0
    assert "transformer" in capsys.readouterr().out


@pytest.mark.parametrize(
    "command", ["smoke", "convert", "train", "average", "generate", "translate", "fill-mask", "evaluate", "info"]
)
def test_every_subcommand_has_help_with_an_example(command: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    assert exit_.value.code == 0
    assert "example" in capsys.readouterr().out


def test_fill_mask_and_generate_on_tiny_trained_models(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "the", "mat", "and", "the", "dog", "ran", "in", "the", "park"]
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(8)) for _ in range(200)))
    common = [f"--data.path={corpus}", "--data.vocab_size=300", "--train.max_steps=30", "--train.lr=3e-3",
              "--train.warmup=5", "--train.batch_tokens=1024", "--quiet"]  # fmt: skip
    assert main(["train", "--preset", "bert-tiny", *common, "--out", str(tmp_path / "bert")]) == 0
    assert main(["train", "--preset", "gpt-tiny", *common, "--out", str(tmp_path / "gpt")]) == 0
    capsys.readouterr()
    assert main(["fill-mask", "--model", str(tmp_path / "bert"), "the cat [MASK] on the mat", "--top-k", "3"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "the cat [MASK] on the mat" and shown[1].startswith("  [MASK] #1: ")
    assert shown[1].count(",") == 2  # three candidates
    assert main(["generate", "--model", str(tmp_path / "gpt"), "--prompt", "the cat", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("the cat")
