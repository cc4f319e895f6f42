"""A rank's start-up milestones (`rtj_shim.wire.milestones`): the file's type, what
`Progress` marks on its own (the restore's start, the first step) and once only, and how the
progress sidecar serves them (only the current process's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rtj_shim.agent.progress_report import report
from rtj_shim.progress import Progress
from rtj_shim.wire import milestones as ms
from rtj_shim.wire.milestones import Milestone, Milestones, MilestonesError


def test_milestones_round_trip_and_bad_fields_are_named() -> None:
    marks = Milestones(311).with_mark(Milestone.RESTORED, 12.5, 400)
    marks = marks.with_mark(Milestone.FIRST_STEP, 13.0, 401)
    assert Milestones.parse(json.loads(json.dumps(marks.encode()))) == marks
    newer = {**marks.encode(), "marks": {**marks.encode()["marks"], "compiled": {"at": 1.0}}}
    assert Milestones.parse(newer) == marks  # a newer shim's milestone is not this reader's
    for body, field in (
        ({"schema": 2, "pid": 1, "marks": {}}, "milestones.schema"),
        ({"schema": 1, "pid": -1, "marks": {}}, "milestones.pid"),
        ({"schema": 1, "pid": 1, "marks": []}, "milestones.marks"),
        ({"schema": 1, "pid": 1, "marks": {"restored": {"at": "now"}}}, "restored.at"),
        ({"schema": 1, "pid": 1, "marks": {"restored": {"at": 1, "step": -4}}}, "restored.step"),
    ):
        with pytest.raises(MilestonesError, match=field.replace(".", r"\.")):
            Milestones.parse(body)


def test_progress_marks_the_restore_and_the_first_step_once(tmp_path: Path) -> None:
    path = ms.path_for(tmp_path / "rank-00000.progress")
    ms.write(path, Milestones(1).with_mark(Milestone.FIRST_STEP, 1.0, 99))  # an older process's
    progress = Progress(tmp_path, 0)
    assert not path.exists()  # a new process starts with none
    with progress.section("restore"):
        progress.mark(Milestone.RESTORED, 40)
    progress.step_done(41)
    progress.step_done(42)
    found = ms.read(path)
    assert found is not None and set(found.marks) == {
        Milestone.RESTORE_BEGAN, Milestone.RESTORED, Milestone.FIRST_STEP,
    }  # fmt: skip
    assert (found.marks[Milestone.RESTORED].step, found.marks[Milestone.FIRST_STEP].step) == (
        40, 41,
    )  # fmt: skip
    first = found.marks[Milestone.FIRST_STEP].at
    progress.mark(Milestone.FIRST_STEP, 50)  # once: the first stays
    again = ms.read(path)
    assert again is not None and again.marks[Milestone.FIRST_STEP].at == first
    body = report(tmp_path)
    assert body["ranks"][0]["milestones"]["restored"] == {
        "at": found.marks[Milestone.RESTORED].at, "step": 40,
    }  # fmt: skip
    progress.close()


def test_the_sidecar_serves_only_the_current_processs_milestones(tmp_path: Path) -> None:
    progress = Progress(tmp_path, 0)
    progress.step_done(1)
    path = ms.path_for(progress.path)
    ms.write(path, Milestones(progress_pid(tmp_path) + 1).with_mark(Milestone.FIRST_STEP, 1.0))
    assert "milestones" not in report(tmp_path)["ranks"][0]  # another pid's: not this one's
    path.write_text("{not json")
    body = report(tmp_path)
    assert "milestones" not in body["ranks"][0]
    assert body["errors"] and body["errors"][0]["file"] == path.name
    progress.close()
    reused = Progress(tmp_path, 0, reuse=True)  # `rtj-shim heartbeat`: another's record
    reused.step_done(2)
    assert path.read_text() == "{not json"  # untouched: no milestones of its own
    reused.close()


def progress_pid(directory: Path) -> int:
    return int(report(directory)["ranks"][0]["pid"])
