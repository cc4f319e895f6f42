"""``Checkpointer.peek()``: what the step a restore would resume holds, before the model exists.

Scripts that build their model from saved arguments need those arguments first. ``peek()``
takes the same decision ``restore()`` would (rank 0: the init container's ``resume.json``
or deep resolution; broadcast), remembers it so the following ``restore()`` resumes the
very same step without verifying it again, and returns a :class:`CheckpointInfo`: the
manifest's metadata and every *replicated plain value* of the step (a config dict, an
epoch counter), read from the skeleton and only the shards those values' tensors are in,
never the model's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.manifest import Manifest
from rtj_shim.checkpoint.verification import check_commit
from rtj_shim.torch import _dist
from rtj_shim.torch import serialization as ser
from rtj_shim.torch.outcomes import CheckpointError
from rtj_shim.torch.restore import StepLoader
from rtj_shim.torch.state import COMMON


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    uri: str
    source: str  # "resume-file" or "resolved"
    skipped: tuple[tuple[int, str], ...]  # newer steps passed over, with the reason
    world_size: int
    created_at: datetime
    framework: dict[str, Any]  # name, version, components (python, numpy, cuda, ...)
    objects: dict[str, dict[str, str]]  # name -> {"kind", "placement"} as saved
    values: dict[str, Any]  # replicated plain values, as restore() would put them back
    metadata: dict[str, Any] = field(default_factory=dict)  # manifest "extra" (not torch)
    manifest: Manifest | None = None


def read_values(loader: StepLoader, step: int, manifest: Manifest) -> dict[str, Any]:
    """The replicated plain values of ``step``: the skeleton, and the shards they use."""
    extra: Mapping[str, Any] = manifest.extra.get("torch") or {}
    objects: Mapping[str, Any] = extra.get("objects", {})
    names = [
        n for n, o in objects.items() if o.get("kind") == "value" and o.get("placement") == COMMON
    ]
    if not names:
        return {}
    common = extra["common"]
    skeleton = loader.load_file(step, manifest, common["skeleton"])["objects"]
    wanted = sorted({i for n in names for i in common.get("values", {}).get(n, [])})
    tensors: dict[int, Any] = {}
    for index in wanted:
        tensors.update(loader.load_file(step, manifest, common["shards"][index]))
    return {n: ser.unflatten(skeleton[n], tensors) for n in names}


def checkpoint_info(
    decision: Mapping[str, Any], manifest: Manifest, uri: str, values: dict[str, Any]
) -> CheckpointInfo:
    extra = dict(manifest.extra)
    torch_extra = extra.pop("torch", None) or {}
    return CheckpointInfo(
        step=manifest.step,
        uri=uri,
        source=str(decision["source"]),
        skipped=tuple((int(s), str(r)) for s, r in decision["skipped"]),
        world_size=manifest.world_size,
        created_at=manifest.created_at,
        framework=manifest.framework.model_dump(),
        objects=dict(torch_extra.get("objects", {})),
        values=values,
        metadata=extra,
        manifest=manifest,
    )


def peek_step(
    loader: StepLoader, decision: Mapping[str, Any], coord: _dist.Coordinator
) -> CheckpointInfo:
    """Collective: rank 0 reads the values of the decided step, every rank gets them."""
    step = int(decision["step"])
    manifest = check_commit(step, decision["manifest"], decision["committed"])
    values: Any = None
    if coord.rank == 0:
        try:
            values = read_values(loader, step, manifest)
        except Exception as exc:
            values = f"{type(exc).__name__}: {exc}"
    values = coord.broadcast(values)
    if isinstance(values, str):
        raise CheckpointError(f"peek: step {step}: {values}")
    uri = loader.store.key_uri(step_key(step))
    return checkpoint_info(decision, manifest, uri, values)
