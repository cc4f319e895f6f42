"""The leader's hold on its Lease (issue 13): it stops acting before a standby may take the
Lease over, and only then."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from rtj_operator.leader import LeaderElector


def test_a_hung_renewal_cannot_keep_a_leader_past_its_renew_deadline() -> None:
    """Issue 13: one renewal call that never answers must not let the leader act for longer
    than renewDeadline (shorter than the lease duration a standby waits out)."""
    release = threading.Event()
    holder = "me"

    class HungLeases:
        hung = False

        def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
            if self.hung:
                release.wait(10)
            return {"metadata": {"resourceVersion": "5"},
                    "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                             "renewTime": "2025-03-14T12:00:00.000000Z"}}  # fmt: skip

        def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> None:
            return None

    async def scenario() -> None:
        leases = HungLeases()
        elector = LeaderElector(leases, "rtj-system", "rtj", holder,  # type: ignore[arg-type]
                                duration=15, renew_deadline=0.6, retry=0.05)  # fmt: skip
        elector.leading = True
        leases.hung = True
        try:  # without the deadline on the call, hold() waits for the hung call (10 s)
            assert await asyncio.wait_for(elector.hold(asyncio.Event()), 5) is False
            assert not elector.leading
        finally:
            release.set()

    asyncio.run(scenario())


def test_a_loop_that_wakes_past_the_renew_deadline_tries_once_before_stepping_down() -> None:
    """A stalled event loop (2-3 s at 1,000 jobs) must not depose a leader whose Lease has
    not lapsed: one renewal, bounded to end before it could, keeps it; a wake too late for
    that steps down without one."""

    class Leases:
        renewals = 0

        def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
            return {"metadata": {"resourceVersion": "5"},
                    "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15,
                             "renewTime": "2025-03-14T12:00:00.000000Z"}}  # fmt: skip

        def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> None:
            self.renewals += 1

    async def held(wakes: list[float]) -> tuple[bool, int]:
        """hold() with a clock that reads `wakes` in turn (the first: when it began)."""
        leases, stop, times = Leases(), asyncio.Event(), iter(wakes)

        def clock() -> float:
            at = next(times, None)
            if at is None:
                stop.set()
                return wakes[-1]
            return at

        elector = LeaderElector(leases, "rtj-system", "rtj", "me",  # type: ignore[arg-type]
                                duration=15, renew_deadline=10, retry=0.01,
                                monotonic=clock)  # fmt: skip
        elector.leading = True
        return await elector.hold(stop), leases.renewals

    # begun at 0, woke at 12: past the 10 s deadline, 3 s before the lease could lapse
    assert asyncio.run(held([0.0, 12.0])) == (True, 1)
    # woke at 14.995: no time left for a renewal to land before 15 - retry: stepped down
    assert asyncio.run(held([0.0, 14.995])) == (False, 0)
