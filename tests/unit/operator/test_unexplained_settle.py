"""An unexplained failure waits UNEXPLAINED_SETTLE for the Events that would explain it: Kueue
records `Stopped` after it suspends the JobSet whose pods the operator then sees go, and a
failure read from the Event watch at once was recorded Unknown one time in four
(`e2e/scenarios/test_restart_budgets.py`, the Kueue preemption)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rtj_test_support import FIXTURES, NOW, load_json
from rtj_world import jobset, pod, rtj_raw, snapshot
from test_reconcile import running, status_of

from rtj_operator import reconcile as rc
from rtj_operator.reconcile.detect import UNEXPLAINED_SETTLE


def kueue_v017_events() -> tuple[dict[str, Any], ...]:
    """Kueue v0.17.0's Events preempting `llm-a1` (tests/fixtures/classify, sources there)."""
    found = load_json(FIXTURES / "classify" / "preempted_by_kueue_v017" / "events.json")
    return tuple(found["items"])


def sigkilled() -> rc.Snapshot:
    raw = rtj_raw(running())
    pods = [pod(1, 0, exit_code=137, reason="Error", message=""), pod(1, 1)]
    return replace(snapshot(raw, jobsets=[jobset(1)], pods=pods), events=())


def test_an_unexplained_failure_is_not_recorded_inside_its_window() -> None:
    plan = rc.plan(sigkilled())
    assert plan.status_patch is None and not plan.actions, plan.summary
    assert plan.requeue_after is not None
    assert 0 < plan.requeue_after <= UNEXPLAINED_SETTLE.total_seconds()
    assert "settle window" in plan.summary


def test_the_events_landing_inside_the_window_explain_it_at_once() -> None:
    snap = sigkilled()
    raw = rtj_raw(running())
    plan = rc.plan(replace(snap, events=kueue_v017_events()))
    assert status_of(plan, raw)["attempts"][0]["failureClass"] == "Preempted"


def test_past_the_window_the_failure_is_recorded_unknown() -> None:
    snap = sigkilled()
    raw = rtj_raw(running())
    plan = rc.plan(replace(snap, now=NOW + UNEXPLAINED_SETTLE))
    assert status_of(plan, raw)["attempts"][0]["failureClass"] == "Unknown"


def test_an_explained_failure_is_recorded_at_once() -> None:
    raw = rtj_raw(running())
    pods = [pod(1, 0, exit_code=1, message="RuntimeError: CUDA error: an illegal memory access"
                " was encountered\nXid 79 GPU has fallen off the bus"), pod(1, 1)]  # fmt: skip
    plan = rc.plan(replace(snapshot(raw, jobsets=[jobset(1)], pods=pods), events=()))
    record = status_of(plan, raw)["attempts"][0]
    assert record.get("failureClass") not in (None, "Unknown"), plan.summary
