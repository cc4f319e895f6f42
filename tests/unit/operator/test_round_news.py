"""A progress round that tells a job's last plan nothing new costs no plan (issue 49: at
1,000 jobs every round queued every job for a plan, whether or not a pod had answered).
`reconcile.round_has_news` decides; the controller asks it after each round."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry
from rtj_test_support import NOW
from rtj_world import jobset, rtj_raw, snapshot
from test_rank_progress import FIXED_60, RUNNING, T, rank, readings, running_pods
from test_runtime import FakeKube, _controller

from rtj_operator import reconcile as rc
from rtj_operator.policy.progress import DEFAULT_MAX_REPORT_AGE
from rtj_shim.wire.supervisor_report import SupervisorReport

KEY = ("team-a", "llm")


def silent(pods: list[dict[str, Any]], why: str = "timed out", at: float = T) -> rc.RankReadings:
    """A round in which none of `pods` answered, and none ever had."""
    names = tuple(f"{p['metadata']['name']}: {why}" for p in pods)
    return rc.RankReadings(attempt=1, reports=(), polled_at=at, unanswered=names)


def test_a_round_in_which_no_pod_ever_answered_is_no_news_after_the_first() -> None:
    pods = running_pods()
    first = silent(pods)
    assert rc.round_has_news(None, NOW, first), "the first reading is always planned"
    later = silent(pods, why="connection refused", at=T + 5)
    assert not rc.round_has_news(first, NOW, later), "only the time and the reasons differ"
    fewer = silent(pods[:1], at=T + 5)
    assert rc.round_has_news(first, NOW, fewer), "a pod answering again is news"
    other = replace(later, attempt=2)
    assert rc.round_has_news(first, NOW, other), "another attempt's reading is news"


def test_a_report_still_fresh_when_planned_is_news_in_every_round() -> None:
    """A rank's report can still turn into a Hang as time passes, though no pod answered."""
    pods = running_pods()
    stuck = readings(pods, rank(0, 812, "allreduce", 30.0), rank(1, 812, "forward", 31.0))
    quiet = replace(stuck, polled_at=T + 35, unanswered=tuple(
        f"{p['metadata']['name']}: timed out" for p in pods))  # fmt: skip
    planned_at = NOW + timedelta(seconds=5)
    assert rc.round_has_news(replace(quiet, polled_at=T + 5), planned_at, quiet)
    # the same reports, planned when they had aged out: nothing they hold moves any more
    aged = NOW + timedelta(seconds=DEFAULT_MAX_REPORT_AGE + 1)
    assert not rc.round_has_news(replace(quiet, polled_at=T + 5), aged, quiet)


def test_a_new_answer_or_a_supervisor_report_is_news() -> None:
    pods = running_pods()
    old = readings(pods, rank(0, 812, "forward", 1.0), rank(1, 812, "forward", 1.0), age=60)
    planned_at = NOW
    answered = readings(pods, rank(0, 813, "forward", 0.1), rank(1, 813, "forward", 0.1))
    assert not rc.round_has_news(old, planned_at, replace(old, polled_at=T + 5))
    assert rc.round_has_news(old, planned_at, answered)
    name = pods[0]["metadata"]["name"]
    report = SupervisorReport.parse({"generation": 1, "state": "running"})
    assert rc.round_has_news(old, planned_at, replace(old, supervisors={name: report}))


def test_a_skipped_round_would_have_decided_what_the_plan_before_it_did() -> None:
    """What no news means for the plan: the same decision later, and the hang the same
    reports would show while fresh is still found."""
    pods = running_pods()
    stuck = (rank(0, 812, "allreduce", 93.0), rank(1, 812, "forward", 94.0))
    raw = rtj_raw(RUNNING, replicas=2, **FIXED_60)
    stale = readings(pods, *stuck, age=45)

    def phase(reading: rc.RankReadings, seconds: float) -> str | None:
        snap = snapshot(raw, jobsets=[jobset(1)], pods=pods, now=NOW + timedelta(seconds=seconds))
        patch = rc.plan(replace(snap, ranks=reading)).status_patch
        return patch.status["phase"] if patch is not None else None

    assert not rc.round_has_news(stale, NOW, replace(stale, polled_at=T + 600))
    assert phase(stale, 0) == phase(stale, 600) != "Restarting"
    fresh = readings(pods, *stuck)
    assert rc.round_has_news(fresh, NOW, replace(fresh, polled_at=T + 5))
    assert phase(fresh, 5) == "Restarting"


async def take_all(c: Any) -> int:
    """Take every key queued (as a worker would, without planning it): how many there were."""
    n = len(c.queue)
    for _ in range(n):
        c.queue.done(await c.queue.get())
    return n


def test_the_controller_plans_a_silent_job_once_not_every_round() -> None:
    async def scenario() -> None:
        c = _controller(FakeKube(), CollectorRegistry())
        status = {"phase": "Running", "attempt": 1, "attempts": [{"attempt": 1,
                  "jobSet": "llm-a1"}]}  # fmt: skip
        c.on_rtj(None, rtj_raw(status))
        c.on_jobset(None, jobset(1))
        pods = running_pods()
        for p in pods:
            c.on_pod(None, p)
        await take_all(c)
        await c.reconcile(KEY)
        assert KEY in c.planned_ranks and c.planned_ranks[KEY][0] is None

        async def round_(reading: rc.RankReadings) -> int:
            c.rank_polls._readings[KEY] = reading
            c._progress_round(KEY)
            return await take_all(c)

        assert await round_(silent(pods)) == 1, "the first reading is planned"
        await c.reconcile(KEY)
        assert c.planned_ranks[KEY][0] == silent(pods)
        assert [await round_(silent(pods, at=T + 5 * i)) for i in range(1, 4)] == [0, 0, 0]
        answered = readings(pods, rank(0, 812, "forward", 0.1), rank(1, 812, "forward", 0.1))
        assert await round_(answered) == 1, "an answer is planned"
        c.executor.shutdown()

    asyncio.run(scenario())
