"""The recovery ledger (issue 48, `status.recoveries`): its arithmetic (`policy.ledger`), its
bounds, and an in-place restart written phase by phase by the plans that see each phase
end, completed from the ranks' milestones (the tenant's word, held inside the operator's
own bracket)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from rtj_test_support import NOW, supervisor_reports
from rtj_world import jobset, reading, rtj_raw, snapshot, with_status
from test_in_place import IN_PLACE, KEY, RUNNING, T, supervised_pods
from test_rank_progress import rank

from rtj_operator import reconcile as rc
from rtj_operator.api.ledger import (
    MAX_RECOVERY_RECORDS,
    LedgerPhase,
    RecoveryPath,
    RecoveryRecord,
)
from rtj_operator.api.reasons import FailureClass
from rtj_operator.policy import ledger
from rtj_operator.policy import progress as rank_progress
from rtj_operator.reconcile import ledger as recovery_ledger
from rtj_operator.reconcile.builder import PlanBuilder

LATER = 20.0  # seconds after the failure when the new world's ranks have all stepped
POD_CLOCK_AHEAD = 100.0  # the pods' wall clock runs this far ahead of the operator's


def at(seconds: float) -> Any:
    return NOW + timedelta(seconds=seconds)


def iso_at(seconds: float) -> str:
    return at(seconds).isoformat().replace("+00:00", "Z")


def test_the_phases_telescope_from_the_onset_to_the_first_step() -> None:
    record = RecoveryRecord(
        attempt=1, path=RecoveryPath.IN_PLACE, failed_at=at(-2), detected_at=at(0),
        decided_at=at(0), stopped_at=at(1.5), started_at=at(2), restored_at=at(6),
        first_step_at=at(6.25),
    )  # fmt: skip
    phases = ledger.phase_seconds(record)
    assert phases == [
        (LedgerPhase.DETECTED, 2.0),
        (LedgerPhase.DECIDED, 0.0),
        (LedgerPhase.STOPPED, 1.5),
        (LedgerPhase.STARTED, 0.5),
        (LedgerPhase.RESTORED, 4.0),
        (LedgerPhase.FIRST_STEP, 0.25),
    ]  # fmt: skip  (no replacement, preflight or rendezvous: folded into the next phase)
    assert sum(s for _, s in phases) == ledger.wall_seconds(record) == 8.25


def _rank(r: int, step: int, marks: dict[str, Any] | None) -> dict[str, Any]:
    entry = rank(r, step, "forward", 0.01)
    return entry if marks is None else {**entry, "milestones": marks}


def _report(pod: str, entry: dict[str, Any], received: float) -> rank_progress.PodReport:
    body = {"schema": 1, "pod_wall_time": received + POD_CLOCK_AHEAD, "hostname": pod,
            "ranks": [entry]}  # fmt: skip
    return rank_progress.PodReport(pod, received, body)


def _marks(restored: float, first: float, step: int = 1200) -> dict[str, Any]:
    """Milestones at operator times, written as the pod's clock shows them."""
    ahead = POD_CLOCK_AHEAD
    return {"restore_began": {"at": restored - 1 + ahead},
            "restored": {"at": restored + ahead, "step": step},
            "first_step": {"at": first + ahead, "step": step + 1}}  # fmt: skip


def test_start_up_is_the_last_rank_on_the_operators_clock_and_inside_its_bracket() -> None:
    since, received = T, T + LATER
    reports = [_report("p0", _rank(0, 1210, _marks(T + 5, T + 6)), received),
               _report("p1", _rank(1, 1210, _marks(T + 7, T + 8)), received)]  # fmt: skip
    found = ledger.start_up(reports, since, 2)
    assert found == ledger.StartUp(T + 6, T + 7, T + 8, 1200)  # the pods' clock placed
    # a rank not yet stepped, a pod short, an older process's marks: not yet
    early = [reports[0], _report("p1", _rank(1, 1200, {"restored": {"at": T + 107}}), received)]
    assert ledger.start_up(early, since, 2) is None
    assert ledger.start_up(reports[:1], since, 2) is None
    stale = [reports[0], _report("p1", _rank(1, 1300, _marks(T - 30, T - 20)), received)]
    assert ledger.start_up(stale, since, 2) is None
    # a lie is held inside the bracket: no phase ends after the report arrived
    liar = [reports[0], _report("p1", _rank(1, 1210, _marks(T + 7, T + 9000)), received)]
    assert ledger.start_up(liar, since, 2) == ledger.StartUp(T + 6, T + 7, received, 1200)
    # an older shim serves no milestones: no ledger tail, and nothing raised
    assert ledger.start_up([_report("p0", _rank(0, 1, None), received)], since, 1) is None
    bad = [_report("p0", _rank(0, 1, {"first_step": {"at": "soon"}}), received)]
    assert ledger.start_up(bad, since, 1) is None


def test_the_ledger_keeps_the_newest_records_first_and_no_more() -> None:
    raw = rtj_raw(RUNNING, **IN_PLACE)
    b = PlanBuilder(snapshot(raw), snapshot(raw).rtj.status)
    for n in range(MAX_RECOVERY_RECORDS + 4):
        recovery_ledger.open_record(
            b, RecoveryPath.IN_PLACE, FailureClass.UNKNOWN, at(n), detected_at=at(n),
            generation=n + 1,
        )  # fmt: skip
    kept = b.status.recoveries
    assert len(kept) == MAX_RECOVERY_RECORDS
    assert [r.generation for r in kept] == list(range(MAX_RECOVERY_RECORDS + 4, 4, -1))
    with pytest.raises(ValueError, match="recoveries"):
        b.status.model_validate(
            {"recoveries": [r.model_dump(by_alias=True) for r in [*kept, kept[0]]]}
        )


def _readings(
    pods: list[dict[str, Any]],
    states: list[tuple[int, str, int | None]],
    ranks: list[dict[str, Any]] | None = None,
    received: float = T,
) -> rc.RankReadings:
    names = [p["metadata"]["name"] for p in pods]
    sups = {n: {"generation": g, "state": s, "exit_code": c, "updated_wall_time": received - 1}
            for n, (g, s, c) in zip(names, states, strict=True)}  # fmt: skip
    reports = tuple(_report(n, e, received) for n, e in zip(names, ranks or [], strict=False))
    return rc.RankReadings(attempt=1, reports=reports, polled_at=received,
                           supervisors=supervisor_reports(sups))  # fmt: skip


def _plan(raw: dict[str, Any], pods: list[dict[str, Any]], readings: rc.RankReadings,
          now: float = 0.0, **extra: Any) -> rc.Plan:  # fmt: skip
    snap = snapshot(raw, jobsets=[jobset(1)], pods=pods, now=at(now), **extra)
    return rc.plan(replace(snap, ranks=readings, control_key=KEY))


def test_an_in_place_restart_is_written_phase_by_phase_and_completed_from_milestones() -> None:
    pods = supervised_pods()
    raw = rtj_raw(RUNNING, **IN_PLACE)
    stepping = [_rank(0, 1250, None), _rank(1, 1250, None)]
    failed = _plan(raw, pods, _readings(pods, [(0, "running", None), (0, "exited", 1)], stepping))
    raw = with_status(raw, failed)
    (record,) = raw["status"]["recoveries"]
    assert (record["path"], record["generation"], record["replacement"]) == ("InPlace", 1, "None")
    assert record["decidedAt"] == record["detectedAt"] and record["stepAtFailure"] == 1250
    assert not record["complete"]
    stopped = _plan(raw, pods, _readings(pods, [(1, "stopped", None)] * 2), 1.0,
                    store=reading(1200))  # fmt: skip
    raw = with_status(raw, stopped)
    running = _readings(pods, [(1, "running", None)] * 2, received=T + 3)
    raw = with_status(raw, _plan(raw, pods, running, 3.0))
    record = raw["status"]["recoveries"][0]
    assert (record["stoppedAt"], record["startedAt"]) == (iso_at(1), iso_at(3)) and not record[
        "complete"
    ]
    # every rank has stepped (rank 1 last); the pods' clock runs 100 s ahead of ours
    stepped = [_rank(0, 1210, _marks(T + 4, T + 5)), _rank(1, 1210, _marks(T + 6, T + 7))]
    done = _plan(raw, pods, _readings(pods, [(1, "running", None)] * 2, stepped, T + LATER), LATER)
    raw = with_status(raw, done)
    record = raw["status"]["recoveries"][0]
    assert record["complete"] and record["resumedStep"] == 1200
    assert record["stepsRetrained"] == 50  # 1250 reached, 1200 restored
    assert (record["rendezvousAt"], record["restoredAt"], record["firstStepAt"]) == (
        iso_at(5),
        iso_at(6),
        iso_at(7),
    )  # fmt: skip  (no rendezvous milestone: the collective restore's start stands for it)
    observed = [m for m in done.metrics if m.kind == "ledger_phase"]
    assert [m.phase for m in observed] == [
        LedgerPhase.DETECTED, LedgerPhase.DECIDED, LedgerPhase.STOPPED, LedgerPhase.STARTED,
        LedgerPhase.RENDEZVOUS, LedgerPhase.RESTORED, LedgerPhase.FIRST_STEP,
    ]  # fmt: skip
    onset = RecoveryRecord.model_validate(record).failed_at
    assert onset is not None
    assert sum(m.value for m in observed) == pytest.approx((at(7) - onset).total_seconds())
    assert [m.value for m in done.metrics if m.kind == "steps_retrained"] == [50]
    # completed: later plans leave it as it is
    again = _plan(raw, pods, _readings(pods, [(1, "running", None)] * 2, stepped, T + 30), 30)
    assert (
        again.status_patch is None
        or "recoveries" not in again.status_patch.status
        or (again.status_patch.status["recoveries"] == raw["status"]["recoveries"])
    )
    assert not [m for m in again.metrics if m.kind == "ledger_phase"]


def test_the_old_world_stopped_when_its_pods_did_not_when_the_replacement_came() -> None:
    """A replacement pod (created after the restart began) is no pod of the old world: the
    survivors' stop ends `stopped`, and the wait for the replacement is `replacementReady`'s."""
    pods = supervised_pods()
    raw = rtj_raw(RUNNING, **IN_PLACE)
    failed = _plan(raw, pods, _readings(pods, [(0, "running", None), (0, "exited", 1)]))
    raw = with_status(raw, failed)
    snap = replace(snapshot(raw, jobsets=[jobset(1)], pods=pods, now=at(2)), control_key=KEY)
    b = PlanBuilder(snap, snap.rtj.status)
    state = b.status.in_place
    assert state is not None
    fresh = {**pods[1], "metadata": {**pods[1]["metadata"], "name": "llm-a1-worker-0-1-new",
                                     "creationTimestamp": iso_at(1)}}  # fmt: skip
    survivor = pods[0]["metadata"]["name"]
    report = {"generation": 1, "state": "stopped", "exit_code": None, "updated_wall_time": T}
    stopped = supervisor_reports({survivor: report})
    recovery_ledger.note_old_world_stopped(b, state, [pods[0], fresh], stopped, [])
    assert b.status.recoveries[0].stopped_at == at(2)
    # the same with a pod of the old world not yet stopped: not yet
    b = PlanBuilder(snap, snap.rtj.status)
    recovery_ledger.note_old_world_stopped(b, state, [pods[0], pods[1]], stopped, [])
    assert b.status.recoveries[0].stopped_at is None
