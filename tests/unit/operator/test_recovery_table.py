"""The recovery state machine: the phase each status is in, the transition table's shape
(every phase has a way out, every named function exists), the policy's dispatch through it,
the builder holding plans to it, and DESIGN.md's copy of it."""

from __future__ import annotations

import importlib
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from rtj_test_support import NOW

from rtj_operator.api import Phase, ResilientTrainingJobStatus
from rtj_operator.api.attempts import InPlacePhase
from rtj_operator.api.reasons import InPlaceStage, RecoveryPhase
from rtj_operator.recovery import (
    TRANSITIONS,
    Fact,
    UnlistedTransition,
    allowed,
    check,
    markdown,
    policy_for,
    recovery_phase,
    ways_out,
)

P = RecoveryPhase
DESIGN = Path(__file__).resolve().parents[3] / "docs" / "DESIGN.md"


def _status(**fields: Any) -> ResilientTrainingJobStatus:
    return ResilientTrainingJobStatus(**fields)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, P.NOT_STARTED),
        ({"phase": Phase.SUSPENDED}, P.SUSPENDED),
        ({"phase": Phase.SUSPENDED, "attempt": 3}, P.SUSPENDED),
        ({"phase": Phase.PENDING, "attempt": 1}, P.RUNNING),
        ({"phase": Phase.ADMITTED, "attempt": 1}, P.RUNNING),
        ({"phase": Phase.RUNNING, "attempt": 2}, P.RUNNING),
        ({"phase": Phase.RESTARTING, "attempt": 1, "next_attempt_at": NOW + timedelta(1)},
         P.BACKING_OFF),
        ({"phase": Phase.RESTARTING, "attempt": 1, "next_attempt_at": NOW}, P.STARTING),
        ({"phase": Phase.RESTARTING, "attempt": 1}, P.STARTING),
        ({"phase": Phase.RUNNING, "attempt": 1,
          "in_place": InPlacePhase(generation=1, phase=InPlaceStage.STOPPING, since=NOW)},
         P.STOPPING_IN_PLACE),
        ({"phase": Phase.RUNNING, "attempt": 1,
          "in_place": InPlacePhase(generation=1, phase=InPlaceStage.STARTING, since=NOW)},
         P.STARTING_IN_PLACE),
        ({"phase": Phase.SUCCEEDED, "attempt": 4}, P.SUCCEEDED),
        ({"phase": Phase.FAILED, "attempt": 0}, P.FAILED),
    ],
)  # fmt: skip
def test_the_recovery_phase_is_read_from_the_status(
    fields: dict[str, Any], expected: RecoveryPhase
) -> None:
    assert recovery_phase(_status(**fields), NOW) is expected


def test_the_in_place_stage_read_back_from_json_is_typed() -> None:
    raw = {"generation": 2, "phase": "Starting", "since": NOW.isoformat()}
    assert InPlacePhase.model_validate(raw).phase is InPlaceStage.STARTING
    with pytest.raises(ValueError, match="phase"):
        InPlacePhase.model_validate({**raw, "phase": "Restarting"})


def test_every_phase_but_the_terminal_ones_has_a_way_out_and_every_phase_is_reached() -> None:
    for phase in RecoveryPhase:
        if phase.terminal:
            assert not ways_out(phase), phase
        else:
            assert ways_out(phase), f"{phase.value} has no way out"
    reached = {target for t in TRANSITIONS for target in t.targets}
    assert reached | {P.NOT_STARTED} == set(RecoveryPhase)


def test_every_active_phase_can_still_end() -> None:
    """From every phase some chain of rows reaches Succeeded or Failed."""
    for phase in RecoveryPhase:
        seen, frontier = {phase}, {phase}
        while frontier:
            frontier = {n for p in frontier for n in ways_out(p)} - seen
            seen |= frontier
        assert seen & {P.SUCCEEDED, P.FAILED}, phase


def test_every_function_a_row_names_exists() -> None:
    for t in TRANSITIONS:
        for path in filter(None, (t.policy, t.carried_out_by)):
            module, _, name = path.rpartition(".")
            assert callable(getattr(importlib.import_module(module), name)), path


def test_the_whole_world_policy_has_one_row_per_fact_it_decides() -> None:
    decide = "rtj_operator.policy.decide"
    assert policy_for(P.NOT_STARTED, Fact.ATTEMPT_DUE, module=decide).endswith("start_first")
    assert policy_for(P.STARTING, Fact.ATTEMPT_DUE, module=decide).endswith("start_next")
    assert policy_for(P.BACKING_OFF, Fact.BACKOFF_ELAPSED, module=decide).endswith("backoff")
    for phase in (P.RUNNING, P.STOPPING_IN_PLACE, P.STARTING_IN_PLACE):
        assert policy_for(phase, Fact.FAILURE, module=decide).endswith(".on_failure")
        assert policy_for(phase, Fact.NO_FAILURE, module=decide).endswith("keep_running")
    assert policy_for(P.RUNNING, Fact.FAILURE).endswith("in_place.choose")  # first row wins
    with pytest.raises(UnlistedTransition, match="Succeeded"):
        policy_for(P.SUCCEEDED, Fact.FAILURE, module=decide)


def test_moves_no_row_lists_are_refused() -> None:
    assert allowed(P.RUNNING, P.RUNNING) and allowed(P.FAILED, P.FAILED)
    assert allowed(P.RUNNING, P.STOPPING_IN_PLACE)
    assert allowed(P.STARTING_IN_PLACE, P.RUNNING)
    assert not allowed(P.STOPPING_IN_PLACE, P.RUNNING)  # the barrier is not skipped
    assert not allowed(P.BACKING_OFF, P.RUNNING)  # not before the backoff has elapsed
    assert not allowed(P.FAILED, P.STARTING)
    assert not allowed(P.SUCCEEDED, P.RUNNING)
    with pytest.raises(UnlistedTransition, match="Failed -> Starting"):
        check(P.FAILED, P.STARTING)


def test_design_md_prints_the_table_from_the_code() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    found = re.search(r"<!-- recovery-table:[^>]*-->\n(.*?)<!-- /recovery-table -->", text, re.S)
    assert found is not None, "docs/DESIGN.md lost its recovery-table markers"
    assert found.group(1) == markdown(), "docs/DESIGN.md's recovery table drifted: regenerate"


def test_the_table_prints_one_line_per_row() -> None:
    lines = markdown().splitlines()
    assert len(lines) == 2 + len(TRANSITIONS)
    assert all(line.count("|") == 6 for line in lines)


def _builder_leaving(status: dict[str, Any], **update: Any) -> Any:
    from rtj_world import rtj_raw, snapshot

    from rtj_operator.reconcile.builder import PlanBuilder

    snap = snapshot(rtj_raw(status))
    b = PlanBuilder(snap, snap.rtj.status)
    b.update(**update)
    return b


def test_a_status_write_records_the_phase_it_leaves_the_job_in() -> None:
    b = _builder_leaving({"phase": "Running", "attempt": 1}, phase=Phase.RESTARTING,
                         next_attempt_at=NOW + timedelta(seconds=30))  # fmt: skip
    plan = b.build()
    assert plan.status_patch is not None
    assert plan.status_patch.patch["recoveryPhase"] == "BackingOff"


def test_a_plan_making_a_move_no_row_lists_raises_under_strict_and_is_noted_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failed = {"phase": "Failed", "attempt": 2}
    with pytest.raises(UnlistedTransition, match="Failed -> Running"):
        _builder_leaving(failed, phase=Phase.RUNNING).build()
    monkeypatch.setenv("RTJ_STRICT_RECOVERY_TABLE", "0")
    plan = _builder_leaving(failed, phase=Phase.RUNNING).build()
    assert "recovery phase Failed -> Running: no table row" in plan.summary
