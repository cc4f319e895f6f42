"""operator_proc.wait_for: a wait that cannot succeed fails at once, naming why."""

from __future__ import annotations

import pytest

from e2e import operator_proc


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_wait_gives_up_once_it_is_impossible_for_long_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(operator_proc, "time", clock)
    asked: list[float] = []

    def broken() -> str:
        asked.append(clock.now)
        return "KWOK's node Leases: gpu-node-03: Lease not renewed"

    with pytest.raises(TimeoutError, match="gave up waiting for pods: KWOK's node Leases"):
        operator_proc.wait_for("pods", lambda: None, 90, impossible=broken)
    assert 20 <= clock.now < 30  # not the 90 s timeout
    assert asked[0] == pytest.approx(5, abs=0.2)


def test_a_wait_that_is_hopeless_only_for_a_moment_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(operator_proc, "time", clock)
    answers = iter(["stale", None, "stale", None, "stale", None, None, None])

    def flapping() -> str | None:
        return next(answers, None)

    done_at = 38.0
    found = operator_proc.wait_for(
        "pods", lambda: clock.now >= done_at, 90, impossible=flapping, impossible_for=10
    )
    assert found is True and clock.now >= done_at
