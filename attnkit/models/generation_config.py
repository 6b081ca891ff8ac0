"""A checkpoint's ``generation_config.json``: the ``generate`` options it sets, taken as
defaults that explicit arguments override (as ``transformers`` does).

Hugging Face's beam-search semantics come with them: where the file speaks for a Hugging Face
checkpoint, its length penalty is the ``power`` form (default α = 1.0) and ``early_stopping``
defaults to False, so that the checkpoint decodes as ``transformers.generate`` decodes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GENERATION_CONFIG = "generation_config.json"

# generation_config.json key -> (its type check, generate()'s argument).
_INT = (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
_NUMBER = (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number")
_BOOL = (lambda v: isinstance(v, bool), "true or false")
_IDS = (
    lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v))
    ),
    "a token id or a list of them",
)
_WORDS = (
    lambda v: isinstance(v, list) and all(isinstance(w, list) and w and all(isinstance(i, int) for i in w) for w in v),
    "a list of token-id lists",
)
KEYS: dict[str, tuple[Any, str]] = {
    "max_new_tokens": _INT,
    "max_length": _INT,
    "num_beams": _INT,
    "length_penalty": _NUMBER,
    # attnkit's own ("gnmt" or "power"); written so that a saved model keeps its beam search.
    "length_penalty_style": (lambda v: v in ("gnmt", "power"), '"gnmt" or "power"'),
    "early_stopping": (lambda v: isinstance(v, bool) or v == "never", 'true, false or "never"'),
    "no_repeat_ngram_size": _INT,
    "do_sample": _BOOL,
    "temperature": _NUMBER,
    "top_k": _INT,
    "top_p": _NUMBER,
    "eos_token_id": _IDS,
    "pad_token_id": _INT,
    "forced_bos_token_id": _INT,
    "forced_eos_token_id": _IDS,
    "bad_words_ids": _WORDS,
    "bos_token_id": _INT,
    "decoder_start_token_id": _INT,
}
# Keys that describe the checkpoint rather than a generate() option: written, never passed.
_DESCRIPTIVE = ("bos_token_id", "decoder_start_token_id")


def read_generation_config(directory: Path, hugging_face: bool) -> dict[str, Any]:
    """``generate`` defaults from ``directory/generation_config.json`` ({} without one); a
    value of the wrong type is refused in one line naming the key, the value and the fix."""
    path = directory / GENERATION_CONFIG
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); fix or delete it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    options: dict[str, Any] = {}
    for key, (check, kind) in KEYS.items():
        value = data.get(key)
        if value is None:
            continue
        if not check(value):
            raise ValueError(f"{path}: {key} must be {kind}, got {value!r}; fix it or delete the key")
        if key not in _DESCRIPTIVE:
            options[key] = value
    if options.get("no_repeat_ngram_size") == 0:  # transformers' "off"
        del options["no_repeat_ngram_size"]
    if options.get("top_k") == 0:
        del options["top_k"]
    if options.get("early_stopping") == "never":
        options["early_stopping"] = False
    if isinstance(options.get("forced_eos_token_id"), list):
        options["forced_eos_token_id"] = options["forced_eos_token_id"][0]
    if hugging_face:
        options.setdefault("length_penalty", 1.0)
        options.setdefault("length_penalty_style", "power")
        options.setdefault("early_stopping", False)
    return options


def write_generation_config(options: dict[str, Any]) -> bytes:
    """The ``generation_config.json`` of ``options`` (its keys only)."""
    kept = {k: v for k, v in options.items() if k in KEYS}
    return (json.dumps(kept, indent=2, sort_keys=True) + "\n").encode()
