"""What every rank agrees on at a step boundary: a SIGTERM on any rank, an ``every_seconds``
interval passed on any rank, and rank 0's metric. One element-wise maximum over ranks per
boundary, on the Checkpointer's own gloo group.

**Synchronous** when the Checkpointer monitors a metric (``monitor=``): a save because the
metric improved must be of *this* step's state, and only rank 0 knows it has a metric, so
every boundary waits for every rank's values.

**One boundary late** without one (the default): each boundary starts its reduction in the
background (gloo runs it while the next step trains) and takes the previous boundary's
result, so no boundary waits for the slowest rank to arrive (measured in the goodput soak:
the synchronous reduction held every step 1.7 ms, median, of a 68 ms step on 2 shared CPUs).
Every rank takes the same result at the same boundary, so the decisions stay collective; a
SIGTERM is acted on one step later, and so is a passed interval, whose flag is dropped when a
save happened after it was raised (that save reset it). The lag is worth a step only while
steps are short: each rank also sends the time since its previous boundary, and once the
agreed maximum has reached `LAGGED_MAX_STEP_S` at `LONG_STEPS` boundaries in a row (one slow
step on a loaded machine is not a long-step job), every rank (at the same boundary: they read
the same values) waits for that boundary's own reduction too and stays synchronous from then
on, so a SIGTERM on a job of long steps starts its emergency save one step after it, not two.

**Not every boundary.** A reduction per boundary cost a step that saves nothing 0.5 ms (the
tensor, the collective's launch, the wait; issue 48's target is 0.1 ms), so in the lagged mode
the ranks reduce only every `cadence` boundaries: enough of them to span `AGREE_PERIOD_S` of
agreed step time (at most `MAX_CADENCE`). Every rank computes the next cadence from the same
agreed values at the same boundary, so they all reduce at the same boundaries; the others do
no collective at all (`due` is False). A SIGTERM or a passed interval is then acted on within
about `AGREE_PERIOD_S` (and a step), well inside any emergency deadline; the schedule's
``every_steps`` needs no agreement (every rank counts the same steps).
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rtj_shim import progress
from rtj_shim.torch._dist import Coordinator
from rtj_shim.torch.schedule import Best, Decision, Schedule, metric_flag, save_decision

log = logging.getLogger("rtj_shim.torch")

LAGGED_MAX_STEP_S = 1.0
"""A step at least this long (on any rank) ends the lag: the agreement's own wait (about a
millisecond) is then under 0.1% of a step, and a lagged SIGTERM would cost a whole step of
its grace period."""

LONG_STEPS = 3
"""Agreed long steps in a row that end the lag."""

AGREE_PERIOD_S = 0.25
"""Agreed step time between two reductions in the lagged mode (the reaction time to a
SIGTERM or a passed interval, beside the lag)."""

MAX_CADENCE = 64
"""At most this many boundaries between two reductions, however short the steps."""

CLOSE_WAIT_S = 5.0
"""How long ``close`` waits for the last background reduction (every rank started it at its
last boundary; a rank that died before that never will)."""


@dataclass(frozen=True)
class Agreed:
    sigterm: bool
    time_due: bool
    metric_flag: float  # rank 0's: 0 none, 1 finite, 2 NaN or infinite (schedule.metric_flag)
    metric: float | None  # rank 0's finite metric


NOTHING = Agreed(False, False, 0.0, None)


@dataclass
class _Pending:
    work: Any  # torch.distributed Work
    values: torch.Tensor
    started: float  # monotonic, when this rank raised its flags


class StepAgreement:
    """The per-boundary reduction of one Checkpointer (``lagged``: one boundary late)."""

    def __init__(self, coordinator: Coordinator, *, lagged: bool, timeout_s: float) -> None:
        self.coordinator = coordinator
        self.lagged = lagged
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._pending: _Pending | None = None
        self._last_reduced = (0, 0.0)  # the boundary that last reduced, and when (monotonic)
        self._long_steps = 0  # agreed long steps in a row (the same on every rank)
        self._boundaries = 0  # boundaries seen (the same count on every rank)
        self._next_reduction = 1  # the boundary that reduces next (the same on every rank)

    def due(self) -> bool:
        """Whether this boundary reduces (always, but in the lagged mode's in-between
        boundaries); counts the boundary. Every rank gets the same answer at the same one."""
        self._boundaries += 1
        if not self.lagged or self.coordinator.world == 1:
            return True
        return self._boundaries >= self._next_reduction

    def agree(
        self, sigterm: bool, time_due: bool, metric_flag: float, metric: float, last_save: float
    ) -> Agreed:
        """This rank's flags (``metric``: -inf unless rank 0's finite value) in, the agreed
        ones out, at a boundary `due` said reduces. ``last_save``: when this rank's newest save
        began (monotonic)."""
        now = time.monotonic()
        steps = self._boundaries - self._last_reduced[0]
        step_s = (now - self._last_reduced[1]) / steps if self._last_reduced[0] else 0.0
        self._last_reduced = (self._boundaries, now)
        mine = [float(sigterm), float(time_due), metric_flag, metric]
        if self.coordinator.world == 1:
            return _agreed(mine)
        if not self.lagged:
            return _agreed(self.coordinator.max_floats(mine))
        before = self._pending
        values = torch.tensor([*mine, step_s], dtype=torch.float64)
        work = dist.all_reduce(
            values, op=dist.ReduceOp.MAX, group=self.coordinator.group, async_op=True
        )
        current = self._pending = _Pending(work, values, now)
        if before is None:
            self._next_reduction = self._boundaries + 1
            return NOTHING
        agreed = self._late(before, last_save)
        agreed_step_s = before.values[4].item()
        self._next_reduction = self._boundaries + cadence(agreed_step_s)
        long = agreed_step_s >= LAGGED_MAX_STEP_S
        self._long_steps = self._long_steps + 1 if long else 0
        if self._long_steps < LONG_STEPS:
            return agreed
        # long steps: every rank ends the lag here, taking this boundary's reduction too
        self.lagged, self._pending = False, None
        this = self._late(current, last_save)
        return Agreed(agreed.sigterm or this.sigterm, agreed.time_due or this.time_due, 0.0, None)

    def _late(self, pending: _Pending, last_save: float) -> Agreed:
        """A background reduction's result (waited for), its interval flag dropped when a save
        began after this rank raised it."""
        pending.work.wait(self.timeout)
        agreed = _agreed(pending.values[:4].tolist())
        if agreed.time_due and last_save >= pending.started:
            return Agreed(agreed.sigterm, False, 0.0, None)  # a save since reset the interval
        return Agreed(agreed.sigterm, agreed.time_due, 0.0, None)

    def close(self) -> None:
        """Wait (briefly) for the last background reduction; a dead peer's is abandoned."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.work.wait(datetime.timedelta(seconds=CLOSE_WAIT_S))
        except Exception:
            return


def cadence(agreed_step_s: float) -> int:
    """Boundaries until the next reduction: enough to span `AGREE_PERIOD_S` of the agreed
    (slowest rank's) step time, between 1 and `MAX_CADENCE`. Pure: every rank computes it
    from the same agreed value."""
    if not agreed_step_s > 0 or not math.isfinite(agreed_step_s):
        return 1
    boundaries = AGREE_PERIOD_S / agreed_step_s  # infinite for a subnormal step time
    if boundaries >= MAX_CADENCE:
        return MAX_CADENCE
    return max(1, math.ceil(boundaries))


def _agreed(values: list[float]) -> Agreed:
    sigterm, time_due, flag, metric = values
    return Agreed(bool(sigterm), bool(time_due), flag, metric if math.isfinite(metric) else None)


@dataclass(frozen=True)
class BoundaryVerdict:
    """What every rank decides at a step boundary, from one reduction."""

    sigterm: bool
    save: Decision
    best_metric: float | None
    """The monitored metric a save records: rank 0's finite value, agreed; None without one."""


def decide_at_boundary(
    agreement: StepAgreement,
    schedule: Schedule,
    step: int,
    value: float | None,
    *,
    sigterm: bool,
    last_save_at: float,
    best: Best | None,
) -> BoundaryVerdict:
    """Collective: agree on a SIGTERM anywhere, a passed interval and rank 0's metric, then
    take the save decision every rank shares (rank 0's ``value``; others pass theirs, unused)."""
    coordinator = agreement.coordinator
    rank0 = coordinator.rank == 0
    if not agreement.due():  # no collective at this boundary: the schedule's steps alone
        return BoundaryVerdict(False, save_decision(schedule, step, False, None, best), None)
    with progress.section("collective") if coordinator.world > 1 else nullcontext():
        agreed = agreement.agree(  # a wait for the slowest rank: a hang verdict looks past it
            sigterm,
            schedule.time_due(time.monotonic() - last_save_at),
            metric_flag(value) if rank0 else 0.0,
            value if rank0 and value is not None and math.isfinite(value) else -math.inf,
            last_save_at,
        )
    if agreed.metric_flag == 2.0 and rank0:
        log.warning("step %d: %s is %s; not recorded", step, schedule.monitor, value)
    best_metric = agreed.metric if agreed.metric_flag == 1.0 else None
    decision = save_decision(schedule, step, agreed.time_due, best_metric, best)
    return BoundaryVerdict(agreed.sigterm, decision, best_metric)
