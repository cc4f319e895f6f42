"""The collectives the torch.distributed integrations (DeepSpeed, Megatron Core, Ray Train)
publish and resume through: the first rank's value on every rank, and a barrier. One rank
alone needs neither (and no process group)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from rtj_shim.errors import CheckpointError
from rtj_shim.integrations._common import StepPublisher


def broadcast(value: Any, world: int, needs: str = "") -> Any:
    """The first rank's ``value``, on every rank (``world`` ranks)."""
    if world == 1:
        return value
    if not dist.is_initialized():
        raise CheckpointError(
            f"{world} ranks need torch.distributed initialized to agree on a step{needs}"
        )
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(world: int) -> None:
    if world > 1 and dist.is_initialized():
        dist.barrier()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


class TorchRanksPublisher(StepPublisher):
    """A publisher whose ranks are torch.distributed's (DeepSpeed, Megatron Core)."""

    @property
    def rank(self) -> int:
        return rank()

    @property
    def world(self) -> int:
        return world()
