"""Pretraining, then fine-tuning (train.init naming a pretraining run), end to end on tiny runs:
the fine-tuned model starts from the pretrained weights (equal, tensor by tensor, after an
update too small to move them), and a pretrained language model starts a task of its kind at a
lower loss than the same model from random weights. Refusals: a pretraining run of another
family or shape."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attnkit
from attnkit.cli import main
from attnkit.config import RunConfig, apply_overrides, run_preset
from attnkit.training.run import train

WORDS = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()  # noqa: SIM905


def counting(path: Path, n: int, seed: int, label: bool = False) -> Path:
    """Lines that count up from a random word (a pattern a tiny model learns in tens of
    updates); with ``label``, each line's class is whether it starts in the first half."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        start = rng.randrange(len(WORDS) - 4)
        text = " ".join(WORDS[start : start + rng.randrange(4, len(WORDS) - start + 1)])
        lines.append(f"{text}\t{'low' if start < 5 else 'high'}" if label else text)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_of(preset: str, path: Path, steps: int, **changes: str) -> RunConfig:
    quick = {
        "data.corpus": "files", "data.path": str(path), "data.vocab_size": "300", "data.max_tokens": "24",
        "train.max_steps": str(steps), "train.time_budget": "null", "train.warmup": "2", "train.lr": "3e-3",
        "train.batch_tokens": "512", "train.eval_every": "0", "train.checkpoint_every": str(steps),
        "train.log_every": "1", "train.schedule": "cosine", "model.n_layers": "2", "model.d_model": "32",
        "model.n_heads": "2", "model.d_ff": "64",
    }  # fmt: skip
    return apply_overrides(run_preset(preset), {**quick, **changes})


def first_loss(run_dir: Path) -> float:
    """The loss of the first update, taken before it moves any weight."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return next(r["loss"] for r in records if r["split"] == "train" and r["step"] == 1)


@pytest.fixture(scope="module")
def pretrained_gpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("transfer")
    train(run_of("gpt-tiny", counting(root / "pretraining.txt", 600, seed=0), 60), root / "gpt", progress_bar=False)
    return root / "gpt"


def test_a_pretrained_lm_starts_its_task_lower_than_random_weights(pretrained_gpt: Path, tmp_path: Path) -> None:
    task = counting(tmp_path / "task.txt", 200, seed=1)  # other lines of the same kind
    tokenizer = str(pretrained_gpt / "tokenizer.json")
    tuned = run_of("gpt-tiny", task, 1, **{"train.init": str(pretrained_gpt), "data.tokenizer": tokenizer})
    alone = run_of("gpt-tiny", task, 1, **{"data.tokenizer": tokenizer})
    train(tuned, tmp_path / "tuned", progress_bar=False)
    train(alone, tmp_path / "alone", progress_bar=False)
    assert first_loss(tmp_path / "tuned") < first_loss(tmp_path / "alone") - 1.0


def test_the_fine_tuned_classifier_starts_from_the_pretrained_weights(pretrained_gpt: Path, tmp_path: Path) -> None:
    """GPT-1's transfer: the pretrained decoder under a new head, every tensor the two share
    equal after one update of at most 1e-10 (AdamW's first step is about its rate)."""
    labelled = counting(tmp_path / "labelled.txt", 200, seed=2, label=True)
    changes = {"train.objective": "classify", "train.init": str(pretrained_gpt), "train.lr": "1e-10",
               "train.weight_decay": "0", "model.lm_head": "false", "model.classifier_pooling": "last"}  # fmt: skip
    train(run_of("gpt-tiny", labelled, 1, **changes), tmp_path / "classifier", progress_bar=False)
    base, tuned = attnkit.from_pretrained(pretrained_gpt), attnkit.from_pretrained(tmp_path / "classifier")
    assert tuned.config.labels == ("high", "low") and tuned.head is None and tuned.classifier is not None
    mine = dict(tuned.named_parameters())
    shared = [name for name, _ in base.named_parameters() if name in mine]
    assert {name for name in mine if name not in shared} == {"classifier.1.weight"}  # only the new head
    for name, tensor in base.named_parameters():
        assert_close(mine[name], tensor, atol=1e-9, rtol=0, msg=name)


def test_fine_tuning_from_another_family_is_one_line(pretrained_gpt: Path, tmp_path: Path) -> None:
    labelled = counting(tmp_path / "labelled.txt", 50, seed=3, label=True)
    run = run_of("bert-tiny", labelled, 1, **{"train.objective": "classify", "train.init": str(pretrained_gpt)})
    refused = r"train\.init=.* is a gpt model, and this run.s model is bert; fine-tune it with a gpt preset"
    with pytest.raises(ValueError, match=refused):
        train(run, tmp_path / "never", progress_bar=False)
    assert not (tmp_path / "never").exists()


def test_fine_tuning_with_another_vocabulary_is_one_line(pretrained_gpt: Path, tmp_path: Path) -> None:
    text = counting(tmp_path / "text.txt", 50, seed=4)
    text.write_text(text.read_text() + "a rather different line of words, for merges of other bytes\n" * 20)
    train(run_of("gpt-tiny", text, 1, **{"data.vocab_size": "400"}), tmp_path / "other", progress_bar=False)
    other = str(tmp_path / "other" / "tokenizer.json")
    run = run_of("gpt-tiny", text, 1, **{"train.init": str(pretrained_gpt), "data.tokenizer": other})
    with pytest.raises(ValueError, match=r"^data\.tokenizer=.* has \d+ tokens and train\.init=.* tokenizer \d+; give"):
        train(run, tmp_path / "never", progress_bar=False)
    assert not (tmp_path / "never").exists()
    # As many tokens, learnt from other text: refused for its contents, not its size
    size = str(len(json.loads((pretrained_gpt / "tokenizer.json").read_text())["model"]["vocab"]))
    train(run_of("gpt-tiny", text, 1, **{"data.vocab_size": size}), tmp_path / "same-size", progress_bar=False)
    same_size = str(tmp_path / "same-size" / "tokenizer.json")
    run = run_of("gpt-tiny", text, 1, **{"train.init": str(pretrained_gpt), "data.tokenizer": same_size})
    with pytest.raises(ValueError, match=r"^data\.tokenizer=.* is not train\.init=.* tokenizer: \d+ of its \d+ tokens"):
        train(run, tmp_path / "never", progress_bar=False)
    assert not (tmp_path / "never").exists()


def test_a_gpt_classifier_labels_text_and_is_refused_where_it_cannot_go(
    pretrained_gpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    labelled = counting(tmp_path / "labelled.txt", 200, seed=5, label=True)
    changes = {"train.objective": "classify", "train.init": str(pretrained_gpt), "model.lm_head": "false",
               "model.classifier_pooling": "last"}  # fmt: skip
    train(run_of("gpt-tiny", labelled, 2, **changes), tmp_path / "classifier", progress_bar=False)
    capsys.readouterr()
    assert main(["classify", "--model", str(tmp_path / "classifier"), "one two three four", "nine ten eleven"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] in ("high", "low") for line in lines] == [True, True]
    assert main(["serve", "--model", str(tmp_path / "classifier")]) == 2
    assert "is a classifier (labels ['high', 'low']) and generates nothing to serve" in capsys.readouterr().err


def test_lora_fine_tuning_trains_the_new_classifier_head_whole(pretrained_gpt: Path, tmp_path: Path) -> None:
    labelled = counting(tmp_path / "labelled.txt", 200, seed=6, label=True)
    changes = {"train.objective": "classify", "train.init": str(pretrained_gpt), "model.lm_head": "false",
               "model.classifier_pooling": "last", "model.lora_rank": "2", "train.lr": "1e-2"}  # fmt: skip
    train(run_of("gpt-tiny", labelled, 3, **changes), tmp_path / "lora", progress_bar=False)
    tuned = attnkit.from_pretrained(tmp_path / "lora")  # adapters merged into the weights they adapt
    seed = json.loads((tmp_path / "lora" / "run.json").read_text())["train"]["seed"]
    torch.manual_seed(seed)  # the head as the run initialised it: built from its seed, before the copy
    initial = attnkit.build_model(tuned.config.replace(lora_rank=0)).classifier[1].weight
    assert not torch.equal(tuned.classifier[1].weight, initial)  # trained (a frozen head would be equal)
    base = dict(attnkit.from_pretrained(pretrained_gpt).named_parameters())
    for name, tensor in tuned.named_parameters():  # the weights no adapter targets stay the pretrained ones
        if name in base and not any(t in name for t in ("w_q", "w_v")):
            assert_close(tensor, base[name], atol=0, rtol=0, msg=name)


def test_a_classifier_reads_a_text_as_its_pretraining_did_in_attnkit_and_in_transformers(
    pretrained_gpt: Path, tmp_path: Path
) -> None:
    """GPT's causal LM reads ``<s> x``, BERT's masked LM ``<s> x </s>``: a classifier with
    attnkit's own tokenizer is trained on, and reads, the same rows (GPT-1's start token), and
    its ``transformers`` export reads them from the raw text too, to equal logits."""
    import transformers

    from attnkit.data.tokenizer import encode_batch, specials_of
    from attnkit.objectives import CausalLM

    labelled = counting(tmp_path / "labelled.txt", 200, seed=7, label=True)
    changes = {"train.objective": "classify", "model.lm_head": "false", "model.classifier_pooling": "last"}
    train(run_of("gpt-tiny", labelled, 2, **changes, **{"train.init": str(pretrained_gpt)}), tmp_path / "gpt",
          progress_bar=False)  # fmt: skip
    train(run_of("bert-tiny", labelled, 2, **{**changes, "model.classifier_pooling": "mean"}), tmp_path / "bert",
          progress_bar=False)  # fmt: skip
    texts = ["one two three four", "nine ten eleven"]
    gpt, bert = attnkit.from_pretrained(tmp_path / "gpt"), attnkit.from_pretrained(tmp_path / "bert")
    pretraining = CausalLM(specials_of(gpt.tokenizer)).batch(encode_batch(gpt.tokenizer, texts))
    rows = gpt.text_ids(texts)
    assert [row[0] for row in rows] == [specials_of(gpt.tokenizer).bos] * 2
    for row, inputs, mask in zip(rows, pretraining["input_ids"], pretraining["attention_mask"], strict=True):
        assert row == inputs[mask.bool()].tolist()  # the pretraining's own input row
    s = specials_of(bert.tokenizer)
    assert bert.text_ids(texts) == [[s.bos, *ids, s.eos] for ids in encode_batch(bert.tokenizer, texts)]
    # Exported, transformers' tokenizer adds the same <s> (no second one) and the model gives the same logits
    attnkit.export_hf(gpt, tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert [tokenizer(t)["input_ids"] for t in texts] == rows
    with torch.no_grad():
        for text, row in zip(texts, rows, strict=True):
            expected = gpt.eval()(torch.tensor([row])).logits
            assert_close(reference(**tokenizer(text, return_tensors="pt")).logits, expected, atol=1e-5, rtol=0)
