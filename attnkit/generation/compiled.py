"""The decoding step compiled: lines 4–6 of [alg:att-decode] for one new token per row as one
fixed-shape graph (``torch.compile``) over the buffers of a
:class:`~attnkit.nn.cache.StaticKVCache`.

The eager step runs several hundred small kernels a token (norms, attention over the cache,
views, residual adds) with Python between them; at batch 1 they cost about as much as the
weight reads that bound the step. Compiled, inductor fuses them into a few loops, and with
``max_autotune`` it also picks, shape by shape, between torch's int8 matrix-vector kernel and
its own generated one.

A step is compiled once per model structure, rows, cache capacity (a power of two, so a few
sizes cover every request) and source length bucket (encoder–decoder), and kept on disk
(:mod:`attnkit.generation.stored`): a later process loads it in seconds; the first call's
seconds, compiled or loaded, are logged and kept in :data:`COMPILES`. A step attends over the
whole capacity (the unfilled positions masked), so a request for many more new tokens than it
uses costs attention over positions it never fills.

The step is compiled ahead of time without dynamo's guards: nothing checks its arguments at a
call (on GPT-2 its 3,700 guards cost 0.6 ms of a 6.3 ms token), and attnkit chooses the step by
its own key instead, each call: the step function, the arguments' shapes and the model's
structure (:func:`~attnkit.generation.stored.signature`, taken once per decode by
:func:`check_weights`). The weights are the graph's inputs, read at every call: a model whose
weights changed in place decodes with its new ones, and two models of one structure share a
step's file but each calls it with its own weights.

Readying a step costs seconds (a load) to minutes (a compile), which a short decode never earns
back. ``compile="auto"`` (the default of :func:`~attnkit.generation.generate`) decides as in the
ski-rental problem: a layout decodes eagerly, its eager seconds counted in its :class:`Account`,
until they reach what loading its step costs (:data:`LOAD_SECONDS`); then, if the step is on the
disk, the decode moves onto it. A job shorter than that is never slower than eager, and a longer
one never costs more than twice its best. A step not on the disk is compiled by a background
process for a model that knows its source (:mod:`attnkit.generation.background`), and picked up
when its file appears; for a model built in this process, in this process once the eager
seconds reach :data:`COMPILE_SECONDS`.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.generation import stored
from attnkit.machine import compile_cache

log = logging.getLogger(__name__)

# Kernels chosen by measuring them.
MODE = "max-autotune-no-cudagraphs"
# The autotuner writes a table of every kernel it timed to stderr: not a user's business. With the
# weights as the graph's inputs (370 of them in GPT-2 int8's step), inductor's Python wrapper
# around the kernels cost 1.5 ms of a 7.8 ms token: its C++ wrapper instead (cpp_wrapper), and no
# size and stride asserts on every input at every call (attnkit's key has chosen the step by
# exactly those layouts). GPT-2 int8 in one process: 121 tok/s with both, 134 without the asserts,
# 180 with the C++ wrapper too (docs/performance.md).
PATCHES = {
    "autotune_num_choices_displayed": 0,
    "max_autotune_report_choices_stats": False,
    "size_asserts": False,
    "cpp_wrapper": True,
}
SMALLEST = 64  # the smallest cache capacity
# What readying a step costs, for compile="auto" (measured on GPT-2 124M int8, 2-core Intel Xeon
# and AMD EPYC; docs/performance.md): loading it from the disk 1.5-3.3 s in a new process,
# compiling it 14-45 s.
LOAD_SECONDS = 3.0
COMPILE_SECONDS = 30.0


@dataclass(frozen=True)
class Compile:
    """One step made ready: what for, the seconds its first call took, and whether it was
    loaded from the disk (else compiled)."""

    what: str
    seconds: float
    loaded: bool = False


@dataclass
class Account:
    """One layout's decoding under ``compile="auto"``: the eager seconds it has paid, where its
    step would be kept (known at the first look, when they reach :data:`LOAD_SECONDS`), and
    whether a background process was asked to compile it (:mod:`attnkit.generation.background`)."""

    paid: float = 0.0
    path: Path | None = None
    looked: bool = False
    background: bool = False

    def due(self) -> bool:
        """Whether the eager seconds paid reach what readying the step costs: a load where its file
        is on disk (a stat); a compile where not, unless it is being compiled in the background."""
        if self.path is not None and self.path.is_file():
            return self.paid >= LOAD_SECONDS
        return not self.background and self.paid >= COMPILE_SECONDS


COMPILES: list[Compile] = []
_generation = 0  # forget() starts another: the steps of every earlier one are dropped


class _Steps:
    """A model's steps, by attnkit's key (the module docstring), on the model itself: they live
    as long as it does. A copy of the model (``copy.copy``, ``copy.deepcopy``) starts its own."""

    def __init__(self, owner: nn.Module) -> None:
        self.owner, self.generation = id(owner), _generation
        self.by_key: dict[tuple[Any, ...], Callable[..., Tensor]] = {}
        self.accounts: dict[tuple[Any, ...], Account] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None


def compiler() -> str | None:
    """The C++ compiler inductor uses on the CPU (``$CXX``, else ``g++``), if there is one."""
    return shutil.which(os.environ.get("CXX", "g++"))


def bucket(n: int, limit: int | None = None, least: int = SMALLEST) -> int:
    """The power of two (at least ``least``) that holds ``n`` positions, or ``limit`` (the
    model's context) when that is smaller and still holds them."""
    size = max(least, 1 << (n - 1).bit_length())
    return size if limit is None or size <= limit or n > limit else limit


def _shape(arg: Any) -> Any:
    if isinstance(arg, Tensor):
        return tuple(arg.shape), arg.dtype, arg.stride()
    if hasattr(arg, "capacity"):  # a cache: its capacity and beams per example
        return arg.capacity, getattr(arg, "groups", 1)
    return None if arg is None else type(arg).__name__


def dropout_on(model: nn.Module) -> bool:
    """Whether ``model`` would drop activations: a module in training mode with a dropout
    probability above 0 (an ``nn.Dropout``, or attention's own ``dropout``)."""
    for module in model.modules():
        p = module.p if isinstance(module, nn.Dropout) else getattr(module, "dropout", None)
        if module.training and isinstance(p, float) and p > 0:
            return True
    return False


def check_weights(model: nn.Module) -> None:
    """Before a compiled decode: refuse a model whose dropout is on (the step decodes in
    inference mode; traced in training mode, dropout's random masks break the graph into pieces
    that run slower than eager), and take the model's structure for the steps' key (a module's
    attribute or a weight's dtype changed since the last decode: other steps)."""
    if dropout_on(model):
        raise ValueError(
            "the compiled decoding step runs in inference mode, and this model is in training mode with dropout on: "
            "call model.eval() before decoding (or decode eagerly, compile=False)"
        )
    model.__dict__["_step_signature"] = stored.signature(model)


def forget() -> None:
    """Drop every compiled decoding step held in memory (those on disk stay); the next compiled
    decode loads or compiles them again."""
    global _generation
    _generation += 1


def _steps(model: nn.Module) -> _Steps:
    steps = model.__dict__.get("_compiled_steps")
    if steps is None or steps.owner != id(model) or steps.generation != _generation:
        steps = model.__dict__["_compiled_steps"] = _Steps(model)
    return steps


def _key(fn: Callable[..., Tensor], model: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (fn, model.__dict__.get("_step_signature"), tuple(_shape(a) for a in args))


def loses_the_gemm(model: nn.Module, rows: int) -> bool:
    """Whether a step of ``rows`` rows would be slower compiled than eager: from
    :data:`~attnkit.kernels.gemm.MANY_ROWS` rows on, eager int8 and int4 products go through
    PyTorch's int8 GEMM, which the compiled step cannot trace; it multiplies through attnkit's
    block kernel instead, more than twice as slow on a Marian-shaped batch of 32 x 4 beams
    (benchmarks/results/compiled-beams-marian-2026-12-06.md)."""
    from attnkit.kernels import gemm
    from attnkit.nn.quantized import layouts

    return rows >= gemm.MANY_ROWS and bool(layouts(model)) and gemm.engine() is not None


def auto_allowed() -> bool:
    """Whether ``compile="auto"`` may compile at all in this process (``ATTNKIT_AUTO_COMPILE=0``:
    it stays eager)."""
    return os.environ.get("ATTNKIT_AUTO_COMPILE", "1") != "0"


def can_compile(model: nn.Module) -> bool:
    """Whether ``compile="auto"`` may compile ``model``'s steps: in inference mode (no dropout), on
    the CPU (the steps' settings are the CPU's), with a C++ compiler for inductor, and not turned
    off for the process (``ATTNKIT_AUTO_COMPILE=0``: the test suite's setting)."""
    if not auto_allowed():
        return False
    on_cpu = all(t.device.type == "cpu" for t in model.parameters())
    return on_cpu and not dropout_on(model) and compiler() is not None


def account(model: nn.Module, layout: tuple[Any, ...]) -> Account:
    """The :class:`Account` of ``layout`` (what names a step but its arguments' exact layouts) for
    ``model``, kept as long as its steps are."""
    return _steps(model).accounts.setdefault(layout, Account())


def ready(fn: Callable[..., Tensor], model: nn.Module, *args: Any) -> bool:
    """Whether the step for ``fn`` at these arguments is in memory (a call runs it at once)."""
    return _key(fn, model, args) in _steps(model).by_key


def kept_at(fn: Callable[..., Tensor], model: nn.Module, *args: Any) -> Path | None:
    """Where the step for ``fn`` at these arguments is kept on the disk (None: no directory)."""
    return _where(fn, model, args)[0]


def _where(fn: Callable[..., Tensor], model: nn.Module, args: tuple[Any, ...]) -> tuple[Path | None, str]:
    """The step's file (None: no directory) and its description (the file's head)."""
    directory = compile_cache() or os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # The mode by name, not its options: naming them imports inductor (1 s, on a first request's
    # path), and what a mode means is torch's version's, which the key holds.
    description = stored.describe(fn, model, args, {"mode": MODE, **PATCHES})
    return None if directory is None else stored.path_for(directory, description), description


def call(fn: Callable[..., Tensor], model: nn.Module, *args: Any) -> Tensor:
    """``fn(model, *args)`` through its compiled step; the first call of a shape loads the step
    from the disk or compiles it (timed and logged). The step writes the cache among ``args`` in
    place."""
    steps = _steps(model)
    key = _key(fn, model, args)
    step = steps.by_key.get(key)
    if step is not None:
        return step(*args)
    start = time.perf_counter()
    step, out, loaded = _prepare(fn, model, args)
    steps.by_key[key] = step
    seconds = time.perf_counter() - start
    rows, cache = args[0].shape[0], next(a for a in args if hasattr(a, "capacity"))
    beams = f" ({getattr(cache, 'groups', 1)} beams each)" if getattr(cache, "groups", 1) > 1 else ""
    what = f"{type(model).__name__}, {rows} row{'s' if rows > 1 else ''}{beams}, {cache.capacity} cached positions"
    COMPILES.append(Compile(what, seconds, loaded))
    log.info("torch.compile: the decoding step for %s %s in %.1f s", what, "loaded" if loaded else "compiled", seconds)
    return out


def _prepare(fn: Callable[..., Tensor], model: nn.Module, args: tuple[Any, ...]) -> tuple[Any, Tensor, bool]:
    """The step for ``fn`` at these arguments, loaded from the disk or compiled (and kept there),
    its first output, and whether it was loaded."""
    path, description = _where(fn, model, args)
    step = None if path is None else stored.load(path, description, model)
    if step is not None:
        try:
            return step, step(*args), True
        except Exception as error:
            log.warning("the compiled step %s failed at its first call (%s); compiling it again", path, error)
    step = _compile(fn, model, args, torch._inductor.list_mode_options(MODE))
    if path is not None:
        stored.save(step, path, description, model)
    return step, step(*args), False


def _compile(fn: Callable[..., Tensor], model: nn.Module, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    import torch._inductor.config

    # No guards: attnkit's key chooses the step (the module docstring).
    options = {**options, "guard_filter_fn": lambda entries: [False] * len(entries)}
    compiled = torch.compile(lambda *a: fn(model, *a), fullgraph=True, dynamic=False, options=options)
    with torch._inductor.config.patch(PATCHES), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "TypedStorage is deprecated")  # inductor's own autotuning uses it
        try:
            return compiled.aot_compile((args, {}))
        except Exception as error:
            if "C++ compiler" not in str(error):
                raise
            raise ValueError(
                "compiling the decoding step needs a working C++ compiler (torch.compile's inductor on the CPU): "
                "install g++, or decode without compile=True / --compile"
            ) from error
