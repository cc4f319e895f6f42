"""The test faults of `ddp_train.py` (the drills' and the soak's): a store that kills the
process inside a shard write, a bit flipped in a rank's weights, a gradient scaled before
DDP's all-reduce. Kept out of the example so that it reads as what a user writes."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import torch
from torch import nn


class _KillingWriter:
    """Delegates to a real StepWriter; SIGKILLs this process inside a shard write."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def write_file(self, path: str, chunks: Any) -> Any:
        def killing() -> Any:
            for i, chunk in enumerate(chunks):
                if i == 0 and "shard" in path:
                    half = chunk[: max(1, len(chunk) // 2)]
                    yield half  # part of the shard reaches the file, then the process dies
                    sys.stderr.write(f"fault: SIGKILL inside the write of {path}\n")
                    sys.stderr.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
                yield chunk

        return self._inner.write_file(path, killing())


class KillInSaveStore:
    """A store whose writers for ``step`` kill the process in the middle of a shard."""

    def __init__(self, inner: Any, step: int) -> None:
        self._inner = inner
        self._step = step

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def begin_step(self, step: int, attempt: str, *, fresh: bool = True) -> Any:
        writer = self._inner.begin_step(step, attempt, fresh=fresh)
        return _KillingWriter(writer) if step == self._step else writer


def scale_gradients(model: nn.Module) -> dict[str, bool]:
    """Silent data corruption (tests): while ``now``, this rank's gradients are scaled ten
    thousand times as backward computes them, before DDP's all-reduce averages them."""
    scaling = {"now": False}
    for p in model.parameters():
        p.register_hook(lambda g: g * 1e4 if scaling["now"] else g)
    return scaling


def flip_a_bit(model: nn.Module, rank: int, step: int) -> None:
    """Silent data corruption (tests): bit 20 of one weight, as a bad GPU's arithmetic."""
    with torch.no_grad():
        next(model.parameters()).view(-1).view(torch.int32)[7] ^= 1 << 20
    sys.stderr.write(f"fault: flipped a bit of rank {rank}'s weights after step {step}\n")


def shift_labels(y: torch.Tensor, rank: int, step: int) -> None:
    """A resume that reads from the wrong position (tests): this rank's labels move one
    record against its features, as a packed file read from the wrong offset."""
    y.copy_(torch.roll(y, 1, 0))
    sys.stderr.write(f"fault: rank {rank} reads its labels one record off after step {step}\n")
