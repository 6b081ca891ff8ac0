"""Scale-out on PyTorch's own engines: DistributedDataParallel, or FSDP2 (``fully_shard``),
under ``torchrun``. gloo on CPU, NCCL on GPU. Only rank 0 writes files."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from attnkit.machine import cpu_class, native_bf16

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    device: torch.device
    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"train.device={name!r} is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device={name!r} but no CUDA device is available; use 'cpu' or 'auto'")
    return device


def resolve_precision(precision: str, device: torch.device, cpu: str = "auto") -> str:
    """``train.precision`` made concrete: "auto" becomes bf16 where it is native, else fp32;
    fp16 needs a GPU. ``cpu``: the ``train.cpu_class`` a CPU is taken for."""
    return precision_choice(precision, device, cpu)[0]


def precision_choice(precision: str, device: torch.device, cpu: str = "auto") -> tuple[str, str]:
    """``train.precision`` made concrete, and why, in words for the user: e.g. ("fp32", "AVX2
    without native bf16: fp32 (train.precision=auto; it emulates bf16, slower than fp32)")."""
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("train.precision=fp16 needs a CUDA device; on a CPU use bf16 (or auto)")
    taken = cpu_class(cpu)  # validated on every device: a bad class is refused before a run starts
    if device.type == "cuda":
        name = f"CUDA ({torch.cuda.get_device_name(device)})"
        native = native_bf16(device)
        what = "computes bf16 natively" if native else "has no bf16"
    else:
        name, native = taken.describe(), taken.native_bf16
        what = "computes bf16 natively" if native else "emulates bf16, slower than fp32"
    if precision == "auto":
        chosen = "bf16" if native else "fp32"
        return chosen, f"{name}: {'bf16 autocast' if native else 'fp32'} (train.precision=auto; it {what})"
    return precision, f"{name}: {precision}, as train.precision asks (it {what})"


def init_world(device_name: str) -> World:
    """The process group when launched by torchrun (WORLD_SIZE > 1), else a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    device = pick_device(device_name)
    if size == 1:
        return World(device=device)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return World(device, rank, size)


def close_world(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, world: World, strategy: str) -> nn.Module:
    """DDP or FSDP2 around ``model`` (already on ``world.device``); the model itself when alone."""
    if not world.distributed:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for stack in (getattr(model, name) for name in ("encoder", "decoder") if hasattr(model, name)):
            for layer in stack.layers:
                fully_shard(layer)  # one unit per layer: gathered just before it runs
        return fully_shard(model)
    device_ids = [world.device.index] if world.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def on_main(world: World, fn: Callable[[], T]) -> T | None:
    """``fn()`` on rank 0 alone while the other ranks wait (rank 0 prepares what they read):
    its result on rank 0, None elsewhere. An exception on rank 0 stops every rank."""
    if not world.distributed:
        return fn()
    result, error = None, None
    if world.is_main:
        try:
            result = fn()
        except Exception as e:  # raised below, once the other ranks know
            error = e
    if any_rank(error is not None, world):
        if error is not None:
            raise error
        raise RuntimeError("rank 0 failed (its message says why); stopping this rank too")
    return result


def all_sum(values: list[float], world: World) -> list[float]:
    """Sum numbers over ranks (token counts, loss sums)."""
    if not world.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=world.device)
    dist.all_reduce(t)
    return t.tolist()


def any_rank(flag: bool, world: World) -> bool:
    """True on every rank when ``flag`` is true on one (e.g. the time budget ran out)."""
    if not world.distributed:
        return flag
    t = torch.tensor([float(flag)], device=world.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer, names: list[str]) -> tuple[dict[str, Tensor], dict]:
    """Unsharded model and optimiser state on CPU, keyed by the bare model's parameter names
    (``names``: one per distinct parameter, so tied weights appear once) whatever the wrapper;
    so a checkpoint written at one world size resumes at any other. Collective under
    torchrun: every rank calls it, rank 0 saves."""
    model_state = get_model_state_dict(model, options=_FULL)
    return {n: model_state[n] for n in names if n in model_state}, get_optimizer_state_dict(
        model, optimizer, options=_FULL
    )


def load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a full optimiser state written by :func:`full_state` into a (possibly wrapped)
    model's optimiser. A parameter that never had a gradient (BERT's pooler under the masked LM)
    has no state in it, as it had none when saved: not strict about those (the model's own
    state, loaded strictly before, already refuses another model)."""
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True, strict=False))
