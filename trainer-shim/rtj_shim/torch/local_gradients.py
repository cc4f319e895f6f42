"""This rank's own gradient, measured before DDP averages it away: a communication hook.

A gradient scaled on one rank before the all-reduce (a bad GPU's arithmetic in backward)
leaves no trace a replica check can see: every rank applies the same average, and the
norm after the all-reduce is off on every rank alike, naming no one. Its norm *before*
the all-reduce is this rank's own signal: `LocalGradientNorm` is a DDP communication
hook that adds each bucket's squared norm (on its device: no sync) and then runs DDP's
default all-reduce (`default_hooks.allreduce_hook`, which gives the same result as no
hook). `Checkpointer.watch_gradients(ddp_model)` registers it; `step_boundary` takes the
step's norm and gives it to the anomaly guard as ``local_grad_norm``, judged against this
rank's own recent values.

DDP takes one communication hook: a job that registers its own (compression, PowerSGD)
cannot use this one, and is told so by DDP at registration.

No ``from __future__ import annotations`` here: DDP checks the hook's annotations as
objects (``GradBucket``, ``torch.futures.Future[torch.Tensor]``) and refuses strings.
"""

from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket, as its stubs name it
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

SIGNAL = "local_grad_norm"
"""The anomaly guard's name for it (a signal of this rank alone: it can name the rank)."""


class LocalGradientNorm:
    """The hook's state: the squared norms of this rank's buckets since the last `take`."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self._squares: torch.Tensor | None = None

    def measure(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        square = torch.linalg.vector_norm(buffer, 2, dtype=torch.float32).square()
        self._squares = square if self._squares is None else self._squares + square
        return default_hooks.allreduce_hook(self.group, bucket)  # type: ignore[arg-type]

    def take(self) -> torch.Tensor | None:
        """The norm of this rank's gradients since the last take (every micro-batch that
        synchronised), still on its device; None when no bucket was reduced."""
        squares, self._squares = self._squares, None
        return None if squares is None else squares.sqrt()


def _hook(state: LocalGradientNorm, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    return state.measure(bucket)


def watch(model: Any) -> LocalGradientNorm:
    """Register the hook on `model` (a DistributedDataParallel, before its first backward)."""
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(
            f"Checkpointer.watch_gradients(model): expected the DistributedDataParallel "
            f"module (the hook sits in its all-reduce), got {type(model).__name__}"
        )
    state = LocalGradientNorm(model.process_group)
    model.register_comm_hook(state, _hook)
    return state
