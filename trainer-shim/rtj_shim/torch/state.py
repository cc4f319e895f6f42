"""What the objects handed to the Checkpointer are, and how their state is read and applied.

Kinds: ``module`` (DDP-wrapped or not; FSDP / ``fully_shard`` modules are *sharded*),
``optimizer``, ``scheduler``, ``scaler``, ``sampler`` and ``stateful`` (anything else
with ``state_dict``/``load_state_dict``). Placement: replicated state (modules,
optimizers, schedulers, scalers, samplers of a data-parallel job) is saved once; sharded
modules and their optimizers go through ``torch.distributed.checkpoint``; other Stateful
objects and every RNG are rank-local (one file per rank).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rtj_shim.torch.sampler import ResumableSampler

COMMON = "common"
RANK = "rank"
SHARDED = "sharded"

# Apply order: parameters before the optimizers that point at them, optimizers before the
# schedulers that rewrite their learning rates, RNG last (done by the Checkpointer).
_ORDER = {"module": 0, "optimizer": 1, "scheduler": 2, "scaler": 3, "sampler": 4, "stateful": 5}


@dataclass(frozen=True)
class Entry:
    name: str
    obj: Any
    kind: str
    placement: str


def unwrap(module: nn.Module) -> nn.Module:
    """The module whose state_dict has no wrapper prefix (DDP, DataParallel)."""
    while isinstance(module, nn.parallel.DistributedDataParallel | nn.DataParallel):
        module = module.module
    return module


def is_sharded_module(module: nn.Module) -> bool:
    """FSDP (wrapper) or FSDP2 (``fully_shard``: DTensor parameters)."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - builds without distributed
        return False
    if isinstance(module, FullyShardedDataParallel):
        return True
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(p, DTensor) for p in module.parameters())


def kind_of(obj: Any) -> str:
    if isinstance(obj, nn.Module):
        return "module"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(
        obj, torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau
    ):
        return "scheduler"
    if isinstance(obj, torch.amp.GradScaler):
        return "scaler"
    if isinstance(obj, ResumableSampler):
        return "sampler"
    if callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    ):
        return "stateful"
    raise TypeError(
        f"{type(obj).__qualname__} has no state_dict()/load_state_dict(); the Checkpointer "
        "saves modules, optimizers, schedulers, grad scalers and Stateful objects"
    )


def classify(objects: Mapping[str, Any], rank_local: Iterable[str] = ()) -> list[Entry]:
    """Entries in apply order; a module or optimizer is sharded if any module is sharded."""
    local = set(rank_local)
    unknown = local - set(objects)
    if unknown:
        raise KeyError(f"rank_local names {sorted(unknown)} are not in the objects")
    kinds = {name: kind_of(obj) for name, obj in objects.items()}
    sharded_params: set[int] = set()
    for name, obj in objects.items():
        if kinds[name] == "module" and is_sharded_module(obj):
            sharded_params.update(id(p) for p in obj.parameters())
    entries = []
    for name, obj in objects.items():
        kind = kinds[name]
        if name in local or kind == "stateful":
            placement = RANK
        elif (kind == "module" and is_sharded_module(obj)) or (
            kind == "optimizer"
            and any(id(p) in sharded_params for g in obj.param_groups for p in g["params"])
        ):
            placement = SHARDED
        else:
            placement = COMMON
        entries.append(Entry(name, obj, kind, placement))
    entries.sort(key=lambda e: _ORDER[e.kind])
    return entries


def state_of(entry: Entry) -> Any:
    if entry.kind == "module":
        return unwrap(entry.obj).state_dict()
    return entry.obj.state_dict()


def apply_state(entry: Entry, state: Any) -> None:
    if entry.kind == "module":
        unwrap(entry.obj).load_state_dict(state)
    else:
        entry.obj.load_state_dict(state)


def module_for_optimizer(optimizer: torch.optim.Optimizer, entries: list[Entry]) -> nn.Module:
    """The (sharded) module whose parameters the optimizer updates."""
    wanted = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for entry in entries:
        if entry.kind == "module":
            params = {id(p) for p in entry.obj.parameters()}
            if wanted <= params:
                return unwrap(entry.obj)
    raise ValueError("no module among the objects owns all of this optimizer's parameters")


def optimizer_param_ptrs(entries: list[Entry]) -> set[int]:
    """Storage addresses of every optimizer's parameters and state (mutated only by step())."""
    ptrs: set[int] = set()
    for entry in entries:
        if entry.kind != "optimizer":
            continue
        opt: torch.optim.Optimizer = entry.obj
        for group in opt.param_groups:
            for p in group["params"]:
                ptrs.add(p.data_ptr())
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    ptrs.add(v.data_ptr())
    return ptrs
