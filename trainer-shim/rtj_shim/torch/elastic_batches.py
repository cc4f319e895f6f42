"""Optimizer steps of a fixed global batch, on whatever world is training now.

Elastic training keeps *the same training* on fewer workers: an optimizer step consumes the
global batch the user set, ``global_batch`` samples of the epoch's order, however many
ranks are running. The epoch's order is that of :class:`~rtj_shim.torch.sampler.ResumableSampler`
(``randperm`` seeded with ``seed + epoch``, or ``range`` without shuffling). Step ``s`` of
an epoch covers order positions ``[s * G, s * G + n)`` with ``n = G`` except for the
epoch's last step, which takes what is left (or is skipped with ``drop_last``).

Within a step, rank ``r`` of ``W`` takes a contiguous share of the ``n`` positions; shares
differ by at most one. Every rank splits its share into the same number of micro-batches,
``ceil(ceil(n / W) / micro_batch)``, so every rank runs the same number of backward passes
(DDP all-reduces on each rank's last one); a micro-batch a small share cannot fill holds one
sample of the step with weight 0 (forward and backward run, the gradient is zero, nothing
is consumed).

:attr:`MicroBatch.loss_scale` multiplies the micro-batch's *mean* loss: ``W * m / n`` for
``m`` samples. DDP averages gradients over the ``W`` ranks, so the optimizer sees the
gradient of the mean loss over the step's ``n`` samples whatever ``W`` is: the full world's
gradient, up to the order floats are summed in. The learning-rate schedule counts
optimizer steps, which do not change with the world.

Exactly once: a step's positions are handed out when the step is (the iterator advances
before the step trains, so a checkpoint taken at the next step boundary counts it). The
state holds global positions only (no world size), so resuming on any world continues at
the same position: over any sequence of resizes each sample of an epoch is consumed once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from typing import Any

from rtj_shim.torch import sample_order

STATE_VERSION = 1


@dataclass(frozen=True)
class MicroBatch:
    indices: tuple[int, ...]
    """Dataset indices to run forward and backward on."""
    loss_scale: float
    """Multiply the mean loss over `indices` by this before `backward()`."""
    consumed: int
    """Samples this micro-batch consumes: ``len(indices)``, or 0 for a weight-0 filler."""


@dataclass(frozen=True)
class StepBatch:
    epoch: int
    step_in_epoch: int
    samples: int
    """Samples the whole world consumes in this optimizer step (``n``)."""
    world_size: int
    micro_batches: tuple[MicroBatch, ...]

    @property
    def indices(self) -> tuple[int, ...]:
        """The dataset indices this rank consumes in this step (fillers left out)."""
        return tuple(i for m in self.micro_batches if m.consumed for i in m.indices)


def share(samples: int, world_size: int, rank: int) -> range:
    """Rank ``rank``'s contiguous share of a step's ``samples`` positions (offsets)."""
    base, extra = divmod(samples, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def micro_batch_count(samples: int, world_size: int, micro_batch: int) -> int:
    """Micro-batches every rank runs in a step of ``samples``: enough for the largest share."""
    return max(1, math.ceil(math.ceil(samples / world_size) / micro_batch))


def split_step(
    positions: list[int], world_size: int, rank: int, micro_batch: int
) -> tuple[MicroBatch, ...]:
    """Rank ``rank``'s micro-batches of one step whose order positions map to ``positions``
    (the dataset indices of the step, in order). Pure: the same for every caller."""
    samples = len(positions)
    if samples == 0:
        raise ValueError("a step needs at least one sample")
    mine = [positions[i] for i in share(samples, world_size, rank)]
    count = micro_batch_count(samples, world_size, micro_batch)
    out: list[MicroBatch] = []
    for part in range(count):
        piece = share(len(mine), count, part)
        chunk = mine[piece.start : piece.stop]
        if chunk:
            out.append(MicroBatch(tuple(chunk), world_size * len(chunk) / samples, len(chunk)))
        else:  # a share smaller than the others' micro-batch count: a weight-0 filler
            out.append(MicroBatch((positions[0],), 0.0, 0))
    return tuple(out)


class ElasticBatchSampler:
    """Yields one :class:`StepBatch` per optimizer step for this rank; a stateful object
    (``state_dict``/``load_state_dict``) to save with the checkpoint."""

    def __init__(
        self,
        dataset: Sized,
        global_batch: int,
        micro_batch: int | None = None,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        dataset_id: str | None = None,
    ) -> None:
        self.num_replicas, self.rank = sample_order.replica_and_rank(num_replicas, rank)
        if global_batch < 1:
            raise ValueError(
                f"global_batch: expected a positive number of samples, got {global_batch}"
            )
        self.global_batch = int(global_batch)
        self.micro_batch = int(micro_batch) if micro_batch is not None else self.global_batch
        if self.micro_batch < 1:
            raise ValueError(
                f"micro_batch: expected a positive number of samples, got {micro_batch}"
            )
        self.dataset_len = len(dataset)
        self.dataset_id = sample_order.dataset_id(dataset, dataset_id)
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.epoch = 0
        self._consumed = 0
        self._ended = False
        self._order_cache: tuple[int, list[int]] | None = None
        self.repartitioned: str | None = None
        """What the last load said of a world-size change (the Checkpointer's restore notes)."""

    def _order(self) -> list[int]:
        if self._order_cache is None or self._order_cache[0] != self.epoch:
            order = sample_order.epoch_order(self.dataset_len, self.shuffle, self.seed, self.epoch)
            self._order_cache = (self.epoch, order)
        return self._order_cache[1]

    def _epoch_end(self) -> int:
        """Positions of the epoch that steps cover (the partial last step dropped or not)."""
        if self.drop_last:
            return (self.dataset_len // self.global_batch) * self.global_batch
        return self.dataset_len

    @property
    def consumed(self) -> int:
        """Order positions of this epoch handed out, by every rank together."""
        return self._consumed

    def __len__(self) -> int:
        """Optimizer steps left in the epoch (a whole epoch once it ended)."""
        left = self._epoch_end() - (0 if self._ended else self._consumed)
        return math.ceil(max(left, 0) / self.global_batch)

    def __iter__(self) -> Iterator[StepBatch]:
        end = self._epoch_end()
        if self._consumed >= end:
            if not self._ended:
                self._ended = True  # handed out everything: report the end first
                return
            self._consumed = 0  # ended: a new pass over the same epoch
        self._ended = False
        order = self._order()
        while self._consumed < end:
            start = self._consumed
            positions = order[start : min(start + self.global_batch, end)]
            self._consumed = start + len(positions)
            yield StepBatch(
                self.epoch, start // self.global_batch, len(positions), self.num_replicas,
                split_step(positions, self.num_replicas, self.rank, self.micro_batch),
            )  # fmt: skip
        self._ended = True

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning; the current epoch keeps its position."""
        if epoch != self.epoch:
            self.epoch, self._consumed, self._ended = int(epoch), 0, False

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "dataset_id": self.dataset_id,
            "dataset_len": self.dataset_len,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "global_batch": self.global_batch,
            "epoch": self.epoch,
            "consumed": self._consumed,
            "ended": self._ended,
            "world_size": self.num_replicas,  # for the restore's note; positions are global
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"ElasticBatchSampler: unsupported state version {state.get('version')}"
            )
        ours = self.state_dict()
        for key in ("dataset_id", "dataset_len", "seed", "shuffle", "drop_last", "global_batch"):
            if state.get(key) != ours[key]:
                raise ValueError(
                    f"ElasticBatchSampler: {key} is {ours[key]!r} here but {state.get(key)!r} in "
                    "the checkpoint; refusing to resume a position in a different sample order "
                    "(the same training needs the same data, seed and global batch)"
                )
        consumed = int(state["consumed"])
        if not 0 <= consumed <= self.dataset_len:
            raise ValueError(
                f"ElasticBatchSampler: consumed {consumed} is outside the epoch's "
                f"{self.dataset_len} samples"
            )
        self.epoch, self._consumed = int(state["epoch"]), consumed
        self._ended = bool(state.get("ended", False))
        self._order_cache = None
        saved_world = state.get("world_size")
        self.repartitioned = (
            f"ElasticBatchSampler: world size {saved_world} -> {self.num_replicas} in epoch "
            f"{self.epoch} after {consumed} of {self.dataset_len} samples; every optimizer "
            f"step keeps its global batch of {self.global_batch}"
            if saved_world is not None and saved_world != self.num_replicas
            else None
        )
