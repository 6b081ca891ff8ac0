"""Model directories on disk: attnkit's own (``config.json`` + ``model.safetensors``), read and
written atomically, and the checks every weights file passes (:mod:`attnkit.loading` reads
every kind of directory through these).

Weights are read only from safetensors, never unpickled; a load either checks out whole
(every key, shape, dtype, finite values) or raises and loads nothing.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from torch import Tensor

from attnkit.config import ModelConfig, from_dict
from attnkit.durable import fsync_dir
from attnkit.models.generation_config import GENERATION_CONFIG, read_generation_config, write_generation_config
from attnkit.nn.quantized import repack_changed

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
FORMAT = "attnkit"
FORMAT_VERSION = 1
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
CONVERT_HINT = (
    "convert it in an environment you trust: safetensors.torch.save_file(torch.load(path, weights_only=True), "
    "'model.safetensors'), or transformers' save_pretrained(..., safe_serialization=True)"
)
REWRITE_HINT = "re-save it with save_pretrained or download it again"
JSON_CAP = 64 * 2**20  # bytes; config.json and trainer_state.json are far smaller
HEADER_CAP = 100_000_000  # bytes of safetensors header: the safetensors library's own limit
# Bytes per element of the safetensors dtypes that torch reads.
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E4M3FNUZ": 1, "F8_E5M2": 1, "F8_E5M2FNUZ": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip
WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)  # copied into float32 parameters


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``: a regular file of at most :data:`JSON_CAP` bytes, strict
    JSON (no NaN or Infinity)."""
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: {path.parent} is not a complete model directory")
    if not path.is_file():
        raise ValueError(f"{path} is not a regular file; replace it with the JSON file it should be")
    if path.stat().st_size > JSON_CAP:
        raise ValueError(f"{path} is {path.stat().st_size} bytes, over the {JSON_CAP}-byte cap for a JSON file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{path} is not valid JSON ({err}); the file is corrupt, re-save or re-download it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def refuse_pickles(directory: Path) -> None:
    """Raise if ``directory`` has pickled weights and no model.safetensors; pickles are never opened."""
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles and not (directory / WEIGHTS).exists() and not (directory / WEIGHTS_INDEX).exists():
        raise ValueError(
            f"{directory} holds only pickled weights ({', '.join(pickles)}), which attnkit never loads "
            f"(unpickling can run arbitrary code); {CONVERT_HINT}"
        )


# A sharded checkpoint: the index maps each tensor to its shard (transformers' layout).
WEIGHTS_INDEX = "model.safetensors.index.json"
# The tokenizer's settings for transformers (special tokens, chat template), as it keeps them.
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"


def read_safetensors(directory: Path) -> dict[str, Tensor]:
    """All tensors of ``directory/model.safetensors``, or of the shards its
    ``model.safetensors.index.json`` names, each shard checked as a single file is, and every
    tensor of the index found in its shard and nowhere else."""
    path = directory / WEIGHTS
    index_path = directory / WEIGHTS_INDEX
    if not path.exists() and index_path.exists():
        return _read_shards(directory, index_path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: a model directory needs {WEIGHTS} (or {WEIGHTS_INDEX})")
    return load_safetensors(path)


def _read_shards(directory: Path, index_path: Path) -> dict[str, Tensor]:
    index = read_json(index_path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index_path}: needs a non-empty weight_map of tensor name -> shard file name")
    tensors: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = directory / shard
        if Path(shard).name != shard or not shard_path.exists():
            raise FileNotFoundError(f"{index_path} names the shard {shard!r}, which is not in {directory}")
        found = load_safetensors(shard_path)
        listed = {name for name, file in weight_map.items() if file == shard}
        if set(found) != listed:
            extra, missing = sorted(set(found) - listed), sorted(listed - set(found))
            raise ValueError(
                f"{shard_path} does not hold what {index_path.name} says: missing {missing[:3]}, unlisted {extra[:3]}"
            )
        tensors.update(found)
    return tensors


def shard(tensors: dict[str, Tensor], max_bytes: int) -> dict[str, dict[str, Tensor]]:
    """Tensors split, in order, into shards of at most ``max_bytes`` each (a tensor larger
    than that gets a shard of its own), named as ``transformers`` names them."""
    groups: list[dict[str, Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > max_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = tensor
        size += nbytes
    n = len(groups)
    return {f"model-{i + 1:05d}-of-{n:05d}.safetensors": group for i, group in enumerate(groups)}


def load_safetensors(path: Path) -> dict[str, Tensor]:
    """All tensors of the safetensors file ``path``, its header checked first
    (:func:`check_safetensors_header`); any problem is one ``ValueError`` naming the file."""
    check_safetensors_header(path)
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError) as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}); {REWRITE_HINT}") from None


def check_safetensors_header(path: Path) -> None:
    """Check the header of the safetensors file ``path`` before any library reads it: its
    length field within the file and under the cap, the header a JSON object, and each tensor's
    dtype known, shape non-negative integers, and byte range inside the data section, sized
    shape × dtype, overlapping no other. Reads the header only: a malformed one can otherwise
    make a reader allocate memory without bound."""
    if not path.is_file():
        raise ValueError(f"{path} is not a regular file; replace it with the safetensors file it should be")
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little")
        if len(head) < 8 or n > min(HEADER_CAP, size - 8):
            raise ValueError(_length_problem(path, head, n, size))
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{path}: the header is not valid JSON ({err}); {REWRITE_HINT}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header must be a JSON object, got {type(header).__name__}; {REWRITE_HINT}")
    data_size = size - 8 - n
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        problem = _entry_problem(entry, data_size)
        if problem:
            raise ValueError(f"{path}: tensor {name!r} {problem}; {REWRITE_HINT}")
        spans.append((*entry["data_offsets"], name))
    spans.sort()
    for (_, end, first), (begin, _, second) in itertools.pairwise(spans):
        if begin < end:
            raise ValueError(f"{path}: the bytes of tensors {first!r} and {second!r} overlap; {REWRITE_HINT}")


def _length_problem(path: Path, head: bytes, n: int, size: int) -> str:
    """Why the 8-byte header length ``n`` read as ``head`` from a ``size``-byte file is wrong."""
    if head.startswith((b"\x80", b"PK\x03\x04")):  # pickle protocol >= 2, or torch.save's zip
        return f"{path} is a pickle (torch.save) file, not safetensors; attnkit never unpickles, {CONVERT_HINT}"
    if len(head) < 8:
        return f"{path} is truncated: {size} bytes, fewer than the 8-byte header length field; {REWRITE_HINT}"
    if n > HEADER_CAP:
        return (
            f"{path}: header length {n} is over the {HEADER_CAP}-byte cap (not safetensors, or corrupt); {REWRITE_HINT}"
        )
    return f"{path} is truncated: its header length says {n} bytes but only {size - 8} follow; {REWRITE_HINT}"


def _entry_problem(entry: Any, data_size: int) -> str | None:
    """What is wrong with one tensor's header entry, or None."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        return f"has header entry {entry!r}, not {{dtype, shape, data_offsets}}"
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        return f"has unknown dtype {dtype!r} (known: {', '.join(DTYPE_SIZES)})"
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return f"has shape {shape!r}, not a list of non-negative integers"
    if (
        not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets))
        or not 0 <= offsets[0] <= offsets[1]
    ):
        return f"has data_offsets {offsets!r}, not [begin, end] with 0 <= begin <= end"
    if offsets[1] > data_size:
        return f"ends at byte {offsets[1]}, past the end of the {data_size}-byte data section (truncated file?)"
    nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
    if nbytes != offsets[1] - offsets[0]:
        span = offsets[1] - offsets[0]
        return f"of shape {shape} and dtype {dtype} needs {nbytes} bytes, but its data_offsets {offsets} span {span}"
    return None


def check_weights(
    model: torch.nn.Module, tensors: dict[str, Tensor], source: str, buffers: dict[str, Tensor] | None = None
) -> None:
    """Raise a ``ValueError`` naming the keys of ``tensors`` that do not fit ``model``'s
    parameters and the quantised ``buffers`` it holds (the first few of each kind): missing,
    unexpected, another shape, not a float dtype (a buffer: not its own dtype), NaN or Inf values."""
    params = dict(model.named_parameters())
    exact = buffers or {}
    expected = {**params, **exact}
    problems = []
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        problems.append(f"missing keys: {_first(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_first(unexpected)}")
    # Largest first: their shapes show best which of the config's sizes differ from the file's.
    for name in sorted(set(expected) & set(tensors), key=lambda n: (-expected[n].numel(), n)):
        t, p = tensors[name], expected[name]
        dtypes = (p.dtype,) if name in exact else WEIGHT_DTYPES
        if t.shape != p.shape:
            problems.append(f"{name}: shape {tuple(t.shape)} in the file, {tuple(p.shape)} in the config")
        elif t.dtype not in dtypes:
            wanted = f"{p.dtype} (its layout's)" if name in exact else f"one of {', '.join(map(str, dtypes))}"
            problems.append(f"{name}: dtype {t.dtype}, expected {wanted}")
        elif t.is_floating_point() and not bool(torch.isfinite(t).all()):
            problems.append(f"{name}: holds NaN or Inf values")
    if problems:
        raise ValueError(
            f"cannot load {source}: {_first(problems, '; ')}; "
            "the config does not describe these weights, or they are corrupt"
        )


def _first(items: list[str], sep: str = ", ", shown: int = 8) -> str:
    """The first ``shown`` of ``items``, and how many more there are."""
    more = f"{sep}... ({len(items) - shown} more)" if len(items) > shown else ""
    return sep.join(items[:shown]) + more


def load_weights(
    model: torch.nn.Module, tensors: dict[str, Tensor], source: str, buffers: dict[str, Tensor] | None = None
) -> None:
    """Copy ``tensors`` into ``model``'s parameters (and its quantised ``buffers``) after checking
    all of them (:func:`check_weights`); on any problem nothing is changed."""
    check_weights(model, tensors, source, buffers)
    copy_weights(model, tensors, buffers)


def copy_weights(model: torch.nn.Module, tensors: dict[str, Tensor], buffers: dict[str, Tensor] | None = None) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name])
        for name, b in (buffers or {}).items():
            b.copy_(tensors[name])
    if buffers:
        repack_changed(model)


def attach_tokenizer(model: torch.nn.Module, directory: Path, hugging_face: bool = False) -> None:
    """Set ``model.tokenizer`` (a ``tokenizers.Tokenizer``) from ``directory/tokenizer.json``
    where the directory has one, attnkit's or Hugging Face's (a Hugging Face one without it:
    from its vocabulary files), ``model.chat_template`` from its ``tokenizer_config.json`` and
    ``model.generation_defaults`` from its ``generation_config.json``."""
    model.generation_defaults = read_generation_config(directory, hugging_face)
    settings = directory / TOKENIZER_CONFIG
    if settings.is_file():
        template = read_json(settings).get("chat_template")
        if isinstance(template, str):
            model.chat_template = template
    from attnkit.data.tokenizer import load_tokenizer, sentencepiece_files, tokenizer_from_vocabulary

    path = directory / TOKENIZER
    if path.exists():
        model.tokenizer = load_tokenizer(path)
    elif hugging_face:  # GPT-2's vocab.json + merges.txt, BERT's vocab.txt, Marian's and T5's SentencePiece
        tokenizer = tokenizer_from_vocabulary(directory)
        if tokenizer is not None:
            model.tokenizer = tokenizer
    model.tokenizer_sources = sentencepiece_files(directory)


def tokenizer_files(model: torch.nn.Module, hugging_face: bool = False) -> dict[str, bytes]:
    """The files that give a written directory ``model``'s tokenizer: ``tokenizer.json``, the
    SentencePiece files it came with, ``special_tokens_map.json`` (:func:`special_tokens`) and
    ``tokenizer_config.json``: the tokenizer class (``transformers``' generic fast one over
    ``tokenizer.json``; beside SentencePiece files none, so that it picks Marian's or T5's by
    the model type, as before), the special tokens, ``model_max_length`` (``max_len``), decoding
    without space clean-up, and the chat template. ``hugging_face`` (an export): the
    ``tokenizer.json`` also adds the specials attnkit adds to a text itself
    (:func:`with_specials`). A model without a tokenizer writes only its chat template, if any."""
    sources = getattr(model, "tokenizer_sources", None) or {}
    files = dict(sources)
    tokenizer = model.tokenizer
    template = getattr(model, "chat_template", None)
    settings: dict[str, Any] = {}
    if tokenizer is not None:
        written = with_specials(tokenizer, model.config) if hugging_face else tokenizer
        files[TOKENIZER] = written.to_str().encode()
        specials = special_tokens(tokenizer, model.config)
        files[SPECIAL_TOKENS_MAP] = _json_bytes(specials)
        settings = {} if sources else {"tokenizer_class": "PreTrainedTokenizerFast"}
        settings |= {**specials, "model_max_length": model.config.max_len, "clean_up_tokenization_spaces": False}
    if template:
        settings["chat_template"] = template
    if settings:
        files[TOKENIZER_CONFIG] = _json_bytes(settings)
    return files


def special_tokens(tokenizer: Tokenizer, cfg: ModelConfig) -> dict[str, str]:
    """The special tokens of ``cfg``'s ids as ``tokenizer`` spells them, under ``transformers``'
    names; the unknown token is the tokenizer model's own (or ``<unk>``), and a BERT-family
    model's [CLS], [SEP] and [MASK] are those of its vocabulary, else attnkit's ``<s>``,
    ``</s>`` and ``<mask>``, which its masked-LM objective uses so. A token without an id is left out."""
    from attnkit.data.specials import MASK, UNK

    ids = {"bos_token": cfg.bos_token_id, "eos_token": cfg.eos_token_id, "pad_token": cfg.pad_token_id}
    tokens = {name: tokenizer.id_to_token(i) for name, i in ids.items() if i is not None}
    model = json.loads(tokenizer.to_str())["model"]
    unk_id = model.get("unk_id")  # Unigram (SentencePiece) names its unknown piece by id, BPE and WordPiece by text
    tokens["unk_token"] = tokenizer.id_to_token(unk_id) if isinstance(unk_id, int) else model.get("unk_token") or UNK
    if cfg.family == "bert":  # each the first of two that the vocabulary has, as fill_mask chooses
        choices = {"cls_token": ("[CLS]", tokens.get("bos_token")), "sep_token": ("[SEP]", tokens.get("eos_token"))}
        for name, (first, second) in {**choices, "mask_token": (MASK, "[MASK]")}.items():
            tokens[name] = first if tokenizer.token_to_id(first) is not None else second
    return {name: token for name, token in tokens.items() if token and tokenizer.token_to_id(token) is not None}


def with_specials(tokenizer: Tokenizer, cfg: ModelConfig) -> Tokenizer:
    """``tokenizer``, or a copy that adds, as it encodes a text, the specials attnkit adds itself
    where the tokenizer does not: ``<s>`` before a prompt of attnkit's own GPT (``prompt_ids``),
    ``<s>`` ... ``</s>`` around its own BERT's text (its masked-LM objective, ``fill_mask``),
    ``</s>`` after an encoder–decoder's source (``source_ids``); so that ``transformers``, which
    adds only what ``tokenizer.json`` says, reads a text as attnkit does. A pair of texts is
    joined as ``transformers``' tokenizers join one (BERT's ``[CLS] A [SEP] B [SEP]``)."""
    from attnkit.data.specials import BOS
    from attnkit.data.tokenizer import with_template

    bos, eos = cfg.bos_token_id, cfg.eos_token_id
    own = bos is not None and tokenizer.token_to_id(BOS) == bos  # attnkit's tokenizer: its objectives add <s>
    start = [bos] if own and not cfg.is_encoder_decoder else []
    ends = eos is not None and (cfg.is_encoder_decoder or (own and cfg.family == "bert"))
    return with_template(tokenizer, start, [eos] if ends else [], bert=cfg.family == "bert")


def _json_bytes(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()


def write_directory(path: str | Path, files: dict[str, bytes | dict[str, Tensor]], overwrite: bool) -> None:
    """Write ``files`` (name -> JSON/text bytes, or a tensor dict for safetensors) into a
    temporary sibling directory, fsync it, then rename it into place. An existing non-empty
    ``path`` is only replaced with ``overwrite=True``, and only once the new one is complete."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a directory; choose another path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise FileExistsError(f"{path} already exists and is not empty; pass overwrite=True or choose another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for name, content in files.items():
            target = tmp / name
            if isinstance(content, dict):
                save_file({k: v.detach().contiguous() for k, v in content.items()}, target, metadata={"format": "pt"})
            else:
                target.write_bytes(content)
            with open(target, "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(tmp)
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            path.rename(old)
        tmp.rename(path)
        fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_savable(model: torch.nn.Module, quantized: bool = False) -> None:
    """Only fp32 models are written, and with ``quantized`` (attnkit's own directory) int8, int4
    and GGUF blocks too: bf16 is a cast made at load time."""
    weights = model.weights
    if weights != "fp32" and not (quantized and weights in ("int8", "int4", "gguf")):
        raise ValueError(
            f"this model holds {weights} inference weights; save the fp32 model (load it without weights=) and "
            f"choose the format when loading: from_pretrained(path, weights={weights!r})"
        )


def save_pretrained(model: torch.nn.Module, path: str | Path, overwrite: bool = False) -> None:
    """attnkit's directory: config.json (format, version, model config) and model.safetensors.
    LoRA adapters are merged into the weights they adapt (:mod:`attnkit.nn.lora`)."""
    from attnkit.nn.lora import merged_copy
    from attnkit.nn.quantized import layouts, quantized_state

    check_savable(model, quantized=True)
    model = merged_copy(model)
    config: ModelConfig = model.config
    meta: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": config.to_dict()}
    tensors = dict(model.named_parameters())
    found = layouts(model)
    if found:  # the quantised layers as they are, loaded without quantising again
        meta["weights"] = {"format": model.weights, "layers": found}
        tensors.update(quantized_state(model))
    files: dict[str, bytes | dict[str, Tensor]] = {
        CONFIG: (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode(),
        WEIGHTS: tensors,
    }
    files.update(tokenizer_files(model))
    if model.generation_defaults:
        files[GENERATION_CONFIG] = write_generation_config(dict(model.generation_defaults))
    write_directory(path, files, overwrite)


def saved_config(directory: Path, data: dict[str, Any]) -> ModelConfig:
    """The model config of attnkit's own directory, whose ``config.json`` holds ``data``:
    its format version and fields checked."""
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{directory / CONFIG}: format_version {data.get('format_version')!r} is not one this attnkit "
            f"reads ({FORMAT_VERSION}); upgrade attnkit"
        )
    fields = ["format", "format_version", "model", "weights"]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        close = difflib.get_close_matches(unknown[0], fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"{directory / CONFIG}: unknown fields {', '.join(unknown)}{hint}; the known ones are {fields}"
        )
    try:
        return from_dict(data.get("model"))
    except ValueError as err:
        raise ValueError(f"{directory / CONFIG}: {err}") from None


def source(model: torch.nn.Module) -> tuple[str, str] | None:
    """Where ``model`` was loaded from and with which ``weights`` (as asked: ``"auto"`` chooses
    alike again), if :func:`attnkit.from_pretrained` loaded it: another process loads it the same
    way to compile its decoding steps (:mod:`attnkit.generation.background`)."""
    return model.__dict__.get("_loaded_from")


def remember_source(model: torch.nn.Module, path: str | Path, weights: str) -> None:
    """Note ``model``'s :func:`source` (not a module attribute: not in its compiled steps' key)."""
    model.__dict__["_loaded_from"] = (str(Path(path).resolve()), weights)
