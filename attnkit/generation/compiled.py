"""The decoding step compiled: lines 4–6 of [alg:att-decode] for one new token per row as one
fixed-shape graph (``torch.compile``) over the buffers of a
:class:`~attnkit.nn.cache.StaticKVCache`.

The eager step runs several hundred small kernels a token (norms, attention over the cache,
views, residual adds) with Python between them; at batch 1 they cost about as much as the
weight reads that bound the step. Compiled, inductor fuses them into a few loops, and with
``freezing`` (the weights become constants of the graph) and ``max_autotune`` it also picks,
shape by shape, between torch's int8 matrix-vector kernel and its own generated one.

A graph is compiled once per model, rows, cache capacity (a power of two, so a few sizes
cover every request) and source length bucket (encoder–decoder), and reused by every later
call with those shapes; the first call's seconds are logged and kept in :data:`COMPILES`.
A step attends over the whole capacity (the unfilled positions masked), so a request for many
more new tokens than it uses costs attention over positions it never fills.
Freezing copies the weights into the graph: change a model's weights after a compiled
decode and the next one compiles again (:func:`check_weights` compares the weights' versions,
storage and a sample of their elements; :func:`forget` drops every graph). Graphs of models
no longer used stay in dynamo's cache, holding their weights, until :func:`forget`.

dynamo checks its guards before every step: on GPT-2 some 3,700 of them read the model's modules
(each attribute, hook dict and weight it traced), 0.6 ms of a 6.3 ms token, 1.7 ms in all
measured end to end (int4, AVX512-BF16 class). A step keeps one of them, the identity of one of
the model's weights (which ties each graph to its own model), and :func:`check_weights` checks
the rest once per decode instead: the weights as above, and each module's attributes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.machine import compile_cache

log = logging.getLogger(__name__)

# Kernels chosen by measuring them.
MODE = "max-autotune-no-cudagraphs"
# The weights as constants of the graph (inductor's freezing, which takes effect only as a config
# patch around the call that compiles, not as an option): a graph that takes them as inputs
# checks and passes all of them at every step, SmolLM2's 934 tensors in blocks costing it 10-13
# ms a token against 8.3-8.9 frozen. Freezing was once blamed for a corrupted heap that came
# from inductor's cache shared between processes of different ``ATEN_CPU_CAPABILITY``
# (:func:`attnkit.machine.compile_cache`). The autotuner writes a table of every
# kernel it timed to stderr: not a user's business.
PATCHES = {"freezing": True, "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
SMALLEST = 64  # the smallest cache capacity
RECOMPILE_LIMIT = 64  # graphs of the step kept, over all models and shapes


@dataclass(frozen=True)
class Compile:
    """One compiled step: what it was compiled for, and the seconds its first call took."""

    what: str
    seconds: float


COMPILES: list[Compile] = []
_seen: set[tuple[Any, ...]] = set()  # (model, step, shapes) compiled
_weights: dict[int, tuple[Any, ...]] = {}  # id(model) -> the fingerprint of the weights its graphs hold


def compiler() -> str | None:
    """The C++ compiler inductor uses on the CPU (``$CXX``, else ``g++``), if there is one."""
    return shutil.which(os.environ.get("CXX", "g++"))


def bucket(n: int, limit: int | None = None, least: int = SMALLEST) -> int:
    """The power of two (at least ``least``) that holds ``n`` positions, or ``limit`` (the
    model's context) when that is smaller and still holds them."""
    size = max(least, 1 << (n - 1).bit_length())
    return size if limit is None or size <= limit or n > limit else limit


SAMPLED = 16  # elements of each weight read to notice a write that skips the version counter


@torch.no_grad()
def _fingerprint(model: nn.Module) -> tuple[Any, ...]:
    """What the model's weights are, cheaply: each tensor's identity, storage, dtype, device,
    in-place write count, and a few of its elements (a write through ``.data`` does not count
    as a version)."""
    prints = []
    for t in (*model.parameters(), *model.buffers()):
        flat = t.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // SAMPLED)][:SAMPLED].float().tolist()
        prints.append((id(t), t.data_ptr(), t.dtype, t.device, t._version, *sample))
    return tuple(prints)


def _attributes(model: nn.Module) -> tuple[Any, ...]:
    """Each module's public attributes (a flag, a size, the config): plain values and dataclasses
    as they are, anything else by identity (a function, a tokenizer), tensors by storage and
    version."""
    prints = []
    for module in model.modules():
        for name, value in vars(module).items():
            if name.startswith("_"):
                continue
            if isinstance(value, Tensor):
                value = (value.data_ptr(), value._version)
            elif not (isinstance(value, (bool, int, float, str, type(None))) or dataclasses.is_dataclass(value)):
                value = id(value)
            prints.append((id(module), name, value))
    return tuple(prints)


def _keep_guards(entries: list[Any]) -> list[bool]:
    """dynamo's ``guard_filter_fn``: which guards a compiled step checks at every call (the module
    docstring). All but those on the model's modules, of which the first identity of a weight;
    all of them where there is none (nothing else would tell this model's graph from another's)."""
    on_modules = [entry.orig_guard.source.is_unspecialized_nn_module() for entry in entries]
    identity = next((i for i, entry in enumerate(entries) if on_modules[i] and entry.guard_type == "ID_MATCH"), None)
    if identity is None:
        return [True] * len(entries)
    return [not on_module or i == identity for i, on_module in enumerate(on_modules)]


def _shape(arg: Any) -> Any:
    if isinstance(arg, Tensor):
        return tuple(arg.shape), arg.dtype
    return getattr(arg, "capacity", None if arg is None else type(arg).__name__)  # a cache: its capacity


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
    that run slower than eager), and forget every compiled graph if ``model``'s weights or its
    modules' attributes changed since its graphs were compiled (they hold the old weights as
    constants, and their guards do not read the modules: :func:`_keep_guards`)."""
    if dropout_on(model):
        raise ValueError(
            "the compiled decoding step runs in inference mode, and this model is in training mode with dropout on: "
            "call model.eval() before decoding (or decode eagerly, compile=False)"
        )
    now, compiled_with = (_fingerprint(model), _attributes(model)), _weights.get(id(model))
    if compiled_with is not None and compiled_with != now:
        log.info("the model's weights or attributes changed since its decoding step was compiled: it compiles again")
        forget()
    _weights[id(model)] = now


def forget() -> None:
    """Drop every compiled decoding step (and dynamo's other graphs: it keeps them per function,
    across wrappers, so only a reset drops them); the next compiled decode compiles again."""
    torch._dynamo.reset()
    _seen.clear()
    _weights.clear()


def call(fn: Callable[..., Tensor], model: nn.Module, *args: Any) -> Tensor:
    """``fn(model, *args)`` through its compiled graph; the first call of a shape compiles it
    (timed and logged). The step writes the cache among ``args`` in place."""
    import torch._inductor.config

    # Kept on the model, to live as long as it does; keyed by its id too, because a copy of the
    # model (copy.deepcopy) copies this dict, and its lambdas decode the original.
    steps = model.__dict__.setdefault("_compiled_steps", {})
    compiled = steps.get((id(model), fn))
    if compiled is None:
        options = {**torch._inductor.list_mode_options(MODE), "guard_filter_fn": _keep_guards}
        compiled = steps[(id(model), fn)] = torch.compile(lambda *a: fn(model, *a), dynamic=False, options=options)
    weight = next(model.parameters())
    key = (id(model), fn, weight.dtype, weight.device, tuple(_shape(a) for a in args))
    if key in _seen:
        return compiled(*args)
    compile_cache()
    start = time.perf_counter()
    # Every model's step is one function to dynamo, whose graphs it counts together: beyond
    # recompile_limit (8) it would run the step eagerly, unannounced.
    limit = torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT)
    with limit, torch._inductor.config.patch(PATCHES), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "TypedStorage is deprecated")  # inductor's own autotuning uses it
        try:
            out = compiled(*args)
        except Exception as error:
            if "C++ compiler" not in str(error):
                raise
            raise ValueError(
                "compiling the decoding step needs a working C++ compiler (torch.compile's inductor on the CPU): "
                "install g++, or decode without compile=True / --compile"
            ) from error
    seconds = time.perf_counter() - start
    rows, capacity = args[0].shape[0], next(a.capacity for a in args if hasattr(a, "capacity"))
    what = f"{type(model).__name__}, {rows} row{'s' if rows > 1 else ''}, {capacity} cached positions"
    COMPILES.append(Compile(what, seconds))
    log.info("torch.compile: the decoding step for %s compiled in %.1f s", what, seconds)
    _seen.add(key)
    return out
