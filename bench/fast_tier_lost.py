"""bench.fast_tier, section 3: the steps a failure loses with and without the fast tier,
from the measured stalls (arithmetic only)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.common import med
from bench.fast_tier_results import SizeResult


def contention_s(r: SizeResult) -> float:
    """Training time one background save takes from the steps it overlaps on these shared
    cores (their time less as many plain steps; the stall is counted apart)."""
    if not r.async_overlap:
        return 0.0
    extra = [seconds - n * r.step_median for n, seconds in r.async_overlap]
    return max(0.0, med(extra))


def publish_steps(r: SizeResult) -> int:
    """Steps one background save takes to publish: the shortest async interval (the next
    save waits for it)."""
    return max(1, math.ceil(med(r.async_published_s) / r.step_median))


def durable_options(r: SizeResult) -> list[tuple[str, float, int]]:
    """(the durable tier, its cost per save in seconds of training time, its shortest
    interval in steps)."""
    options = [("blocking, local fs", med(r.stalls["durable"]), 1)]
    if r.s3_save_s:
        options.append(("blocking, S3 (loopback moto)", med(r.s3_save_s), 1))
    stall, floor = med(r.stalls["durable async"]), publish_steps(r)
    options.append(("async, local fs: stall only (a GPU trainer)", stall, floor))
    options.append(
        ("async, local fs: stall + the CPU it takes from training (this trainer)",
         stall + contention_s(r), floor)
    )  # fmt: skip
    return options


@dataclass(frozen=True)
class LostRow:
    """One durable tier at one interval, alone and with the fast tier beside it: the stall
    overhead and the steps a failure loses on average (half the interval of the tier the
    job resumes from)."""

    durable: str
    durable_every: int  # M
    fast_every: int  # K
    overhead: float  # the durable tier's cost, a fraction of training time
    fast_overhead: float  # the fast tier's, added when it runs beside
    lost_alone: float  # M / 2: any failure, durable tier alone
    lost_with_fast: float  # min(K, M) / 2: a failure the pod survives, both tiers
    step_s: float


def fast_floor(r: SizeResult) -> int:
    """The fewest steps between fast saves: one is written in the background, and the next
    due while it is still being written is skipped."""
    if not r.fast_written_s or r.step_median <= 0:
        return 1
    return max(1, math.ceil(med(r.fast_written_s) / r.step_median - 1e-9))


def practical_interval(cost_s: float, step_s: float, budget: float, floor: int = 1) -> int:
    """The most frequent interval (in steps) whose cost is at most ``budget`` of the
    training time: ``cost / (interval * step) <= budget``; at least ``floor``."""
    if step_s <= 0:
        return floor
    return max(floor, math.ceil(cost_s / (budget * step_s) - 1e-9))


def lost_rows(
    r: SizeResult, budget: float | None, save_every: int, fast_every: int
) -> list[LostRow]:
    """With ``budget``: every tier at the most frequent interval whose cost is at most
    ``budget`` of training time (an async durable tier also at least the steps one save
    takes to publish). Without: the durable tier every ``save_every`` steps (the example
    trainer's ``--save-every``, or the async floor), the fast tier every ``fast_every``.

    With both tiers, a failure the pod survives resumes from the newer step of the two
    (the operator pins a fast step only when it is newer than the durable one): half of
    min(K, M) is lost; a node loss takes the pod's memory and still loses M / 2."""
    step = r.step_median
    fast = med(r.stalls["fast"])
    floor = fast_floor(r)
    k = max(fast_every, floor) if budget is None else practical_interval(fast, step, budget, floor)
    rows = []
    for name, cost, floor in durable_options(r):
        if budget is None:
            m = max(save_every, floor)
        else:
            m = practical_interval(cost, step, budget, floor)
        rows.append(
            LostRow(name, m, k, cost / (m * step), fast / (k * step), m / 2, min(k, m) / 2, step)
        )
    return rows
