"""A progress round that tells a job's last plan nothing new costs no plan (issue 49: at
1,000 jobs every round queued every job for a plan, whether or not a pod had answered, and
with every sidecar answering every round was news). `reconcile.round_has_news` decides; the
controller asks it after each round."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from rtj_test_support import NOW
from rtj_world import jobset, rtj_raw, snapshot
from test_rank_progress import FIXED_60, RUNNING, T, rank, report, running_pods
from test_runtime import FakeKube, _controller

from rtj_operator import reconcile as rc
from rtj_operator.api.detection_spec import ProgressMonitoring
from rtj_operator.policy import progress as rank_progress
from rtj_operator.policy.stragglers import Straggler
from rtj_operator.reconcile.ranks import SUMMARY_EVERY
from rtj_operator.reconcile.round_news import PlannedRound
from rtj_shim.wire.supervisor_report import SupervisorReport

KEY = ("team-a", "llm")
AUTO = ProgressMonitoring()
FIXED = ProgressMonitoring.model_validate(FIXED_60["progress"])


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def planned(
    reading: rc.RankReadings | None, when: datetime, spec: ProgressMonitoring = AUTO
) -> PlannedRound:
    """What the controller keeps of a plan made at `when` from `reading`."""
    return PlannedRound(reading, when, spec)


def silent(
    pods: list[dict[str, Any]], why: str = "timed out", polled: float = T
) -> rc.RankReadings:
    """A round in which none of `pods` answered, and none ever had."""
    names = tuple(f"{p['metadata']['name']}: {why}" for p in pods)
    return rc.RankReadings(attempt=1, reports=(), polled_at=polled, unanswered=names)


def answered(
    pods: list[dict[str, Any]], seconds: float, *ranks: dict[str, Any], **kw: Any
) -> rc.RankReadings:
    """A round `seconds` after NOW in which every pod answered with its rank in `ranks`."""
    reports = tuple(
        replace(report(p["metadata"]["name"], r), received_at=T + seconds)
        for p, r in zip(pods, ranks, strict=True)
    )
    return rc.RankReadings(attempt=1, reports=reports, polled_at=T + seconds, **kw)


def training(pods: list[dict[str, Any]], seconds: float, **kw: Any) -> rc.RankReadings:
    """Every rank 20 steps a second past step 800 at NOW, read mid-step."""
    step = 800 + int(seconds * 20)
    return answered(
        pods, seconds, rank(0, step, "forward", 0.02), rank(1, step, "backward", 0.01), **kw
    )


def test_a_round_in_which_no_pod_ever_answered_is_no_news_after_the_first() -> None:
    pods = running_pods()
    first = silent(pods)
    assert rc.round_has_news(planned(None, NOW), first, NOW), "the first reading is planned"
    later = silent(pods, why="connection refused", polled=T + 5)
    assert not rc.round_has_news(planned(first, NOW), later, at(600)), "only the time and why"
    fewer = silent(pods[:1], polled=T + 5)
    assert rc.round_has_news(planned(first, NOW), fewer, at(5)), "a pod answering is news"
    other = replace(later, attempt=2)
    assert rc.round_has_news(planned(first, NOW), other, at(5)), "another attempt is news"


@pytest.mark.parametrize("spec", [AUTO, FIXED], ids=["auto", "fixed-60s"])
def test_rounds_whose_steps_only_advance_are_planned_once_per_summary_period(
    spec: ProgressMonitoring,
) -> None:
    pods = running_pods()
    last = planned(training(pods, 0), NOW, spec)
    news = [rc.round_has_news(last, training(pods, s), at(s)) for s in range(5, 65, 5)]
    due = int(SUMMARY_EVERY.total_seconds() // 5)
    assert news == [False] * (due - 1) + [True] * (12 - due + 1), "the step shows every 30 s"
    same_step = answered(pods, 50, rank(0, 800, "forward", 0.02), rank(1, 800, "backward", 0.01))
    assert not rc.round_has_news(last, same_step, at(50)), "nothing the plan shows moved"


def test_a_round_is_news_whenever_a_plan_from_it_could_find_a_hang() -> None:
    """The safety of skipping: over rounds in which one rank freezes, every round whose plan
    records a Hang is news, and the first such round is the first round past its allowance
    (the auto allowance here: 30 s, the floor). Before it, only the shown step (30 s after
    the plan) and the allowance coming due are news."""
    pods = running_pods()
    raw = rtj_raw(RUNNING, replicas=2)
    last = planned(training(pods, 0), NOW)
    frozen_at = 10.0
    rows = []
    for s in range(5, 80, 5):
        step = 800 + int(s * 20)
        stuck = rank(1, 800 + int(frozen_at * 20), "backward", max(0.01, s - frozen_at))
        reading = answered(pods, s, rank(0, step, "allreduce", max(0.01, s - frozen_at)), stuck)
        snap = replace(snapshot(raw, jobsets=[jobset(1)], pods=pods, now=at(s)), ranks=reading)
        patch = rc.plan(snap).status_patch
        hang = patch is not None and patch.status.get("phase") == "Restarting"
        news = rc.round_has_news(last, reading, at(s))
        rows.append((s, news, hang))
        if news and not hang:
            last = planned(reading, at(s))
    assert all(news for _, news, hang in rows if hang), rows
    first_hang = next(s for s, _, hang in rows if hang)
    assert first_hang == 45, rows  # frozen at 10 s, 30 s allowed, then the next round
    early = [s for s, news, _ in rows if news and s < first_hang]
    assert early == [30, 40], rows  # the step shown at 30 s; the allowance due at 40 s


def test_a_straggler_a_silent_pod_a_bad_report_a_mark_or_a_supervisor_report_is_news() -> None:
    pods = running_pods()
    names = [p["metadata"]["name"] for p in pods]
    last = planned(training(pods, 0), NOW)
    slow = Straggler(1, names[1], 0.08, 0.05, 3)
    assert rc.round_has_news(last, training(pods, 5, stragglers=(slow,)), at(5))
    quiet = replace(training(pods, 0), polled_at=T + 5, unanswered=(f"{names[1]}: timed out",))
    assert rc.round_has_news(last, quiet, at(5)), "a pod newly silent"
    back = planned(quiet, at(5))
    assert rc.round_has_news(back, training(pods, 10), at(10)), "a pod answering again"
    bad = training(pods, 5)
    body = {**bad.reports[1].body, "ranks": [{"rank": "one"}]}
    bad = replace(bad, reports=(bad.reports[0], replace(bad.reports[1], body=body)))
    assert rank_progress.parse_reports(bad.reports, T + 5).bad_pods == (names[1],)
    assert rc.round_has_news(last, bad, at(5)), "a report that is no report"
    costs = {"durable": {"seconds": 1.9, "saves": 1}}
    measured = training(pods, 5)
    body = {**measured.reports[0].body, "ranks": [{**measured.reports[0].body["ranks"][0],
                                                   "save_costs": costs}]}  # fmt: skip
    measured = replace(measured, reports=(replace(measured.reports[0], body=body),
                                          measured.reports[1]))  # fmt: skip
    assert rc.round_has_news(last, measured, at(5)), "a tier's first save cost"
    body = {**body, "ranks": [{**body["ranks"][0], "milestones": {"first_step": {"at": T}}}]}
    marked = replace(measured, reports=(replace(measured.reports[0], body=body),
                                        measured.reports[1]))  # fmt: skip
    assert rc.round_has_news(planned(measured, at(5)), marked, at(6)), "a milestone"
    state = SupervisorReport.parse({"generation": 1, "state": "running"})
    assert rc.round_has_news(last, training(pods, 5, supervisors={names[0]: state}), at(5))


def test_the_first_step_of_every_rank_is_news() -> None:
    """A recovery's record completes once the new world stepped (`ledger.settle`): that
    round is planned at once, not with the next summary."""
    pods = running_pods()
    starting = answered(pods, 0, rank(0, None, "restore", 4.0), rank(1, None, "restore", 4.0))
    last = planned(starting, NOW)
    one = answered(pods, 5, rank(0, 0, "forward", 0.02), rank(1, None, "restore", 9.0))
    assert rc.round_has_news(last, one, at(5)), "rank 0's first step"
    last = planned(one, at(5))
    still = answered(pods, 10, rank(0, 100, "forward", 0.02), rank(1, None, "restore", 14.0))
    assert not rc.round_has_news(last, still, at(10))
    both = answered(pods, 15, rank(0, 200, "forward", 0.02), rank(1, 0, "forward", 0.01))
    assert rc.round_has_news(last, both, at(15)), "every rank stepped"


def test_a_report_aging_out_of_the_evidence_is_news() -> None:
    pods = running_pods()
    reading = training(pods, 0)
    last = planned(reading, NOW)
    kept = replace(reading, polled_at=T + 25)
    assert not rc.round_has_news(last, kept, at(25))
    age = rank_progress.DEFAULT_MAX_REPORT_AGE
    assert rc.round_has_news(last, replace(reading, polled_at=T + age), at(age))
    aged = planned(kept, at(age + 1))
    assert not rc.round_has_news(aged, replace(reading, polled_at=T + 600), at(600))


def test_a_skipped_round_would_have_decided_what_the_plan_before_it_did() -> None:
    """What no news means for the plan: the same decision later, and the hang the same
    reports would show while fresh is still found."""
    pods = running_pods()
    stuck = (rank(0, 812, "allreduce", 93.0), rank(1, 812, "forward", 94.0))
    raw = rtj_raw(RUNNING, replicas=2, **FIXED_60)
    stale = replace(answered(pods, 0, *stuck), reports=tuple(
        replace(r, received_at=T - 45) for r in answered(pods, 0, *stuck).reports))  # fmt: skip

    def phase(reading: rc.RankReadings, seconds: float) -> str | None:
        snap = snapshot(raw, jobsets=[jobset(1)], pods=pods, now=at(seconds))
        patch = rc.plan(replace(snap, ranks=reading)).status_patch
        return patch.status["phase"] if patch is not None else None

    assert not rc.round_has_news(
        planned(stale, NOW, FIXED), replace(stale, polled_at=T + 600), at(600)
    )
    assert phase(stale, 0) == phase(stale, 600) != "Restarting"
    fresh = answered(pods, 0, *stuck)
    assert rc.round_has_news(planned(fresh, NOW, FIXED), replace(fresh, polled_at=T + 5), at(5))
    assert phase(fresh, 5) == "Restarting"


async def take_all(c: Any) -> int:
    """Take every key queued (as a worker would, without planning it): how many there were."""
    n = len(c.queue)
    for _ in range(n):
        c.queue.done(await c.queue.get())
    return n


def test_the_controller_plans_a_silent_job_once_and_a_training_one_per_summary() -> None:
    async def scenario() -> None:
        clock = [NOW]
        c = _controller(FakeKube(), CollectorRegistry())
        c.clock = lambda: clock[0]
        status = {"phase": "Running", "attempt": 1, "attempts": [{"attempt": 1,
                  "jobSet": "llm-a1"}]}  # fmt: skip
        c.on_rtj(None, rtj_raw(status))
        c.on_jobset(None, jobset(1))
        pods = running_pods()
        for p in pods:
            c.on_pod(None, p)
        await take_all(c)
        await c.reconcile(KEY)
        assert c.planned_rounds[KEY].digest is None

        async def round_(reading: rc.RankReadings, seconds: float) -> int:
            clock[0] = at(seconds)
            c.rank_polls._readings[KEY] = reading
            c._progress_round(KEY)
            return await take_all(c)

        assert await round_(silent(pods), 0) == 1, "the first reading is planned"
        await c.reconcile(KEY)
        assert c.planned_rounds[KEY].digest == planned(silent(pods), NOW).digest
        assert [await round_(silent(pods, polled=T + 5 * i), 5 * i) for i in range(1, 4)] == [
            0,
            0,
            0,
        ]
        assert await round_(training(pods, 20), 20) == 1, "an answer is planned"
        await c.reconcile(KEY)
        queued = [await round_(training(pods, s), s) for s in range(25, 55, 5)]
        assert queued == [0, 0, 0, 0, 0, 1], "steps that only advance: one plan per 30 s"
        c.executor.shutdown()

    asyncio.run(scenario())
