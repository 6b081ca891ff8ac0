"""``weights="auto"``: the fastest weight format this machine runs for a job, among those whose
fidelity on the model's own check stays within the bound the docs state.

The order is the measured one (``python -m benchmarks decoding`` on both CPU classes; the
figures and their results files: docs/decoding.md):

* ``"decode"``, one row or a few (``generate``, ``chat``, ``serve``): weight reads bound the
  step, so the fewest bytes win: int8, then bf16 where native, then fp32. int4 is faster still
  but is not chosen for the user: on SmolLM2 it passed the check and still answered "What is the
  capital of France?" with a French phrase repeated to the end, where int8 and fp32 answer
  "Paris"; it stays one flag away, ``--weights int4``;
* ``"translate"``, batches of beams: the products are many rows deep, where int8 meets PyTorch's
  int8 GEMM (:mod:`attnkit.kernels.gemm`) and leads, then bf16 where native, then fp32; int4
  meets the same GEMM, so it is no faster there and not chosen.

The check: the perplexity of a fixed English text (:data:`CHECK_TEXT`, through the model's own
tokenizer) under the candidate, against fp32's (an encoder–decoder reads the text as its source
and is scored on fp32's own greedy translation of it). A format passes within
:data:`BOUNDS` (int8 and bf16 1%: the bound of docs/performance.md). A model
saved quantised is kept as it is: there is no fp32 to check against, and its format was chosen
by whoever quantised it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.machine import cpu_class
from attnkit.models.core import EncoderOnlyModel, Model
from attnkit.models.weights import apply_format, runs_fast

Job = Literal["decode", "translate"]
ORDER: dict[str, tuple[str, ...]] = {
    "decode": ("int8", "bf16", "fp32"),
    "translate": ("int8", "bf16", "fp32"),
}
BOUNDS = {"bf16": 1.01, "int8": 1.01}  # perplexity, as a multiple of fp32's
CHECK_TOKENS = 128
# Genesis 1:1-8 (King James Version, public domain).
CHECK_TEXT = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
    "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
    "said, Let there be light: and there was light. And God saw the light, that it was good: and God divided "
    "the light from the darkness. And God called the light Day, and the darkness he called Night. And the "
    "evening and the morning were the first day. And God said, Let there be a firmament in the midst of the "
    "waters, and let it divide the waters from the waters. And God made the firmament, and divided the waters "
    "which were under the firmament from the waters which were above the firmament: and it was so. And God "
    "called the firmament Heaven. And the evening and the morning were the second day."
)


@dataclass(frozen=True)
class Choice:
    """The format chosen, and why, in words for the user."""

    weights: str
    reason: str


def candidates(job: Job, device: torch.device) -> list[str]:
    """The formats ``device`` runs fast, fastest first for ``job``, ending with fp32."""
    return [weights for weights in ORDER[job] if weights == "fp32" or runs_fast(weights, device)]


def check_ids(model: Model) -> Tensor:
    """The check's token ids (1, T): :data:`CHECK_TEXT` through the model's tokenizer, or without
    one a fixed draw of ids; at most :data:`CHECK_TOKENS` and within the model's context."""
    cfg = model.config
    limit = min(CHECK_TOKENS, cfg.max_len)
    tokenizer = model.tokenizer
    ids = tokenizer.encode(CHECK_TEXT).ids[:limit] if tokenizer is not None else []
    if len(ids) < 8 or max(ids) >= cfg.vocab_size:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, cfg.vocab_size, (limit,), generator=generator).tolist()
    return torch.tensor([ids])


@torch.no_grad()
def perplexity(model: Model, ids: Tensor, target: Tensor | None = None) -> float:
    """exp of the mean next-token loss: of ``ids`` (1, T) for a decoder-only model, of ``target``
    (1, U, starting with the start token) given the source ``ids`` for an encoder–decoder."""
    if target is None:
        logits, labels = model(ids).logits[:, :-1], ids[:, 1:]
    else:
        logits, labels = model(ids, decoder_input_ids=target[:, :-1]).logits, target[:, 1:]
    return math.exp(F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()).item())


def choose(model: Model, job: Job) -> tuple[Model, Choice]:
    """``model`` (fp32, as loaded) in the first format of :data:`ORDER` for ``job`` that this
    machine runs fast and that passes the check; fp32 where none does, saying why. Each
    candidate is converted from a copy, so ``model`` stays fp32 until one passes."""
    kept = model.weights
    if kept != "fp32":
        return model, Choice(kept, f"the model is saved in {kept}; it runs as it is")
    if isinstance(model, EncoderOnlyModel):  # BERT: no next-token perplexity to check, no decoding to speed up
        return model, Choice("fp32", "an encoder-only model has no next-token check to pass; it runs as trained")
    if (what := model.headless()) is not None:  # a GPT classifier: no vocabulary to check the formats by
        return model, Choice("fp32", f"the model is {what}, with no next-token check; it runs as trained")
    model.eval()
    device = next(model.parameters()).device
    where = f"this {cpu_class().describe()} CPU" if device.type == "cpu" else device.type
    ids = check_ids(model)
    target = model.generate(ids, max_new_tokens=32, eos_token_id=None) if model.config.is_encoder_decoder else None
    reference = perplexity(model, ids, target)
    failed = []
    for weights in candidates(job, device)[:-1]:  # the last is fp32, the model as it is
        converted = apply_format(copy.deepcopy(model), weights)
        ratio = perplexity(converted, ids, target) / reference
        if ratio <= BOUNDS[weights]:
            why = (
                f"the fastest for {job} on {where} (benchmarks/results/decoding-*); its perplexity on the check is "
                f"{ratio:.4f}x fp32's, within {BOUNDS[weights]}x"
            )
            return converted, Choice(weights, why)
        failed.append(f"{weights} {ratio:.4f}x (bound {BOUNDS[weights]}x)")
    if failed:
        return model, Choice("fp32", f"no faster format passed the check on this model: {', '.join(failed)}")
    return model, Choice("fp32", f"the fastest for {job} on {where}")
