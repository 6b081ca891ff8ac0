"""Forward-pass throughput of attnkit vs transformers on identical weights (issue: families).

GPT-2 and BERT at their base sizes, fp32, eval mode, no gradients. The peer model is a
randomly initialised ``transformers`` model; attnkit's is converted from it by the production
converter, so both compute the same function.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

import attnkit
from benchmarks.common import Comparison, compare


def _pair(hf_model: torch.nn.Module) -> torch.nn.Module:
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        return attnkit.from_pretrained(Path(tmp))


def run(
    batch: int = 4, seq_len: int = 256, repeats: int = 7, small: bool = False, compile: bool = False
) -> list[Comparison]:
    import transformers

    torch.manual_seed(0)
    size = dict(n_embd=128, n_layer=2, n_head=4) if small else {}
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(**size)).eval()
    bsize = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512) if small else {}
    bert = transformers.BertModel(transformers.BertConfig(**bsize)).eval()
    results = []
    for name, hf in (("GPT-2 forward", gpt2), ("BERT forward", bert)):
        ours = _pair(hf)
        ids = torch.randint(0, hf.config.vocab_size, (batch, seq_len))
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            results.append(
                compare(
                    f"{name} ({batch}×{seq_len})",
                    lambda ours=ours, ids=ids, mask=mask: ours(ids, attention_mask=mask),
                    lambda hf=hf, ids=ids, mask=mask: hf(ids, attention_mask=mask),
                    work=batch * seq_len, peer_name="transformers", repeats=repeats,
                    compile_ours=ours if compile else None,
                )
            )  # fmt: skip
    return results
