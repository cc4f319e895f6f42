"""A drop-in for ``DistributedSampler`` whose position survives a restart.

The epoch's global order is ``randperm(len(dataset))`` seeded with ``seed + epoch`` (or
``range`` without shuffling). Ranks take it round-robin: rank ``r`` of ``W`` gets global
positions ``base + r, base + r + W, ...`` of the order (padded by repeating its start, or
truncated with ``drop_last``, exactly like ``DistributedSampler``). ``offset`` counts the
indices this rank has handed out in the current epoch, so ``base + offset * W`` samples of
the epoch are consumed. State: dataset id and length, seed, shuffle, epoch, world size,
base and offset: plain ints and strings.

Resuming on the same world size continues at ``offset``: no sample repeats, none is
skipped. Resuming on a different world size re-partitions the rest of the epoch (global
positions from ``base + offset * W_old``) over the new ranks and says so in a warning.

``offset`` counts indices handed to the loader; with ``DataLoader(num_workers=0)`` that is
exactly what training consumed at a step boundary. Worker processes prefetch ahead; call
:meth:`ResumableSampler.rewind_prefetched` (or use ``num_workers=0``) when they do.

Deviations from ``DistributedSampler`` that make resume work: ``set_epoch`` with the
current epoch keeps the position (a resumed loop calls it again); ``__iter__`` continues
where the previous iterator stopped; a position at the very end of the epoch whose
iterator had not yet reported the end reports it first (as the interrupted iterator
would have), and only an ended epoch starts over on the next ``__iter__``.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterator, Sized
from typing import Any

from torch.utils.data import Sampler

from rtj_shim.torch import sample_order

log = logging.getLogger(__name__)

STATE_VERSION = 1


class ResumableSampler(Sampler[int]):
    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        dataset_id: str | None = None,
    ) -> None:
        self.num_replicas, self.rank = sample_order.replica_and_rank(num_replicas, rank)
        self.dataset_len = len(dataset)
        self.dataset_id = sample_order.dataset_id(dataset, dataset_id)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.epoch = 0
        self._base = 0
        self._offset = 0
        self._ended = False
        self._order_cache: tuple[int, list[int]] | None = None
        self.repartitioned: str | None = None  # what the last load re-partitioned, if anything

    # -------------------------------------------------------------- the epoch's indices

    def _order(self) -> list[int]:
        if self._order_cache is not None and self._order_cache[0] == self.epoch:
            return self._order_cache[1]
        order = sample_order.epoch_order(self.dataset_len, self.shuffle, self.seed, self.epoch)
        self._order_cache = (self.epoch, order)
        return order

    def _rank_indices(self) -> list[int]:
        rest = self._order()[self._base :]
        replicas = self.num_replicas
        if self.drop_last:
            rest = rest[: (len(rest) // replicas) * replicas]
        elif rest:
            total = math.ceil(len(rest) / replicas) * replicas
            padding = total - len(rest)
            rest = rest + (rest * math.ceil(padding / len(rest)))[:padding]
        return rest[self.rank :: replicas]

    def __iter__(self) -> Iterator[int]:
        indices = self._rank_indices()
        if self._offset >= len(indices):
            if not self._ended:
                # Handed out everything, but the iterator had not reported the end yet
                # (a checkpoint taken right after the epoch's last batch): report it now,
                # exactly as the original iterator would have.
                self._ended = True
                return
            self._base, self._offset = 0, 0  # ended: a new pass over the same epoch
            indices = self._rank_indices()
        self._ended = False
        for i in range(self._offset, len(indices)):
            self._offset = i + 1
            yield indices[i]
        self._ended = True

    def __len__(self) -> int:
        remaining = len(self._rank_indices()) - self._offset
        return remaining if remaining > 0 else len(self._full_epoch_indices())

    def _full_epoch_indices(self) -> list[int]:
        base, offset = self._base, self._offset
        self._base, self._offset = 0, 0
        try:
            return self._rank_indices()
        finally:
            self._base, self._offset = base, offset

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning; the current epoch keeps its position."""
        if epoch == self.epoch:
            return
        self.epoch = int(epoch)
        self._base, self._offset = 0, 0
        self._ended = False

    def rewind_prefetched(self, count: int) -> None:
        """Un-count ``count`` indices that were handed out but not consumed (prefetch)."""
        if not 0 <= count <= self._offset:
            raise ValueError(f"cannot rewind {count} of {self._offset} handed-out indices")
        self._offset -= count

    # -------------------------------------------------------------- position

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def consumed(self) -> int:
        """Global positions of this epoch consumed by all ranks together."""
        return min(self.dataset_len, self._base + self._offset * self.num_replicas)

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "dataset_id": self.dataset_id,
            "dataset_len": self.dataset_len,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "epoch": self.epoch,
            "world_size": self.num_replicas,
            "base": self._base,
            "offset": self._offset,
            "ended": self._ended,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"ResumableSampler: unsupported state version {state.get('version')}")
        if state["dataset_id"] != self.dataset_id or state["dataset_len"] != self.dataset_len:
            raise ValueError(
                f"ResumableSampler: the checkpoint's cursor is for dataset "
                f"{state['dataset_id']!r} ({state['dataset_len']} samples), this sampler reads "
                f"{self.dataset_id!r} ({self.dataset_len} samples); refusing to resume a "
                "position in a different dataset"
            )
        for key in ("seed", "shuffle", "drop_last"):
            if state[key] != getattr(self, key):
                warnings.warn(
                    f"ResumableSampler: {key} is {getattr(self, key)!r} here but "
                    f"{state[key]!r} in the checkpoint; continuing with the checkpoint's value",
                    stacklevel=2,
                )
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        self.drop_last = bool(state["drop_last"])
        self.epoch = int(state["epoch"])
        self._order_cache = None
        old_world = int(state["world_size"])
        base, offset = int(state["base"]), int(state["offset"])
        self.repartitioned = None
        self._ended = bool(state.get("ended", False))
        if old_world == self.num_replicas:
            self._base, self._offset = base, offset
            return
        consumed = min(self.dataset_len, base + offset * old_world)
        self._base, self._offset = consumed, 0
        self.repartitioned = (
            f"ResumableSampler: world size changed from {old_world} to {self.num_replicas} "
            f"in epoch {self.epoch} after {consumed} of {self.dataset_len} samples; "
            f"re-partitioning the remaining {self.dataset_len - consumed} samples of the epoch "
            f"over {self.num_replicas} rank(s)"
        )
        log.warning("%s", self.repartitioned)
        warnings.warn(self.repartitioned, stacklevel=2)
