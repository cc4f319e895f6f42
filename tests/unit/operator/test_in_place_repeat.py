"""A pod whose trainer fails first again soon after its restart in place is re-created, not
restarted in the same pod (issue 43: the second fault of a node that breaks every trainer
put on it): its new pod runs the platform's preflight, which judges the node. The rule rests
on the tenant's exits, so it quarantines nothing and only touches the tenant's own pod."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from rtj_test_support import NOW, supervisor_reports
from rtj_world import jobset, reading, rtj_raw, snapshot, with_status
from test_in_place import IN_PLACE, RUNNING, T
from test_in_place_replace import replaceable_pods

from rtj_operator import reconcile as rc
from rtj_operator.policy.in_place import REPEAT_WINDOW


def _readings(pods: list[dict[str, Any]], *states: tuple[int, str, int | None],
              at: float = T) -> rc.RankReadings:  # fmt: skip
    reports = {p["metadata"]["name"]: {"generation": g, "state": s, "exit_code": c,
                                       "updated_wall_time": at - 1}
               for p, (g, s, c) in zip(pods, states, strict=True)}  # fmt: skip
    return rc.RankReadings(attempt=1, reports=(), polled_at=at,
                           supervisors=supervisor_reports(reports))  # fmt: skip


def _plan(raw: dict[str, Any], pods: list[dict[str, Any]], ranks: rc.RankReadings,
          after: float = 0.0, **extra: Any) -> rc.Plan:  # fmt: skip
    snap = snapshot(raw, jobsets=[jobset(1)], pods=pods, now=NOW + timedelta(seconds=after),
                    **extra)  # fmt: skip
    return rc.plan(replace(snap, ranks=ranks, control_key="0123456789abcdef" * 4))


def _restarted_once(pods: list[dict[str, Any]]) -> dict[str, Any]:
    """Pod 1's trainer exited; the world restarted in place (generation 1) and runs."""
    raw = rtj_raw(RUNNING, **IN_PLACE)
    raw = with_status(
        raw, _plan(raw, pods, _readings(pods, (0, "running", None), (0, "exited", 1)))
    )
    stopped = _readings(pods, (1, "stopped", None), (1, "stopped", 1))
    raw = with_status(raw, _plan(raw, pods, stopped, store=reading(1200)))
    raw = with_status(raw, _plan(raw, pods, _readings(pods, (1, "running", None),
                                                      (1, "running", None))))  # fmt: skip
    assert "inPlace" not in raw["status"], raw["status"].get("inPlace")
    (entry,) = raw["status"]["attempts"][0]["inPlaceRestarts"]
    assert entry["outcome"] == "Running" and entry["replaced"] == []
    return raw


def test_a_pod_that_fails_first_again_soon_after_its_restart_is_recreated() -> None:
    pods = replaceable_pods()
    names = [p["metadata"]["name"] for p in pods]
    raw = _restarted_once(pods)
    again = _readings(pods, (1, "running", None), (1, "exited", 1), at=T + 30)
    p = _plan(raw, pods, again, after=30)
    raw = with_status(raw, p)
    state = raw["status"]["inPlace"]
    assert (state["phase"], state["replacing"]) == ("Stopping", [names[1]])
    entry = raw["status"]["attempts"][0]["inPlaceRestarts"][-1]
    assert entry["generation"] == 2 and entry["failureClass"] == "Unknown"
    assert entry["replaced"] == [f"{names[1]} on {pods[1]['spec']['nodeName']}"]
    assert "failed first again" in entry["evidence"][0], entry["evidence"]
    # the tenant's exits quarantine nothing; its own pod is deleted for its Job to re-create
    assert not raw["status"].get("quarantinedNodes")
    deleted = [a for a in p.actions if isinstance(a, rc.DeletePod)]
    assert [a.name for a in deleted] == [names[1]]
    assert raw["status"]["restarts"]["infrastructure"] == 2, "paid from the job's own budget"


def test_another_pod_failing_or_a_late_repeat_restarts_in_place_as_before() -> None:
    """Another pod first; the same pod after the window; the same pod once the restarted
    world had trained (its recovery record's first step: a new fault, as the soak injects)."""
    pods = replaceable_pods()
    late = REPEAT_WINDOW.total_seconds() + 30
    for who, after, trained in ((0, 30.0, False), (1, late, False), (1, 30.0, True)):
        raw = _restarted_once(pods)
        (record,) = [r for r in raw["status"]["recoveries"] if r.get("generation") == 1]
        assert record.get("firstStepAt") is None, record
        if trained:
            record["firstStepAt"] = (NOW + timedelta(seconds=10)).isoformat()
        states = [(1, "running", None), (1, "running", None)]
        states[who] = (1, "exited", 1)
        p = _plan(raw, pods, _readings(pods, *states, at=T + after), after=after)
        raw = with_status(raw, p)
        assert raw["status"]["inPlace"]["replacing"] == [], (who, after, trained)
        assert not [a for a in p.actions if isinstance(a, rc.DeletePod)]
        entry = raw["status"]["attempts"][0]["inPlaceRestarts"][-1]
        assert entry["generation"] == 2 and entry["replaced"] == []
        assert not any("failed first again" in line for line in entry["evidence"])
