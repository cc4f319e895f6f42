"""Each job's share of a progress-poll round (issue 42, finding 4): slow pods cost their
own job, never the others'.

The poller's workers answer every polled pod of every job in one round; a round's length is
the worker time its pods take over the number of workers. Pods whose answers come slowly
but validly (just inside the request timeout) would otherwise stretch every round for every
job: ~250 pods answering in 1.9 s each push a 16-worker round past the 30 s a report stays
evidence (`policy.progress.DEFAULT_MAX_REPORT_AGE`), and then *other* jobs' reports age out.

So every job gets a budget of worker time per round, in proportion to the pods it has
(`job_budget`: `pod_share` seconds a pod, at least `min_job_budget`), and a pod is asked
only while its job's predicted spend is within it (`choose`). A pod's predicted cost is
what its last exchange took (one never asked costs `pod_share`). The pods not asked keep
their last report (which ages out by itself, as an unanswered pod's does: never a Hang by
itself) and go first in the job's next round, so every pod of a slow job is still read in
turn, and pods with a restart order still to carry out go before them all. A job whose pods
answer as the progress sidecar does (milliseconds) never meets its budget.

Pure: the poller (`rank_polls`) measures and applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

POD_SHARE = 0.1
"""Seconds of poller worker time a job may spend per polled pod per round. A progress
sidecar answers in milliseconds; at 1,250 pods each spending all of it, a 16-worker round
takes ~8 s, well inside the 30 s a report stays evidence."""
MIN_JOB_BUDGET = 2.0
"""The least worker time a job gets per round, however few its pods: one pod answering
just inside a 2 s timeout is still read every round."""


@dataclass(frozen=True)
class PodAsk:
    """One pod the poller would ask this round, as its job's budget sees it."""

    pod: str
    cost: float | None
    """What its last exchange took (s); None: never asked (priced at `pod_share`)."""
    waiting: int = 0
    """Rounds in a row it was left out for its job's budget."""
    pressing: bool = False
    """It has a restart order still to carry out."""


def job_budget(pods: int, pod_share: float = POD_SHARE,
               min_job_budget: float = MIN_JOB_BUDGET) -> float:  # fmt: skip
    """A job's worker time per round (s) for `pods` polled pods."""
    return max(min_job_budget, pods * pod_share)


def choose(asks: Sequence[PodAsk], budget: float, pod_share: float = POD_SHARE
           ) -> tuple[list[str], list[str]]:  # fmt: skip
    """(asked, left out) for one job's round: pods with a restart order out first, then
    those left out longest, then in the job's own order; each is asked while the job's
    predicted spend before it is within `budget` (the first always is)."""
    order = sorted(range(len(asks)), key=lambda i: (not asks[i].pressing, -asks[i].waiting, i))
    asked: list[str] = []
    left_out: list[str] = []
    spent = 0.0
    for i in order:
        ask = asks[i]
        if asked and spent >= budget:
            left_out.append(ask.pod)
            continue
        asked.append(ask.pod)
        spent += pod_share if ask.cost is None else max(ask.cost, 0.0)
    return asked, left_out


def interleave(per_job: Sequence[Sequence[T]]) -> list[T]:
    """Every job's asks in one queue, one of each job in turn: a job with many slow pods
    does not hold the front of a round while the others wait behind it."""
    out: list[T] = []
    longest = max((len(asks) for asks in per_job), default=0)
    for i in range(longest):
        out.extend(asks[i] for asks in per_job if i < len(asks))
    return out
