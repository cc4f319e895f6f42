from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtj_shim.checkpoint.layout import (
    MAX_STEP,
    StepDirName,
    parse_step_dir,
    step_dir_name,
    step_key,
    tmp_dir_name,
)


def test_step_dir_name_is_twelve_digits() -> None:
    assert step_dir_name(12000) == "step-000000012000"
    assert tmp_dir_name(12500, "3") == "step-000000012500.tmp-3"
    assert step_key(7, "manifest.json") == "steps/step-000000000007/manifest.json"


@given(
    st.integers(0, MAX_STEP),
    st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)),
)
def test_names_round_trip(step: int, attempt: str | None) -> None:
    name = StepDirName(step, attempt)
    assert parse_step_dir(str(name)) == name


@pytest.mark.parametrize(
    "name",
    [
        "step-12",
        "step-0000000000001",
        "step-000000000001.tmp-",
        "step-000000000001.tmp-a/b",
        ".trash-step-000000000001-ab",
        "latest.json",
        "step-00000000000x",
    ],
)
def test_foreign_names_are_ignored(name: str) -> None:
    assert parse_step_dir(name) is None


@pytest.mark.parametrize("bad", [-1, MAX_STEP + 1, True])
def test_bad_steps_are_rejected(bad: int) -> None:
    with pytest.raises(ValueError, match="step must be an integer"):
        step_dir_name(bad)


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "-lead", "x" * 64])
def test_bad_attempts_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="attempt must match"):
        tmp_dir_name(1, bad)
