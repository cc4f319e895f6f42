"""What the objects handed to the Checkpointer are, and how their state is read and applied.

Kinds: ``module`` (DDP-wrapped or not; FSDP / ``fully_shard`` modules are *sharded*),
``optimizer``, ``scheduler``, ``scaler``, ``sampler``, ``stateful`` (anything else with
``state_dict``/``load_state_dict``, DCP's ``Stateful`` protocol), ``generator`` (NumPy,
torch and ``random.Random`` generators, restored in place) and ``value`` (a plain value:
numbers, strings, tensors, NumPy arrays, containers of them; :mod:`rtj_shim.torch.plain`).

Placement, per object: *replicated* (saved once, restored on any world size) or
*rank-local* (one copy per rank, restored on the same world size only). Defaults: modules,
optimizers, schedulers, scalers, samplers and plain values are replicated; other Stateful
objects and generators are rank-local. ``rank_local``/``replicated`` name objects that
differ from their default. Sharded modules and their optimizers go through
``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rtj_shim.torch.elastic_batches import ElasticBatchSampler
from rtj_shim.torch.plain import (
    generator_state,
    is_generator,
    is_value,
    put_back,
    set_generator_state,
)
from rtj_shim.torch.sampler import ResumableSampler

COMMON = "common"
RANK = "rank"
SHARDED = "sharded"

# Apply order: parameters before the optimizers that point at them, optimizers before the
# schedulers that rewrite their learning rates, RNG last (done by the Checkpointer).
_ORDER = {
    "module": 0,
    "optimizer": 1,
    "scheduler": 2,
    "scaler": 3,
    "sampler": 4,
    "stateful": 5,
    "generator": 6,
    "value": 7,
}
# Kinds the user defines the state of: a replicated one is checked equal on every rank.
USER_KINDS = frozenset({"stateful", "generator", "value"})
# Kinds whose saved state only an object of the same kind can take.
STRICT_KINDS = frozenset({"generator", "value"})


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
    """FSDP (wrapper) or FSDP2 (``fully_shard``: DTensor parameters). Neither can exist
    unless the script imported its module, so neither is imported here: they pull in DCP,
    FX and sympy, about 2 CPU-seconds at every trainer start of a plain DDP job."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is not None and isinstance(module, fsdp.FullyShardedDataParallel):
        return True
    tensor = sys.modules.get("torch.distributed.tensor")
    return tensor is not None and any(isinstance(p, tensor.DTensor) for p in module.parameters())


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
    if isinstance(obj, ResumableSampler | ElasticBatchSampler):
        return "sampler"
    if is_generator(obj):
        return "generator"
    if callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    ):
        return "stateful"
    if is_value(obj):
        return "value"
    raise TypeError(
        f"a {type(obj).__module__}.{type(obj).__qualname__} has no state_dict()/"
        "load_state_dict() and is not a plain value; the Checkpointer saves modules, "
        "optimizers, schedulers, grad scalers, Stateful objects, generators and plain values "
        "(numbers, strings, tensors, NumPy arrays, and dicts, lists and tuples of them)"
    )


def classify(
    objects: Mapping[str, Any], rank_local: Iterable[str] = (), replicated: Iterable[str] = ()
) -> list[Entry]:
    """Entries in apply order; a module or optimizer is sharded if any module is sharded."""
    if not isinstance(objects, Mapping):
        raise TypeError(
            "objects: expected a mapping of names to objects, e.g. {'model': model, "
            f"'optimizer': optimizer}}, got {type(objects).__name__}"
        )
    local, shared = set(rank_local), set(replicated)
    for what, names in (("rank_local", local), ("replicated", shared)):
        unknown = names - set(objects)
        if unknown:
            raise KeyError(f"{what} names {sorted(unknown)} are not in the objects")
    if local & shared:
        raise ValueError(f"{sorted(local & shared)} named both rank_local and replicated")
    kinds = {name: kind_of(obj) for name, obj in objects.items()}
    # once per module: every fast save classifies its objects on the training thread
    sharded_modules = {
        name for name, obj in objects.items() if kinds[name] == "module" and is_sharded_module(obj)
    }
    sharded_params: set[int] = set()
    for name in sharded_modules:
        sharded_params.update(id(p) for p in objects[name].parameters())
    entries = []
    for name, obj in objects.items():
        kind = kinds[name]
        sharded = name in sharded_modules or (
            kind == "optimizer"
            and any(id(p) in sharded_params for g in obj.param_groups for p in g["params"])
        )
        if sharded and name in shared:
            raise ValueError(f"{name!r} is sharded (FSDP); it cannot be saved replicated")
        if name in local or (kind in ("stateful", "generator") and name not in shared):
            placement = RANK
        elif sharded:
            placement = SHARDED
        else:
            placement = COMMON
        entries.append(Entry(name, obj, kind, placement))
    entries.sort(key=lambda e: _ORDER[e.kind])
    return entries


def reclassify(
    objects: Mapping[str, Any],
    previous: list[Entry] | None,
    rank_local: Iterable[str] = (),
    replicated: Iterable[str] = (),
) -> list[Entry]:
    """``classify(objects, ...)`` reusing ``previous`` (its result for the same
    ``rank_local`` and ``replicated``) when the names are the same and each holds the same
    object, or a plain value still: a few µs instead of a hundred, at every fast save. A
    module made sharded in place since (``fully_shard`` after the first save) is not seen."""
    if previous is not None and len(previous) == len(objects):
        entries = []
        for entry in previous:
            obj = objects.get(entry.name, _MISSING)
            if obj is entry.obj:
                entries.append(entry)
            elif entry.kind == "value" and obj is not _MISSING and kind_of(obj) == "value":
                entries.append(Entry(entry.name, obj, "value", entry.placement))
            else:
                break
        else:
            return entries
    return classify(objects, rank_local, replicated)


_MISSING = object()


def state_of(entry: Entry) -> Any:
    if entry.kind == "module":
        return unwrap(entry.obj).state_dict()
    if entry.kind == "value":
        return entry.obj
    if entry.kind == "generator":
        return generator_state(entry.obj)
    return entry.obj.state_dict()


def apply_state(entry: Entry, state: Any) -> Any:
    """Apply ``state`` to the entry's object; return the object the caller's mapping holds
    from now on (a plain value's restored value; the same object for every other kind)."""
    if entry.kind == "module":
        unwrap(entry.obj).load_state_dict(state)
    elif entry.kind == "value":
        return put_back(entry.obj, state)
    elif entry.kind == "generator":
        set_generator_state(entry.obj, state)
    else:
        entry.obj.load_state_dict(state)
    return entry.obj


def module_for_optimizer(optimizer: torch.optim.Optimizer, entries: list[Entry]) -> nn.Module:
    """The (sharded) module whose parameters the optimizer updates."""
    wanted = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for entry in entries:
        if entry.kind == "module":
            params = {id(p) for p in entry.obj.parameters()}
            if wanted <= params:
                return unwrap(entry.obj)
    raise ValueError("no module among the objects owns all of this optimizer's parameters")


def optimizer_param_ptrs(entries: list[Entry], *, state: bool = True) -> set[int]:
    """Storage addresses of every optimizer's parameters and (``state``) its state: what
    only ``step()`` mutates."""
    ptrs: set[int] = set()
    for entry in entries:
        if entry.kind != "optimizer":
            continue
        opt: torch.optim.Optimizer = entry.obj
        for group in opt.param_groups:
            for p in group["params"]:
                ptrs.add(p.data_ptr())
        if not state:
            continue
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    ptrs.add(v.data_ptr())
    return ptrs
