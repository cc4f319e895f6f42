"""The data alignment check's finding in the plan (issue 43 section 5, operator side): a
pod's supervisor reports the ranks its trainers named after a resume; status shows them
(status.progress.misalignedResume) with one Warning Event, and a finding of an older
generation is not shown again."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rtj_world import rtj_raw, with_status
from test_rank_progress import RUNNING, plan, rank, readings, running_pods

from rtj_operator import reconcile as rc
from rtj_shim.wire.misaligned_resume import MisalignedRanks
from rtj_shim.wire.supervisor_report import SupervisorReport, SupervisorState

FOUND = MisalignedRanks(1216, (1,), (9.5,), 0.03)


def _supervisors(
    pods: list[dict[str, Any]], generation: int, found: MisalignedRanks | None
) -> dict[str, SupervisorReport]:
    names = [p["metadata"]["name"] for p in pods]
    return {
        name: SupervisorReport(generation, SupervisorState.RUNNING, attempt=1,
                               misaligned=found if i == 0 else None)
        for i, name in enumerate(names)
    }  # fmt: skip


def _events(p: rc.Plan) -> list[rc.PostEvent]:
    return [a for a in p.actions if isinstance(a, rc.PostEvent)]


def test_a_misaligned_resume_is_shown_with_one_warning_event() -> None:
    pods = running_pods(2)
    ranks = [rank(i, 1220, "forward", 0.01) for i in range(2)]
    found = readings(pods, *ranks, supervisors=_supervisors(pods, 0, FOUND))
    first = plan(pods, found)
    patch = first.status_patch
    assert patch is not None
    shown = patch.status["progress"]["misalignedResume"]
    assert shown == {"attempt": 1, "generation": 0, "step": 1216, "ranks": [1], "factors": [9.5]}
    events = _events(first)
    assert [(e.reason, e.type) for e in events] == [("ResumeMisaligned", "Warning")]
    assert "rank 1 (9.5x the others' loss)" in events[0].message
    assert "step 1216" in events[0].message and "gpu-node" not in events[0].message
    raw = with_status(rtj_raw(RUNNING, replicas=2), first)
    again = plan(pods, found, raw=raw)
    assert not _events(again), "reported once"
    quiet = plan(pods, replace(found, supervisors={}), raw=raw)
    assert not _events(quiet)
    assert quiet.status_patch is None or (
        quiet.status_patch.status["progress"]["misalignedResume"]["ranks"] == [1]
    ), "kept while the pods stop reporting it"


def test_a_finding_of_another_generation_is_not_this_generations() -> None:
    pods = running_pods(2)
    ranks = [rank(i, 1220, "forward", 0.01) for i in range(2)]
    stale = readings(pods, *ranks, supervisors=_supervisors(pods, 3, FOUND))
    p = plan(pods, stale)
    assert not _events(p)
    patch = p.status_patch
    assert patch is None or patch.status["progress"].get("misalignedResume") is None
