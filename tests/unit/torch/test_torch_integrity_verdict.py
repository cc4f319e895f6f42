"""integrity_watch: whom an anomaly verdict names (issue 43 section 2). Pure: rows as each
rank brings them to a save, and the watch's own bookkeeping over plain floats."""

from __future__ import annotations

import pytest

from rtj_shim.integrity import AnomalyGuard, SuspectState
from rtj_shim.torch.integrity_watch import IntegrityWatch, RankIntegrity, verdict
from rtj_shim.wire.suspect_verdict import SuspectKind


def _row(step: int | None = None, *signals: str, pod: int = 0) -> RankIntegrity:
    suspect = f"{signals[0]} off at step {step}" if signals else None
    return RankIntegrity(suspect, {"model": 1}, pod, step, tuple(signals))


def _named(rows: list[RankIntegrity]) -> tuple[int, ...]:
    with pytest.raises(SuspectState) as raised:
        verdict(9, rows)
    assert raised.value.verdict is not None and raised.value.verdict.kind is SuspectKind.ANOMALY
    return raised.value.verdict.ranks


def test_a_gradient_scaled_on_one_rank_names_it_not_the_ranks_whose_average_it_spoiled() -> None:
    rows = [
        _row(7, "grad_norm", pod=0),
        _row(7, "grad_norm", "local_grad_norm", pod=1),
        _row(7, "grad_norm", pod=2),
    ]
    assert _named(rows) == (1,)


def test_a_symptom_only_in_the_norm_after_the_all_reduce_names_no_one() -> None:
    assert _named([_row(7, "grad_norm"), _row(7, "grad_norm"), _row(7, "grad_norm")]) == ()


def test_the_earliest_step_names_the_rank_the_others_followed() -> None:
    """Rank 2's own norm was off at step 7; every rank's loss went off at step 8 after the
    spoiled update: only the first symptom is the culprit's."""
    rows = [_row(8, "loss"), _row(8, "loss"), _row(7, "local_grad_norm")]
    assert _named(rows) == (2,)


def test_every_ranks_own_signal_off_at_once_names_no_one() -> None:
    assert _named([_row(7, "loss"), _row(7, "loss", "local_grad_norm")]) == ()


def test_a_world_of_one_names_its_rank() -> None:
    assert _named([_row(7, "loss")]) == (0,)


def test_the_watch_keeps_every_signal_of_its_first_anomalous_step_and_describes_its_own() -> None:
    watch = IntegrityWatch(AnomalyGuard(window=8, warmup=4))
    for step in range(1, 7):
        watch.note(step, loss=1.0 + step / 100, grad_norm=2.0, local_grad_norm=3.0)
    watch.note(7, loss=1.07, grad_norm=2e4, local_grad_norm=3e4)
    watch.note(8, loss=1e5, grad_norm=2.0, local_grad_norm=3.0)
    row = watch.local([])
    assert (row.anomaly_step, row.anomaly_signals) == (7, ("grad_norm", "local_grad_norm"))
    assert row.suspect is not None and row.suspect.startswith("local_grad_norm 30000 at step 7")


def test_watching_gradients_without_a_guard_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match=r"watch_gradients\(model\).*anomaly_guard"):
        IntegrityWatch(None).watch_gradients(object())


def test_watching_gradients_of_a_module_that_is_not_ddp_names_what_was_expected() -> None:
    from torch import nn

    with pytest.raises(TypeError, match=r"expected the DistributedDataParallel.*got Linear"):
        IntegrityWatch(AnomalyGuard()).watch_gradients(nn.Linear(2, 2))
