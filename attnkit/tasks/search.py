"""Semantic search, BERT's *understanding* at work ([tab:att-families]): a corpus embedded once
by an encoder model (:meth:`~attnkit.models.core.EncoderOnlyModel.encode`), queries embedded as
they come, the nearest texts by cosine.

The corpus's embeddings are cached on disk, ``<cache>/<corpus>-<fingerprint>/`` holding
``embeddings.safetensors`` (the unit vectors) beside ``index.json`` (the references and texts,
in the same order). The fingerprint hashes the model's weights and tokenizer and the corpus's
references and texts, so a changed model or corpus is embedded again, never read stale; a damaged cache is
rebuilt. The entry is written as a temporary directory and renamed into place
(:func:`~attnkit.models.io.write_directory`), so an interrupted build leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import load_file
from torch import Tensor

from attnkit.models.core import EncoderOnlyModel
from attnkit.models.io import write_directory

EMBEDDINGS, INDEX = "embeddings.safetensors", "index.json"


@dataclass(frozen=True)
class Hit:
    reference: str
    text: str
    score: float  # cosine similarity to the query


@dataclass
class Index:
    """Texts, their references and their unit embeddings (N, d), row for row."""

    references: list[str]
    texts: list[str]
    vectors: Tensor

    def search(self, model: EncoderOnlyModel, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        """The ``k`` nearest texts of each query, best first."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        scores = model.encode(list(queries)) @ self.vectors.T  # (Q, N) cosines
        top = scores.topk(min(k, scores.shape[1]), dim=1)
        return [
            [
                Hit(self.references[i], self.texts[i], float(s))
                for s, i in zip(row_s.tolist(), row_i.tolist(), strict=True)
            ]
            for row_s, row_i in zip(top.values, top.indices, strict=True)
        ]


def fingerprint(model: EncoderOnlyModel, texts: Sequence[str]) -> str:
    """A hash of the model's weights, its tokenizer and ``texts``: what an index depends on."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    tokenizer = model.tokenizer
    digest.update(b"" if tokenizer is None else tokenizer.to_str().encode())
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def build(model: EncoderOnlyModel, items: Sequence[tuple[str, str]], batch_size: int = 64) -> Index:
    """The index of ``items`` (reference, text): every text embedded."""
    if not items:
        raise ValueError("the corpus is empty: there is nothing to search; give it at least one text")
    references, texts = [r for r, _ in items], [t for _, t in items]
    return Index(references, texts, model.encode(texts, batch_size=batch_size))


def cached(
    model: EncoderOnlyModel, items: Sequence[tuple[str, str]], name: str, cache: Path, batch_size: int = 64
) -> tuple[Index, bool]:
    """The index of ``items`` from ``cache`` when an earlier call built it with this model and
    these texts, else built and written there; returns it and whether it came from the cache."""
    if not items:
        raise ValueError(f"the corpus {name!r} is empty: there is nothing to search; give it at least one text")
    keys = [reference + "\t" + text for reference, text in items]
    directory = cache / f"{name}-{fingerprint(model, keys)}"
    try:
        meta = json.loads((directory / INDEX).read_text(encoding="utf-8"))
        vectors = load_file(directory / EMBEDDINGS)["vectors"]
        if vectors.shape[0] == len(meta["texts"]) == len(meta["references"]):
            return Index(meta["references"], meta["texts"], vectors), True
    except Exception:  # missing or damaged (safetensors' own error included): build it again
        pass
    index = build(model, items, batch_size)
    text = json.dumps({"references": index.references, "texts": index.texts}, ensure_ascii=False)
    write_directory(directory, {EMBEDDINGS: {"vectors": index.vectors}, INDEX: text.encode()}, overwrite=True)
    return index, False


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/attnkit/search``, else ``~/.cache/attnkit/search``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "attnkit" / "search"
