"""Compiled decoding steps kept on disk, so that a later process loads a step in seconds instead
of compiling it again (:mod:`attnkit.generation.compiled`).

A step is compiled ahead of time (``torch.compile(...).aot_compile``) with none of dynamo's
guards, and saved with ``save_compiled_function``: the model stays outside the file (passed in
again at the load: the step reads its weights at every call, so a model of other weights decodes
its own tokens through the same file). Without guards nothing in the file checks what it is
called with, so the file's name is a hash of everything the graph was traced from, which is
also written at its head and compared before anything in it is read:

* torch's version, attnkit's source, the CPU (model, the flags that decide kernels), the kernel
  settings of the environment, the threads, inductor's mode and options;
* the step function, and the model's structure: each module's type and public attributes (a
  flag, a size, the config), each weight's name, shape, dtype, device, strides and sharing;
* the step's arguments: each tensor's shape, dtype, device and strides (of the cache, those of
  its buffers, and its capacity).

A changed model, torch or CPU thus names another file, never a stale one. A file that fails
its header or its load is ignored with one line and compiled again; a directory that cannot be
written keeps the step in memory, with one line. The directory holds code that runs (the
compiled kernels, and pickled steps, as inductor's own cache does): one that other users can
write to is not read from.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
import logging
import os
import stat
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.durable import replace_file
from attnkit.machine import code_identity, cpu_identity

log = logging.getLogger(__name__)

FORMAT = b"attnkit compiled step 1\n"
SUFFIX = ".step"
# Environment variables read while a step is traced (kernel choices) or by the kernels it calls.
SETTINGS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "FBGEMM_ENABLE_INSTRUCTIONS")


def _value(value: Any) -> str:
    """A module attribute as text: plain values, dataclasses and enums as they are, functions by
    name, tensors by layout, anything else by its type."""
    if isinstance(value, (bool, int, float, str, type(None), enum.Enum)) or dataclasses.is_dataclass(value):
        return repr(value)
    if isinstance(value, Tensor):
        return _tensor(value)
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_value(v) for v in value) + ")"
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _tensor(t: Tensor) -> str:
    return f"{tuple(t.shape)} {t.dtype} {t.device} {t.stride()}"


def signature(model: nn.Module) -> str:
    """What a step traced through ``model`` depends on, other than the weights' values: a hash
    of its modules' types and public attributes and its weights' layouts and sharing."""
    lines = []
    for name, module in model.named_modules():
        attributes = sorted((k, _value(v)) for k, v in vars(module).items() if not k.startswith("_"))
        lines.append(f"{name} {type(module).__module__}.{type(module).__qualname__} {module.training} {attributes}")
    first: dict[int, str] = {}
    tensors = (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False))
    for name, t in tensors:
        shared = first.setdefault(t.data_ptr(), name) if t.numel() else name
        lines.append(f"{name} {_tensor(t)} {t.requires_grad} {shared}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:24]


def _argument(arg: Any) -> str:
    """A step's argument as text: a tensor's layout; a cache's capacity and its buffers' layouts
    (not its counters, which change every step and which the step reads from tensors)."""
    if arg is None or isinstance(arg, Tensor):
        return "None" if arg is None else _tensor(arg)
    parts = [f"{type(arg).__qualname__} capacity={getattr(arg, 'capacity', None)}"]
    parts += [f"{path}: {_tensor(t)}" for path, t in _tensors(arg, "")]
    return "; ".join(parts)


def _tensors(obj: Any, path: str, depth: int = 4) -> Iterator[tuple[str, Tensor]]:
    """The tensors an object holds (in its attributes, lists and nested objects), by path."""
    if isinstance(obj, Tensor):
        yield path, obj
    elif depth and isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _tensors(item, f"{path}[{i}]", depth - 1)
    elif depth and hasattr(obj, "__dict__") and not isinstance(obj, (nn.Module, type, types.FunctionType)):
        for name, value in sorted(vars(obj).items()):
            yield from _tensors(value, f"{path}.{name}", depth - 1)


def describe(fn: Callable[..., Any], model: nn.Module, args: tuple[Any, ...], options: dict[str, Any]) -> str:
    """Everything a compiled step depends on but the weights' values, as text (the file's header)."""
    lines = [
        f"torch {torch.__version__}",
        f"attnkit source {code_identity()}",
        f"cpu {cpu_identity()}",
        f"threads {torch.get_num_threads()}",
        f"settings {[(k, os.environ.get(k)) for k in SETTINGS]}",
        f"attnkit settings {sorted((k, v) for k, v in os.environ.items() if k.startswith('ATTNKIT_'))}",
        f"inductor {sorted((k, repr(v)) for k, v in options.items())}",
        f"step {fn.__module__}.{fn.__qualname__}",
        f"model {signature(model)}",
        *(f"argument {_argument(arg)}" for arg in args),
    ]
    return "\n".join(lines)


def path_for(directory: str, description: str) -> Path:
    return Path(directory) / "steps" / (hashlib.sha256(description.encode()).hexdigest()[:32] + SUFFIX)


def _private(directory: Path) -> bool:
    """Whether only this user can write ``directory`` (and the one above it)."""
    for d in (directory, directory.parent):
        info = d.stat()
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def load(path: Path, description: str, model: nn.Module) -> Callable[..., Tensor] | None:
    """The step kept at ``path`` for ``description``, bound to ``model``; None where there is none,
    or where it cannot be used (said in one line: it is compiled again)."""
    import torch._inductor.config

    if not path.is_file():
        return None
    if not _private(path.parent):
        log.warning("the compiled step %s is in a directory other users can write: not loaded, compiling it", path)
        return None
    try:
        data = path.read_bytes()
        head = FORMAT + description.encode() + b"\0"
        if not data.startswith(head):
            raise ValueError("its header does not describe this model, torch, CPU and shapes")
        with torch._inductor.config.patch({"cpp.vec_isa_ok": True}):  # the file was compiled on this CPU
            return torch.compiler.load_compiled_function(io.BytesIO(data[len(head) :]), external_data={"model": model})
    except Exception as error:  # a torn, foreign or corrupted file: never used
        log.warning("the compiled step %s cannot be used (%s: %s); compiling it again", path, type(error).__name__,
                    str(error).splitlines()[0] if str(error) else "")  # fmt: skip
        return None


def save(step: Any, path: Path, description: str, model: nn.Module) -> None:
    """Keep ``step`` at ``path`` (atomically: a crash leaves the old file or none); where it cannot
    be written, say so in one line and keep it in memory only."""
    try:
        payload = type(step).serialize(step, {"model": model}).serialized_data
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_file(path, FORMAT + description.encode() + b"\0" + payload)
    except Exception as error:
        log.warning("the compiled step cannot be kept in %s (%s: %s); it stays in memory for this process",
                    path.parent, type(error).__name__, error)  # fmt: skip
