"""BERT's use: predict the tokens behind [MASK] from both sides of context [tab:att-families]."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from attnkit.data.specials import BOS, MASK
from attnkit.models.core import EncoderOnlyModel


@torch.no_grad()
def fill_mask(
    model: EncoderOnlyModel, tokenizer: Tokenizer, text: str, top_k: int = 5
) -> list[tuple[int, list[tuple[str, float]]]]:
    """For each mask in ``text`` (written ``[MASK]`` or as the tokenizer's own mask token), its
    index among the masks and the ``top_k`` (token, probability) predictions."""
    cfg = model.config
    mask_token = MASK if tokenizer.token_to_id(MASK) is not None else "[MASK]"
    mask_id = tokenizer.token_to_id(mask_token)
    if mask_id is None:
        raise ValueError("the tokenizer has no mask token (<mask> or [MASK]); it was not made for a masked LM")
    ids = tokenizer.encode(text.replace("[MASK]", mask_token)).ids
    bos, eos = cfg.bos_token_id, cfg.eos_token_id
    # attnkit's tokenizers: the objective adds <s> ... </s>, where the tokenizer does not (export_hf's does)
    if bos is not None and tokenizer.token_to_id(BOS) == bos:
        ids = ([] if ids[:1] == [bos] else [bos]) + ids + ([] if eos is None or ids[-1:] == [eos] else [eos])
    positions = [i for i, t in enumerate(ids) if t == mask_id]
    if not positions:
        raise ValueError(f"no [MASK] in {text!r}; write [MASK] where a token should be predicted")
    logits = model(torch.tensor([ids])).logits[0, positions]  # (masks, vocab)
    probs, tokens = torch.softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
    label = lambda t: tokenizer.decode([t]).strip() or tokenizer.id_to_token(t)  # noqa: E731
    return [
        (n, [(label(t), float(p)) for t, p in zip(row_t, row_p, strict=True)])
        for n, (row_t, row_p) in enumerate(zip(tokens.tolist(), probs.tolist(), strict=True))
    ]
