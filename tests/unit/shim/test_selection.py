from __future__ import annotations

import pytest

from rtj_shim.checkpoint.layout import StepDirName
from rtj_shim.checkpoint.selection import (
    hint_problem,
    in_progress_skips,
    parse_latest_hint,
    resume_candidates,
    select_resume_step,
)
from rtj_shim.checkpoint.verification import Depth, Verdict


@pytest.mark.parametrize(
    ("raw", "step", "problem"),
    [
        (None, None, None),
        (b'{"step": 300}', 300, None),
        (b"garbage", None, "not valid JSON"),
        (b"[1]", None, "field 'step'"),
        (b'{"step": -1}', None, "field 'step'"),
        (b'{"step": true}', None, "field 'step'"),
        (b'{"step": "300"}', None, "field 'step'"),
    ],
)
def test_latest_hint(raw: bytes | None, step: int | None, problem: str | None) -> None:
    hint = parse_latest_hint(raw)
    assert hint.step == step
    assert (hint.problem is None) == (problem is None)
    if problem:
        assert problem in (hint.problem or "")


def test_candidates_are_newest_first_whatever_the_hint_says() -> None:
    assert resume_candidates([100, 300, 200, 300]) == [300, 200, 100]


@pytest.mark.parametrize(
    ("raw", "chosen", "problem"),
    [
        (b'{"step": 300}', 300, None),
        (None, 300, None),
        (b'{"step": 300}', 400, "stale hint"),  # 400 published after the hint was written
        (b'{"step": 999}', 300, "not published"),
        (b'{"step": 400}', 300, "does not verify"),
        (b"garbage", 300, "not valid JSON"),
    ],
)
def test_hint_problems_are_reported(raw: bytes | None, chosen: int, problem: str | None) -> None:
    found = hint_problem(parse_latest_hint(raw), [100, 200, 300, 400], chosen)
    assert (found is None) == (problem is None)
    if problem:
        assert problem in (found or "")


def test_select_returns_first_valid_and_reports_skips() -> None:
    valid = {100}

    def verify(step: int) -> Verdict:
        ok = step in valid
        return Verdict(step, ok, "ok" if ok else f"bad {step}", Depth.DEEP)

    verdict, skipped = select_resume_step([300, 200, 100, 50], verify)
    assert verdict is not None and verdict.step == 100
    assert [(s.step, s.reason) for s in skipped] == [(300, "bad 300"), (200, "bad 200")]
    verdict, skipped = select_resume_step([300], verify)
    assert verdict is None and len(skipped) == 1


def test_in_progress_dirs_newer_than_choice_are_reported() -> None:
    dirs = [StepDirName(100), StepDirName(150, "2"), StepDirName(50, "1")]
    skips = in_progress_skips(dirs, newer_than=100)
    assert [s.step for s in skips] == [150]
    assert "never resumed" in skips[0].reason


def test_steps_marked_bad_are_no_candidates_and_the_chooser_is_lazy() -> None:
    """The operator's bad-step filter is the shim's, and every chooser stops at the first
    step that verifies (a deep verification of every older step would read it all)."""
    from rtj_shim.checkpoint.selection import resume_candidates, select_resume_step

    assert resume_candidates([100, 300, 200, 300], bad_steps=[300]) == [200, 100]
    asked: list[int] = []

    def verify(step: int) -> Verdict:
        asked.append(step)
        return Verdict(step, step != 400, "checksum mismatch" if step == 400 else "ok", Depth.DEEP)

    found, skipped = select_resume_step(resume_candidates([400, 300, 200, 100]), verify)
    assert found is not None and found.step == 300 and asked == [400, 300]
    assert [(s.step, s.reason) for s in skipped] == [(400, "checksum mismatch")]
