"""LoRA adapters: the adapted model starts as the pretrained one, only the adapters train
(frozen parameters do not change), the merged weights give the adapter model's logits, and a
saved model is the merged one, loadable as a plain model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attnkit
from attnkit.nn import lora


def gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    return attnkit.build_model(attnkit.preset("gpt-tiny", vocab_size=64, dropout=0.0))


def test_adapters_train_alone_and_merge_to_the_same_logits(tmp_path: Path) -> None:
    model = gpt()
    ids = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
    frozen = {name: p.detach().clone() for name, p in model.named_parameters()}
    wrapped = lora.add(model, rank=4, alpha=8.0, targets=("w_q", "w_v"))
    assert len(wrapped) == 2 * model.config.n_layers and all(w.endswith(("w_q", "w_v")) for w in wrapped)
    with torch.no_grad():
        assert_close(model(ids).logits, before)  # B = 0: the adapted model starts as the pretrained one
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(name.endswith(("lora_a", "lora_b")) for name in trainable)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).logits.flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for name, p in model.named_parameters():  # the pretrained weights under their wrapped names
        original = name.replace(".base.", ".")
        if original in frozen:
            assert torch.equal(p, frozen[original]), name
    with torch.no_grad():
        adapted = model(ids).logits
    assert not torch.allclose(adapted, before)  # the adapters learnt something
    model.save_pretrained(tmp_path / "merged")  # merged on save: a plain model
    loaded = attnkit.from_pretrained(tmp_path / "merged")
    assert set(dict(loaded.named_parameters())) == set(frozen)
    with torch.no_grad():
        assert_close(loaded(ids).logits, adapted, atol=1e-5, rtol=1e-5)
        assert_close(lora.merge(model)(ids).logits, adapted, atol=1e-5, rtol=1e-5)
    assert not lora.has_adapters(model) and all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (dict(rank=0), ValueError, "LoRA rank must be an integer >= 1, got 0"),
        (dict(rank=-2), ValueError, "LoRA rank must be an integer >= 1"),
        (dict(rank=4, targets=("w_x",)), ValueError, "LoRA targets must be among w_q, w_k, w_v, w_o"),
    ],
)
def test_bad_adapters_are_refused(options: dict, error: type, message: str) -> None:
    model = gpt()
    with pytest.raises(error, match=message):
        lora.add(model, **options)
    assert not lora.has_adapters(model)
