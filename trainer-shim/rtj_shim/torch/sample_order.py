"""What the samplers share: an epoch's sample order and who reads it.

The order of epoch ``e`` is ``randperm(n)`` seeded with ``seed + e`` (or ``range(n)``
without shuffling): `ResumableSampler` and `ElasticBatchSampler` both walk it, so a job can
move between them only at an epoch boundary, and a resume finds the same order."""

from __future__ import annotations

from collections.abc import Sized

import torch

from rtj_shim.torch import _dist


def epoch_order(length: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    if not shuffle:
        return list(range(length))
    gen = torch.Generator()
    gen.manual_seed(seed + epoch)
    return list(torch.randperm(length, generator=gen).tolist())


def replica_and_rank(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """The world size and rank a sampler reads for (the process group's by default)."""
    replicas = _dist.world_size() if num_replicas is None else num_replicas
    own = _dist.rank() if rank is None else rank
    if replicas < 1 or not 0 <= own < replicas:
        raise ValueError(f"invalid rank {own} for {replicas} replicas")
    return replicas, own


def dataset_id(dataset: Sized, given: str | None) -> str:
    """The id a sampler's state names its dataset by (a resume refuses another one)."""
    return given or f"{type(dataset).__name__}:{len(dataset)}"
