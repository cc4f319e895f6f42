"""Thin helpers over ``torch.distributed``: rank, world size and the checkpoint's own group.

Checkpoint coordination runs on a dedicated gloo group, created lazily by the first save or
restore (on every rank, in the same order, from the main thread). The training's own
collectives never share it, so a background save can gather and broadcast while the main
thread keeps training; a :class:`Coordinator` is only ever used by one thread at a time
(the Checkpointer guarantees at most one save in flight).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


class Coordinator:
    """Object collectives on a private gloo group; every call is a no-op when world is 1."""

    def __init__(self, timeout_s: float) -> None:
        self.rank = rank()
        self.world = world_size()
        self._group: Any = None
        if self.world > 1:
            self._group = dist.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=timeout_s)
            )

    @property
    def group(self) -> Any:
        return self._group

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self.world == 1:
            return obj
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, group=self._group)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def gather(self, obj: Any) -> list[Any] | None:
        """Objects of every rank on rank 0 (None elsewhere)."""
        if self.world == 1:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self._group)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier(group=self._group)

    def max_floats(self, values: list[float]) -> list[float]:
        """Element-wise maximum over ranks (float64), the same list on every rank."""
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group)
        return [float(v) for v in t.tolist()]
