"""The exact-resume rule and its two common traps, in one process.

The rule: the code from ``restore()`` to the first training step must be exactly the code
that ran after ``save()``. A batch drawn before the checkpoint point (prefetch) is carried
in the checkpoint as a plain value; an evaluation between the save and the next step runs
under ``isolated_rng()`` (or before the save). Each trap is shown to diverge without its
remedy, and to resume bit for bit with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from rtj_shim.torch import Checkpointer, ResumableSampler, isolated_rng

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class Augmented(Dataset[tuple[int, torch.Tensor, torch.Tensor]]):
    """Each item is augmented with noise from the global torch RNG (as random crops are)."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(48, 6, generator=gen)
        self.y = torch.randn(48, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i] + 0.1 * torch.randn(6), self.y[i]


class Job:
    def __init__(self) -> None:
        torch.manual_seed(1)
        self.model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.3), nn.Linear(16, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.sampler = ResumableSampler(Augmented(), num_replicas=1, rank=0, seed=2)
        self.loader = DataLoader(
            Augmented(), batch_size=4, sampler=self.sampler, generator=torch.Generator()
        )
        self._batches: Iterator[Batch] | None = None
        self.state: dict[str, Any] = {
            "model": self.model,
            "opt": self.opt,
            "sampler": self.sampler,
            "batch": None,  # the prefetched batch, carried in the checkpoint
        }

    def next_batch(self) -> Batch:
        while True:
            if self._batches is None:
                self._batches = iter(self.loader)
            try:
                return next(self._batches)  # type: ignore[no-any-return]
            except StopIteration:
                self.sampler.set_epoch(self.sampler.epoch + 1)
                self._batches = None

    def train_step(self, batch: Batch) -> float:
        _, x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return float(loss.detach())

    def evaluate(self) -> None:
        self.model.eval()
        with torch.no_grad():
            self.model(torch.randn(8, 6))  # draws from the global RNG, as eval data does
        self.model.train()


def run_prefetching(
    job: Job, ckpt: Checkpointer, start: int, stop: int, save_at: int | None, carry: bool
) -> list[float]:
    """A loop that draws the next batch *before* the checkpoint point."""
    batch = job.state["batch"] if carry and job.state["batch"] is not None else job.next_batch()
    losses = []
    for step in range(start + 1, stop + 1):
        losses.append(job.train_step(batch))
        batch = job.next_batch()  # prefetch: moves the sampler and the RNG
        if carry:
            job.state["batch"] = batch
        if step == save_at:
            ckpt.save(step, job.state)
    return losses


@pytest.mark.parametrize("carry", [True, False])
def test_a_prefetched_batch_carried_in_the_checkpoint_resumes_bit_for_bit(
    tmp_path: Path, carry: bool
) -> None:
    job = Job()
    ckpt = Checkpointer(tmp_path)
    assert ckpt.restore(job.state) == 0
    expected = run_prefetching(job, ckpt, 0, 30, save_at=17, carry=carry)

    resumed = Job()
    torch.manual_seed(99)  # a different process: every RNG elsewhere
    assert Checkpointer(tmp_path).restore(resumed.state) == 17
    got = run_prefetching(resumed, ckpt, 17, 30, save_at=None, carry=carry)
    if carry:
        assert [len(t) for t in resumed.state["batch"]] == [4, 4, 4]
        assert got == expected[17:]
    else:  # the trap: the resumed run draws the batch after the one it should train on
        assert got[0] != expected[17]


def run_evaluating(
    job: Job, ckpt: Checkpointer, start: int, stop: int, save_every: int, isolate: bool
) -> list[float]:
    """A loop that evaluates right after each save, before the next step."""
    losses = []
    for step in range(start + 1, stop + 1):
        losses.append(job.train_step(job.next_batch()))
        if step % save_every == 0:
            ckpt.save(step, job.state)
            if isolate:
                with isolated_rng():
                    job.evaluate()
            else:
                job.evaluate()
    return losses


@pytest.mark.parametrize("isolate", [True, False])
def test_an_evaluation_after_the_save_consumes_rng_unless_isolated(
    tmp_path: Path, isolate: bool
) -> None:
    job = Job()
    ckpt = Checkpointer(tmp_path)
    ckpt.restore(job.state)
    expected = run_evaluating(job, ckpt, 0, 25, save_every=10, isolate=isolate)

    resumed = Job()
    again = Checkpointer(tmp_path)
    assert again.restore(resumed.state) == 20
    got = run_evaluating(resumed, again, 20, 25, save_every=10, isolate=isolate)
    if isolate:
        assert got == expected[20:]
    else:  # the evaluation after step 20's save moved the dropout RNG of steps 21-25
        assert got != expected[20:]
