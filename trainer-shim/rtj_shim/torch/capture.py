"""State capture: what one save takes from the training objects, and the files it becomes.

Files of one step (all listed, sized and hashed in its manifest)::

    common/skeleton.pt              structure of the replicated state, tensors as references
    common/shard-00000.pt ...       the replicated tensors; shard i is written by rank i % W
    ranks/rank-00000.pt ...         per rank: every RNG and the rank-local objects
    dcp/...                         sharded modules and optimizers (torch.distributed.checkpoint)

:func:`capture` reads the state of every object (references, not copies: staging copies
what must outlive the call), plans the shards and records in ``extra`` what a restore
needs to find everything again (manifest ``extra.torch``), with the framework versions
and the topology of the job that wrote it.
"""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import rtj_shim
from rtj_shim.checkpoint.manifest import Framework
from rtj_shim.checkpoint.protocol import StepMetadata
from rtj_shim.torch import _dist, fsdp, rng
from rtj_shim.torch import serialization as ser
from rtj_shim.torch.plain import all_plain_leaves
from rtj_shim.torch.resave import Snapshot
from rtj_shim.torch.state import (
    COMMON,
    RANK,
    SHARDED,
    Entry,
    optimizer_param_ptrs,
    state_of,
)

FORMAT = 1
SKELETON = "common/skeleton.pt"
RANK_FILES = "ranks/rank-{rank:05d}.pt"


def shard_path(index: int) -> str:
    return f"common/shard-{index:05d}.pt"


def rank_path(rank: int) -> str:
    return RANK_FILES.format(rank=rank)


@dataclass
class SaveJob:
    """Everything one save writes, captured on the training thread."""

    step: int
    blocking: bool
    started: float
    entries: list[Entry]
    problem: str | None  # found before the job ran (loss)
    skeleton: dict[str, Any]
    tensors: list[torch.Tensor]  # every replicated tensor (references)
    shards: list[list[int]]  # tensor indices per shard
    mine: list[int]  # shard numbers this rank writes
    fenced: set[int]  # tensor indices staged in the background (mutated only by step())
    rank_state: dict[str, Any]
    sharded: dict[str, Any]  # DCP state (references)
    extra: dict[str, Any]
    sharded_files: list[tuple[str, Path]] = field(default_factory=list)
    stage_dir: Path | None = None
    staged: threading.Event = field(default_factory=threading.Event)
    stall: float = 0.0
    snapshot: Snapshot | None = None  # what a second save of this step compares with
    scores: dict[str, Any] = field(default_factory=dict)  # manifest extra: metric, best


@dataclass
class Reading:
    """The objects' state at one boundary as their ``state_dict()`` returned it (no copies):
    each replicated object's under its name, every RNG of this rank as read
    (:func:`rng.read`) and the rank-local objects' (encoded). A fast save reads it on the
    training thread and plans the files on its writer thread (:mod:`rtj_shim.torch.fast_save`)."""

    common: dict[str, Any]
    rng: dict[str, Any]
    rank_objects: dict[str, Any]


def read_state(
    entries: list[Entry],
    coord: _dist.Coordinator,
    allow_unsafe_pickle: bool,
    *,
    clone_rank_objects: bool = False,
) -> Reading:
    """Each object's ``state_dict()`` and every RNG, on the training thread; the rank's own
    objects encoded (their tensors cloned with ``clone_rank_objects``: a save written while
    training goes on)."""
    rank_objects = {e.name: state_of(e) for e in entries if e.placement == RANK}
    return Reading(
        common={e.name: state_of(e) for e in entries if e.placement == COMMON},
        rng=rng.read(),
        rank_objects=ser.encode(
            rank_objects, f"rank {coord.rank} state", allow_unsafe_pickle,
            clone=clone_rank_objects,
        ),
    )  # fmt: skip


def capture(
    step: int,
    entries: list[Entry],
    coord: _dist.Coordinator,
    *,
    blocking: bool,
    started: float,
    problem: str | None,
    loss: float | torch.Tensor | None,
    allow_unsafe_pickle: bool,
    shard_bytes: int,
    max_shards: int,
    every_shard: bool = False,
    reading: Reading | None = None,
) -> SaveJob:
    """The state of ``entries`` at ``step`` as one rank's part of a save (no copies): the
    shards ``i % world == rank``, or ``every_shard`` (a fast save: each rank keeps all).
    ``reading``: the state read earlier (:func:`read_state`); None reads it now."""
    sharded = any(e.placement == SHARDED for e in entries)
    if reading is None:
        reading = read_state(entries, coord, allow_unsafe_pickle)
    tensors: list[torch.Tensor] = []
    seen: dict[tuple[Any, ...], int] = {}  # one reference per shared tensor, across objects
    skeleton = {
        name: ser.flatten(state, tensors, name, allow_unsafe_pickle, seen)
        for name, state in reading.common.items()
    }
    rank_state: dict[str, Any] = {
        "rank": coord.rank,
        "world_size": coord.world,
        "rng": rng.encoded(reading.rng),
        "objects": reading.rank_objects,
    }
    shards = ser.plan_shards(tensors, shard_bytes, max_shards) if tensors else []
    shard_of = {i: n for n, shard in enumerate(shards) for i in shard}
    value_shards = {  # the shards a replicated plain value's tensors are in (for peek())
        e.name: sorted({shard_of[i] for i in tensor_refs(skeleton[e.name])})
        for e in entries
        if e.kind == "value" and e.placement == COMMON
    }
    mine = [i for i in range(len(shards)) if every_shard or i % coord.world == coord.rank]
    fenced: set[int] = set()
    if not blocking:
        ptrs = optimizer_param_ptrs(entries)
        fenced = {i for s in mine for i in shards[s] if tensors[i].data_ptr() in ptrs}
    objects_meta = {e.name: {"kind": e.kind, "placement": e.placement} for e in entries}
    samplers = {  # as read (a fast save plans on its writer thread, the sampler moved on)
        e.name: reading.common[e.name] if e.placement == COMMON else reading.rank_objects[e.name]
        for e in entries
        if e.kind == "sampler"
    }
    extra: dict[str, Any] = {
        "format": FORMAT,
        "layout": "sharded" if sharded else "replicated",
        "world_size": coord.world,
        "objects": objects_meta,
        "common": {
            "skeleton": SKELETON,
            "shards": [shard_path(i) for i in range(len(shards))],
            "values": value_shards,
        },
        "rank_files": RANK_FILES,
        "dcp": fsdp.DCP_DIR if sharded else None,
        "loss": None if loss is None else as_float(loss),
        "validation": None,
        "samplers": samplers,
        "rng": sorted(rank_state["rng"]),
        "topology": topology(coord.world),
    }
    return SaveJob(
        step=step,
        blocking=blocking,
        started=started,
        entries=entries,
        problem=problem,
        skeleton=skeleton,
        tensors=tensors,
        shards=shards,
        mine=mine,
        fenced=fenced,
        rank_state=rank_state,
        sharded=fsdp.sharded_state(entries) if sharded else {},
        extra=extra,
    )


def finite_candidates(job: SaveJob) -> list[tuple[str, torch.Tensor]]:
    """The module tensors this rank writes, named, for the non-finite guard."""
    modules = {e.name for e in job.entries if e.kind == "module"}
    owner: dict[int, str] = {}
    for name in modules:
        if name in job.skeleton:
            collect_tensor_refs(job.skeleton[name], name, owner)
    return [(owner[i], job.tensors[i]) for s in job.mine for i in job.shards[s] if i in owner]


def step_metadata(job: SaveJob, world_size: int) -> StepMetadata:
    """What the manifest records besides the files: provenance, framework, ``extra.torch``."""
    layout = "fsdp" if job.extra["layout"] == "sharded" else "data_parallel"
    return StepMetadata.from_env(
        world_size=world_size,
        parallelism={layout: world_size},
        framework=framework_info(),
        extra={"torch": job.extra, **job.scores},
    )


def as_float(value: float | torch.Tensor) -> float:
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def clone_tensors(value: Any) -> Any:
    """A copy of a nested state whose tensors are cloned (containers rebuilt, leaves shared)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        out = type(value)((k, clone_tensors(v)) for k, v in value.items())
        if hasattr(value, "_metadata"):
            setattr(out, "_metadata", value._metadata)  # noqa: B010
        return out
    if isinstance(value, list):
        return list(value) if all_plain_leaves(value) else [clone_tensors(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return value if all_plain_leaves(value) else tuple(clone_tensors(v) for v in value)
    return value


def tensor_refs(skeleton: Any) -> set[int]:
    found: dict[int, str] = {}
    collect_tensor_refs(skeleton, "", found)
    return set(found)


def collect_tensor_refs(skeleton: Any, where: str, out: dict[int, str]) -> None:
    """Map every tensor reference in ``skeleton`` to the dotted path where it sits."""
    if isinstance(skeleton, Mapping):
        if len(skeleton) == 1 and ser.TENSOR_REF in skeleton:
            out[int(skeleton[ser.TENSOR_REF])] = where
            return
        for k, v in skeleton.items():
            collect_tensor_refs(v, f"{where}.{k}", out)
    elif isinstance(skeleton, list | tuple):
        for i, v in enumerate(skeleton):
            collect_tensor_refs(v, f"{where}[{i}]", out)


def framework_info() -> Framework:
    components = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "rtj_shim": getattr(rtj_shim, "__version__", "unknown"),
    }
    cuda = torch.version.cuda
    if cuda:
        components["cuda"] = str(cuda)
    if _dist.is_distributed():
        components["backend"] = str(torch.distributed.get_backend())
    return Framework(name="pytorch", version=torch.__version__, components=components)


def topology(world: int) -> dict[str, Any]:
    env = os.environ
    return {
        "world_size": world,
        "local_world_size": int(env.get("LOCAL_WORLD_SIZE") or 1),
        "nnodes": max(1, world // max(1, int(env.get("LOCAL_WORLD_SIZE") or world or 1))),
        "backend": str(torch.distributed.get_backend()) if _dist.is_distributed() else None,
    }
