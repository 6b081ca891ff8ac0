"""Generation throughput of attnkit vs transformers' ``generate`` on identical weights:
greedy and beam-4 (issue: decoding), and the cost of one new token as the prefix grows.

Prompts are random token ids; the end token is switched off on both sides, so both run the
full ``max_new_tokens`` and the work is identical.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

import attnkit
from benchmarks.common import Comparison, compare

SIZES = {
    "GPT-2 124M": {},
    "tiny (d=64, 2 layers)": dict(n_embd=64, n_layer=2, n_head=4),
}


def _hf_gpt2(config_changes: dict, n_positions: int = 1024) -> torch.nn.Module:
    """A randomly initialised GPT-2 (seed 0) of ``transformers``."""
    import transformers

    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=n_positions, **config_changes)).eval()


def _pair(config_changes: dict, n_positions: int = 1024) -> tuple[torch.nn.Module, torch.nn.Module]:
    hf = _hf_gpt2(config_changes, n_positions)
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = attnkit.from_pretrained(Path(tmp))
    # No end token on either side, so both generate exactly max_new_tokens.
    ours.config = ours.config.replace(eos_token_id=None)
    hf.generation_config.eos_token_id = None
    return ours, hf


def _hf_options() -> dict:
    """Switch off everything that is not the search itself (and EOS, see the module doc)."""
    return dict(do_sample=False, pad_token_id=0, min_length=0, early_stopping=True)


def run(repeats: int = 5, small: bool = False, batch: int = 1, prompt: int = 32, new: int = 64) -> list[Comparison]:
    results = []
    sizes = {k: v for k, v in SIZES.items() if not small or "tiny" in k}
    for name, changes in sizes.items():
        ours, hf = _pair(changes)
        ids = torch.randint(0, hf.config.vocab_size, (batch, prompt))
        for beams in (1, 4):
            label = "greedy" if beams == 1 else f"beam-{beams}"
            results.append(
                compare(
                    f"{name} {label} ({batch}×{prompt} + {new})",
                    lambda ours=ours, ids=ids, b=beams: ours.generate(
                        ids, max_new_tokens=new, num_beams=b, length_penalty_style="power"
                    ),
                    lambda hf=hf, ids=ids, b=beams: hf.generate(
                        ids, max_new_tokens=new, num_beams=b, **_hf_options()
                    ),
                    work=batch * new, peer_name="transformers", repeats=repeats, warmup=1,
                )
            )  # fmt: skip
    return results


def per_token_latency(prefixes: tuple[int, ...] = (64, 256, 1024), new: int = 48, repeats: int = 5) -> dict:
    """Milliseconds per new token after a prefix of each length (greedy, batch 1), attnkit and
    transformers, on a model whose context holds the longest prefix."""
    ours, hf = _pair(dict(n_embd=256, n_layer=4, n_head=4), n_positions=max(prefixes) + new)
    table = {}
    for prefix in prefixes:
        ids = torch.randint(0, hf.config.vocab_size, (1, prefix))
        row = {}
        for name, fn in (
            ("attnkit", lambda ids=ids: ours.generate(ids, max_new_tokens=new, compile=False)),
            ("transformers", lambda ids=ids: hf.generate(ids, max_new_tokens=new, **_hf_options())),
            ("attnkit, prefix only", lambda ids=ids: ours.generate(ids, max_new_tokens=1, compile=False)),
            ("transformers, prefix only", lambda ids=ids: hf.generate(ids, max_new_tokens=1, **_hf_options())),
        ):
            fn()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            row[name] = statistics.median(times)
        table[prefix] = {
            lib: 1000 * (row[lib] - row[f"{lib}, prefix only"]) / (new - 1) for lib in ("attnkit", "transformers")
        }
    return table
