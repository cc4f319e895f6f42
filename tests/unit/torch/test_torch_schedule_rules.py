"""The save schedule's decisions: pure functions over what every rank agreed on."""

from __future__ import annotations

import math

import pytest

from rtj_shim.checkpoint.retention import RetentionPolicy
from rtj_shim.torch.schedule import (
    Best,
    Schedule,
    best_from,
    improved,
    merged_retention,
    save_decision,
    updated,
)


def test_every_n_steps_and_every_t_seconds() -> None:
    schedule = Schedule(every_steps=50, every_seconds=600.0)
    assert [s for s in range(1, 201) if save_decision(schedule, s, False, None, None).save] == [
        50,
        100,
        150,
        200,
    ]
    assert save_decision(schedule, 7, True, None, None).why == "every 600s"
    assert save_decision(schedule, 100, True, None, None).why == "every 50 steps, every 600s"
    assert not Schedule().time_due(1e9) and not Schedule().step_due(100)
    assert Schedule(every_seconds=600.0).time_due(600.0)


def test_save_if_the_metric_improved() -> None:
    schedule = Schedule(monitor="val_loss", mode="min")
    first = save_decision(schedule, 3, False, 0.5, None)
    assert first.save and first.why == "val_loss improved to 0.5"
    best = Best("val_loss", "min", 0.5, 3)
    assert not save_decision(schedule, 4, False, 0.5, best).save  # equal is no improvement
    assert save_decision(schedule, 5, False, 0.4, best).save
    assert not save_decision(schedule, 5, False, math.nan, best).save
    assert improved(Best("acc", "max", 0.5, 1), 0.6, "max")
    assert not improved(None, math.inf, "max")


def test_the_best_follows_published_metrics() -> None:
    best = updated(None, "acc", "max", 0.5, 10)
    assert best == Best("acc", "max", 0.5, 10)
    assert updated(best, "acc", "max", 0.4, 20) is best
    assert updated(best, "acc", "max", None, 20) is best
    assert updated(best, "acc", "max", 0.7, 30) == Best("acc", "max", 0.7, 30)
    extra = {"best": Best("acc", "max", 0.7, 30).to_json()}
    assert best_from(extra, "acc") == Best("acc", "max", 0.7, 30)
    assert best_from(extra, "loss") is None
    assert best_from({"best": {"name": "acc", "mode": "max"}}, "acc") is None


def test_retention_from_the_operator_first_then_the_code() -> None:
    env = RetentionPolicy(keep_last=3, keep_every=100)
    assert merged_retention(env, 1, 0, "m") == env  # the job spec decides keep_last
    assert merged_retention(env, None, 2, "val_loss") == RetentionPolicy(
        keep_last=3, keep_every=100, keep_best=2, best_metric="val_loss"
    )
    assert merged_retention(None, 2, 1, "m") == RetentionPolicy(
        keep_last=2, keep_best=1, best_metric="m"
    )
    assert merged_retention(None, None, 3, "m") is None  # no retention: everything is kept


@pytest.mark.parametrize("bad", [{"every_steps": 0}, {"every_seconds": 0.0}, {"mode": "lowest"}])
def test_schedule_validation(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Schedule(**bad)  # type: ignore[arg-type]
