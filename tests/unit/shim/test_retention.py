from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtj_shim.checkpoint.layout import StepDirName
from rtj_shim.checkpoint.retention import (
    RetentionPolicy,
    StepState,
    plan_retention,
    policy_from_env,
)


def states(verified: list[int], broken: list[int] = (), tmp: list[int] = ()) -> list[StepState]:  # type: ignore[assignment]
    out = [StepState(StepDirName(s), True) for s in verified]
    out += [StepState(StepDirName(s), False, "COMMITTED is missing") for s in broken]
    out += [StepState(StepDirName(s, "1"), False, "in progress") for s in tmp]
    return out


def kept(plan) -> list[int]:  # type: ignore[no-untyped-def]
    return sorted(d.name.step for d in plan.keep)


def test_keep_last_milestones_and_protected() -> None:
    plan = plan_retention(
        states([100, 200, 300, 400, 500, 600]),
        RetentionPolicy(keep_last=2, keep_every=300, protect=frozenset({100})),
    )
    assert kept(plan) == [100, 300, 500, 600]
    reasons = {d.name.step: d.reason for d in plan.keep}
    assert reasons[600] == "newest verified step"
    assert "milestone" in reasons[300]
    assert reasons[100] == "protected"
    assert sorted(d.name.step for d in plan.delete) == [200, 400]


def test_previous_verified_step_is_kept_even_with_keep_last_one() -> None:
    plan = plan_retention(states([100, 200, 300]), RetentionPolicy(keep_last=1))
    assert kept(plan) == [200, 300]


def test_unverified_steps() -> None:
    plan = plan_retention(
        states([100, 200], broken=[150, 250], tmp=[50, 300]), RetentionPolicy(keep_last=1)
    )
    assert kept(plan) == [100, 200, 250, 300]  # newer than the newest verified: maybe in progress
    assert sorted(d.name.step for d in plan.delete) == [50, 150]


def test_nothing_verified_deletes_nothing() -> None:
    plan = plan_retention(states([], broken=[100], tmp=[200]), RetentionPolicy(keep_last=1))
    assert plan.delete == ()


@pytest.mark.parametrize("bad", [{"keep_last": 0}, {"keep_last": 1, "keep_every": 0}])
def test_policy_validation(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        RetentionPolicy(**bad)


@given(
    verified=st.sets(st.integers(0, 5000), max_size=30),
    broken=st.sets(st.integers(0, 5000), max_size=10),
    keep_last=st.integers(1, 5),
    keep_every=st.one_of(st.none(), st.integers(1, 1000)),
    protect=st.frozensets(st.integers(0, 5000), max_size=3),
)
def test_retention_invariants(
    verified: set[int],
    broken: set[int],
    keep_last: int,
    keep_every: int | None,
    protect: frozenset[int],
) -> None:
    broken -= verified
    plan = plan_retention(
        states(sorted(verified), sorted(broken)), RetentionPolicy(keep_last, keep_every, protect)
    )
    keep = {d.name.step for d in plan.keep}
    delete = {d.name.step for d in plan.delete}
    assert keep | delete == verified | broken and not keep & delete
    newest = sorted(verified, reverse=True)
    assert set(newest[: max(keep_last, 2)]) <= keep
    assert protect & (verified | broken) <= keep
    if keep_every:
        assert {s for s in verified if s % keep_every == 0} <= keep


# -- the policy the operator passes as environment ------------------------------------------


def test_no_keep_last_in_the_environment_keeps_everything() -> None:
    assert policy_from_env({}) is None
    assert policy_from_env({"RTJ_KEEP_LAST": ""}) is None
    assert policy_from_env({"RTJ_KEEP_EVERY": "1000", "RTJ_PROTECT_STEP": "7"}) is None


def test_policy_from_the_environment() -> None:
    assert policy_from_env({"RTJ_KEEP_LAST": "3"}) == RetentionPolicy(3)
    env = {"RTJ_KEEP_LAST": " 2 ", "RTJ_KEEP_EVERY": "1000", "RTJ_PROTECT_STEP": "12000"}
    assert policy_from_env(env) == RetentionPolicy(2, 1000, frozenset({12000}))
    several = {"RTJ_KEEP_LAST": "1", "RTJ_PROTECT_STEP": "0, 500,"}
    assert policy_from_env(several) == RetentionPolicy(1, None, frozenset({0, 500}))


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"RTJ_KEEP_LAST": "0"}, "RTJ_KEEP_LAST"),
        ({"RTJ_KEEP_LAST": "-1"}, "RTJ_KEEP_LAST"),
        ({"RTJ_KEEP_LAST": "three"}, "RTJ_KEEP_LAST"),
        ({"RTJ_KEEP_LAST": "2.5"}, "RTJ_KEEP_LAST"),
        ({"RTJ_KEEP_LAST": "2", "RTJ_KEEP_EVERY": "0"}, "RTJ_KEEP_EVERY"),
        ({"RTJ_KEEP_LAST": "2", "RTJ_PROTECT_STEP": "x"}, "RTJ_PROTECT_STEP"),
        ({"RTJ_KEEP_LAST": "2", "RTJ_PROTECT_STEP": "1" + "0" * 12}, "RTJ_PROTECT_STEP"),
    ],
)
def test_malformed_retention_environment_names_the_variable(
    env: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        policy_from_env(env)
