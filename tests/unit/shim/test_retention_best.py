"""Keep-best retention: the steps with the best metric the trainer recorded are kept."""

from __future__ import annotations

import math

import pytest

from rtj_shim.checkpoint.layout import StepDirName
from rtj_shim.checkpoint.retention import (
    Metric,
    RetentionPolicy,
    StepState,
    metric_of,
    plan_retention,
)


def scored(
    values: dict[int, float | None], name: str = "val_loss", mode: str = "min"
) -> list[StepState]:
    return [
        StepState(StepDirName(step), True, "", None if v is None else Metric(name, mode, v))
        for step, v in values.items()
    ]


def kept(states: list[StepState], policy: RetentionPolicy) -> dict[int, str]:
    return {d.name.step: d.reason for d in plan_retention(states, policy).keep}


def test_the_best_steps_are_kept_beside_the_newest_and_its_fallback() -> None:
    states = scored({10: 0.9, 20: 0.4, 30: 0.7, 40: 0.3, 50: None, 60: 0.8, 70: 0.95})
    reasons = kept(states, RetentionPolicy(keep_last=1, keep_best=2))
    assert sorted(reasons) == [20, 40, 60, 70]
    assert reasons[20] == reasons[40] == "among the best 2 by val_loss (min)"
    assert reasons[70] == "newest verified step"


def test_mode_max_ties_and_the_metric_name() -> None:
    states = scored({10: 0.5, 20: 0.9, 30: 0.9, 40: 0.1}, mode="max")
    states += scored({50: 99.0}, name="other", mode="max")
    # the newest scored step names "other": without best_metric that is the one ranked
    assert sorted(kept(states, RetentionPolicy(keep_last=1, keep_best=1))) == [40, 50]
    policy = RetentionPolicy(keep_last=1, keep_best=1, best_metric="val_loss")
    assert sorted(kept(states, policy)) == [30, 40, 50]  # a tie keeps the newer step
    assert sorted(kept(states, RetentionPolicy(keep_last=1))) == [40, 50]  # keep_best 0


def test_a_best_step_that_is_not_verified_is_not_kept() -> None:
    states = scored({10: 0.1, 20: 0.5, 30: 0.6})
    states[0] = StepState(StepDirName(10), False, "sha256 mismatch", Metric("val_loss", "min", 0.1))
    assert sorted(kept(states, RetentionPolicy(keep_last=1, keep_best=1))) == [20, 30]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"metric": {"name": "acc", "mode": "max", "value": 0.5}}, Metric("acc", "max", 0.5)),
        ({"metric": {"name": "loss", "mode": "min", "value": 3}}, Metric("loss", "min", 3.0)),
        ({}, None),
        ({"metric": "0.5"}, None),
        ({"metric": {"name": "loss", "mode": "lowest", "value": 1.0}}, None),
        ({"metric": {"name": "loss", "mode": "min", "value": True}}, None),
        ({"metric": {"name": "loss", "mode": "min", "value": math.nan}}, None),
        ({"metric": {"name": 3, "mode": "min", "value": 1.0}}, None),
    ],
)
def test_metric_of_reads_only_a_well_formed_finite_metric(
    extra: dict[str, object], expected: Metric | None
) -> None:
    assert metric_of(extra) == expected


def test_keep_best_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="keep_best must be >= 0"):
        RetentionPolicy(keep_last=1, keep_best=-1)
