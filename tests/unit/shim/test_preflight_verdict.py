"""The preflight's verdict and its rule (`rtj_shim.wire.preflight_verdict`): a rank is blamed
only when its own link is slow both ways; the verdict crosses the termination message."""

from __future__ import annotations

import pytest

from rtj_shim.wire.preflight_verdict import (
    LinkRate,
    PreflightCheck,
    PreflightVerdict,
    PreflightVerdictError,
    slow_ranks,
)

GB = 1e9


def _ring(slow: int | None, world: int = 5, bad: float = 0.1 * GB) -> list[LinkRate]:
    """A ring where rank `slow`'s NIC is slow: it sends and receives slowly, its
    predecessor sends to it slowly, its successor receives from it slowly."""
    rates = []
    for r in range(world):
        send = bad if slow in (r, (r + 1) % world) else 1 * GB
        recv = bad if slow in (r, (r - 1) % world) else 1 * GB
        rates.append(LinkRate(r, send, recv))
    return rates


def test_only_the_rank_slow_both_ways_is_blamed() -> None:
    assert list(slow_ranks(_ring(2), factor=4)) == [2]
    assert slow_ranks(_ring(None), factor=4) == {}
    assert slow_ranks(_ring(2, bad=0.3 * GB), factor=4) == {}, "within the factor"


def test_too_few_ranks_blame_nobody() -> None:
    assert slow_ranks(_ring(1, world=2), factor=4) == {}
    assert slow_ranks(_ring(1, world=3), factor=4) == {}
    assert list(slow_ranks(_ring(1, world=4, bad=0.01 * GB), factor=4)) == [1]
    assert slow_ranks(_ring(1), factor=1) == {}, "a factor of 1 judges nothing"


def test_the_verdict_round_trips_and_fits_a_termination_message() -> None:
    verdict = PreflightVerdict(
        False, PreflightCheck.COLLECTIVE, "rank 2 is slow", 4, 1e7, 1e7, 1e9, 1e9,
        "exit 0 in 0.1 s", tuple(f"note {i} " + "x" * 100 for i in range(100)),
    )  # fmt: skip
    raw = verdict.encode_bytes()
    assert len(raw) <= 4096
    again = PreflightVerdict.parse(raw)
    assert (again.passed, again.check, again.reason, again.world) == (
        False,
        "collective",
        "rank 2 is slow",
        4,
    )
    assert len(again.notes) < len(verdict.notes)


@pytest.mark.parametrize(
    ("raw", "field"),
    [("{}", "passed"), ('{"passed": "no"}', "passed"),
     ('{"passed": false, "check": "gpu"}', "check"),
     ('{"passed": true, "world": -1}', "world"), ("Traceback", "not JSON")],
)  # fmt: skip
def test_what_is_not_a_verdict_is_refused_by_name(raw: str, field: str) -> None:
    with pytest.raises(PreflightVerdictError, match=field):
        PreflightVerdict.parse(raw)
