"""The supervisor's report (`rtj_shim.wire.supervisor_report`): written by `rtj-shim
supervise`, parsed once by the operator where the sidecar's answer arrives; its state words
are one enum."""

from __future__ import annotations

import json

import pytest

from rtj_shim.checkpoint.lineage import LEGACY, Held
from rtj_shim.wire.misaligned_resume import MisalignedRanks
from rtj_shim.wire.rejected_step import RejectedStep, RejectedStepError
from rtj_shim.wire.supervisor_report import (
    STARTED_STATES,
    STOPPED_STATES,
    SupervisorReport,
    SupervisorReportError,
    SupervisorState,
)
from rtj_shim.wire.suspect_verdict import SuspectKind, SuspectVerdict

LINEAGE = "0123456789abcdef"


def test_a_full_report_round_trips_through_json() -> None:
    report = SupervisorReport(
        3, SupervisorState.STOPPED, attempt=4, exit_code=None, fast_steps=(40, 50),
        fast_held=frozenset({Held(40, LINEAGE), Held(50, LINEAGE)}),
        rejected=RejectedStep(30, "sha256 mismatch"), spare=True, rank=2, pid=None,
        suspect=SuspectVerdict(40, SuspectKind.DIVERGED, (5,), (2,)),
        misaligned=MisalignedRanks(56, (1,), (9.5,), 0.03),
        preloaded=True, standby="fork-server", updated_wall_time=1733400000.5,
    )  # fmt: skip
    again = SupervisorReport.parse(json.loads(json.dumps(report.encode())))
    assert again == report
    assert again.encode()["state"] == "stopped" and f"{again.state}" == "stopped"
    assert again.rejected == RejectedStep(30, "sha256 mismatch")


def test_an_older_supervisors_minimal_report_parses() -> None:
    report = SupervisorReport.parse({"generation": 1, "state": "running"})
    assert (report.generation, report.state, report.fast_held) == (1, "running", None)
    assert not report.lists_fast_tier and report.holdings == frozenset()
    legacy = SupervisorReport.parse({"generation": 1, "state": "stopped", "fast_steps": [7]})
    assert legacy.lists_fast_tier and legacy.holdings == {Held(7, LEGACY)}


def test_states_that_show_an_order_carried_out() -> None:
    stopped = SupervisorReport.parse({"generation": 2, "state": "stopped"})
    assert stopped.shows(2, STOPPED_STATES) and not stopped.shows(1, STOPPED_STATES)
    assert not stopped.shows(2, STARTED_STATES)
    for word in ("running", "exited", "finished"):
        assert SupervisorReport.parse({"generation": 2, "state": word}).shows(2, STARTED_STATES)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([1], "supervisor: expected an object"),
        ({"generation": 1, "state": "paused"}, "supervisor.state"),
        ({"generation": 1}, "supervisor.state"),
        ({"state": "running"}, "supervisor.generation"),
        ({"generation": -1, "state": "running"}, "supervisor.generation"),
        ({"generation": True, "state": "running"}, "supervisor.generation"),
        ({"generation": 1, "state": "exited", "exit_code": "1"}, "supervisor.exit_code"),
        ({"generation": 1, "state": "running", "updated_wall_time": "now"}, "updated_wall_time"),
        ({"generation": 1, "state": "exited", "rejected": "step 3"}, "supervisor.rejected"),
        (
            {"generation": 1, "state": "exited", "rejected": {"step": "3"}},
            "supervisor.rejected step: step '3'",
        ),
        (
            {"generation": 1, "state": "exited", "rejected": {"step": 3, "reason": 7}},
            "supervisor.rejected step: reason 7",
        ),
        ({"generation": 1, "state": "exited", "suspect": "rank 3"}, "supervisor.suspect"),
        ({"generation": 1, "state": "running", "misaligned": [1]}, "supervisor.misaligned"),
        (
            {"generation": 1, "state": "running", "misaligned": {"step": 5, "ranks": []}},
            "supervisor.misaligned resume: ranks",
        ),
        (
            {"generation": 1, "state": "exited", "suspect": {"step": 3, "kind": "odd"}},
            "supervisor.suspect verdict: kind",
        ),
    ],
)
def test_a_field_of_the_wrong_kind_is_refused_by_name(body: object, field: str) -> None:
    with pytest.raises(SupervisorReportError, match=field):
        SupervisorReport.parse(body)


def test_holdings_that_do_not_parse_are_ignored_as_before() -> None:
    report = SupervisorReport.parse(
        {"generation": 1, "state": "stopped", "fast_steps": [5, "x", -1, True],
         "fast_held": [f"{LINEAGE}@5", "nonsense"]}
    )  # fmt: skip
    assert report.fast_steps == (5,) and report.holdings == {Held(5, LINEAGE)}


def test_a_rejected_step_round_trips_and_its_reason_is_cut_not_refused() -> None:
    long = RejectedStep(30, "x" * 900)
    assert RejectedStep.parse(json.dumps(long.encode())) == RejectedStep(30, "x" * 500)
    assert RejectedStep.parse({"step": 4}) == RejectedStep(4, "")
    for bad, said in (("{", "not JSON"), ([1], "expected a JSON object"),
                      ({"step": -1}, "step -1"), ({"step": True}, "step True")):  # fmt: skip
        with pytest.raises(RejectedStepError, match=said):
            RejectedStep.parse(bad)
