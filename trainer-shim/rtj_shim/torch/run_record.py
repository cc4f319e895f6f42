"""This run's configuration record (`rtj_shim.checkpoint.run_config.RunConfig`) read off its
objects, and the guard a restore applies with it.

Parameter shapes are the model's own: a DDP module's, an FSDP2 (``fully_shard``) module's
global shapes (a DTensor's ``shape``), so they do not change with the world size. A legacy
FSDP wrapper (``FullyShardedDataParallel``) holds flattened, sharded parameters whose shapes
do change with the world: its parameters are left out of the record.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from torch import nn

from rtj_shim.checkpoint.run_config import (
    RUN_CONFIG_EXTRA,
    ConfigMismatch,
    RunConfig,
    check_resume,
)
from rtj_shim.torch import _dist
from rtj_shim.torch.outcomes import CheckpointError
from rtj_shim.torch.state import SHARDED, Entry, unwrap

log = logging.getLogger("rtj_shim.torch")


def current(entries: Sequence[Entry], world_size: int, config: Mapping[str, Any]) -> RunConfig:
    """What defines this run now: world, layout, the declared config, parameter shapes."""
    layout = "sharded" if any(e.placement == SHARDED for e in entries) else "replicated"
    params: dict[str, tuple[int, ...]] = {}
    for entry in entries:
        if entry.kind != "module" or _legacy_fsdp(entry.obj):
            continue
        module = unwrap(entry.obj)
        for name, param in module.named_parameters():
            params[f"{entry.name}.{name}"] = tuple(int(d) for d in param.shape)
    return RunConfig(world_size, layout, dict(config), params)


def guard(
    manifest_extra: Mapping[str, Any],
    now: RunConfig,
    allowed: Collection[str],
    *,
    step: int,
    attempt: str,
) -> RunConfig:
    """The record to publish after resuming ``step`` (whose manifest's ``extra`` is given);
    ConfigMismatch naming the undeclared changes. A record that cannot be read is refused
    as a mismatch would be: it is never taken for "nothing recorded"."""
    raw = manifest_extra.get(RUN_CONFIG_EXTRA)
    saved = None if raw is None else RunConfig.parse(raw)
    record = check_resume(saved, now, allowed, step=step, attempt=attempt)
    if saved is not None and record.history != saved.history:
        for change in record.history[-1].changes:
            log.warning("step %d resumed with a changed configuration: %s",
                        step, change.describe())  # fmt: skip
    return record


def guard_collective(
    manifest_extra: Mapping[str, Any],
    now: RunConfig,
    allowed: Collection[str],
    step: int,
    attempt: str,
    coord: _dist.Coordinator,
) -> RunConfig:
    """:func:`guard` on every rank, refusing on every rank when any rank refuses (a rank
    alone refusing would leave the others waiting in the load's collectives)."""
    refusal: ValueError | None = None
    record = now
    try:
        record = guard(manifest_extra, now, allowed, step=step, attempt=attempt)
    except ValueError as exc:  # ConfigMismatch, or a record that cannot be read
        refusal = exc
    errors = [e for e in coord.all_gather(None if refusal is None else str(refusal)) if e]
    if refusal is not None:
        raise refusal
    if errors:
        raise CheckpointError("restore refused: " + "; ".join(errors))
    return record


def _legacy_fsdp(obj: Any) -> bool:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - builds without distributed
        return False
    return isinstance(obj, FullyShardedDataParallel) or (
        isinstance(obj, nn.Module)
        and any(isinstance(m, FullyShardedDataParallel) for m in obj.modules())
    )


__all__ = ["ConfigMismatch", "current", "guard", "guard_collective"]
