"""Store reads are bounded per lane, per store and in time: one tenant's black-holed store
never holds up another job's restart (issue 13)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta

import pytest
from rtj_test_support import NOW

from rtj_operator.selection import CheckpointUnreadable, Selection
from rtj_operator.store_reads import Lane, StoreReads, store_key

HOLE = "s3://black-hole/team-a/llm"
GOOD = "s3://ckpt/team-b/big"


class Stores:
    """A reader whose black-holed bucket never answers until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[str] = []

    def __call__(
        self, uri: str, bad: Iterable[int], credentials: Mapping[str, str] | None
    ) -> Selection:
        self.calls.append(uri)
        if uri == HOLE:
            self.release.wait(10)
            raise CheckpointUnreadable("EndpointConnectionError")
        return Selection(300, f"{uri}/steps/step-000000000300", NOW - timedelta(minutes=1))


def test_a_black_holed_store_never_delays_another_jobs_restart_read() -> None:
    stores = Stores()
    reads = StoreReads(stores, timeout=0.5, per_store=2, threads=4)

    async def scenario() -> None:
        hole = store_key(HOLE, "team-a/creds")
        # a round of refreshes of the black-holed store, more than its per-store limit
        stuck = [
            asyncio.ensure_future(reads.read(Lane.REFRESH, hole, HOLE, (), None)) for _ in range(6)
        ]
        stuck += [
            asyncio.ensure_future(reads.read(Lane.RESTART, hole, HOLE, (), None)) for _ in range(6)
        ]
        await asyncio.sleep(0.05)
        started = time.monotonic()
        picked = await reads.read(Lane.RESTART, store_key(GOOD, None), GOOD, (), None)
        assert picked.step == 300
        assert time.monotonic() - started < 0.4, "waited behind the black-holed store"
        results = await asyncio.gather(*stuck, return_exceptions=True)
        assert all(isinstance(r, CheckpointUnreadable) for r in results)
        assert "within 0.5s" in str(results[0])
        # at most per_store threads per lane ever reached the black-holed store
        assert stores.calls.count(HOLE) <= 4
        # the refresh lane leaves it alone for a while; the restart lane still tries
        assert reads.resting(hole) and not reads.resting(store_key(GOOD, None))

    try:
        asyncio.run(scenario())
    finally:
        stores.release.set()
        reads.shutdown()


def test_a_store_error_is_reported_never_a_missing_checkpoint() -> None:
    stores = Stores()
    stores.release.set()  # the black-holed store answers at once, with an error
    reads = StoreReads(stores, timeout=5)
    with pytest.raises(CheckpointUnreadable, match="EndpointConnectionError"):
        asyncio.run(reads.read(Lane.RESTART, store_key(HOLE, None), HOLE, (), None))
    reads.shutdown()


def test_stores_are_told_apart_by_bucket_and_credentials() -> None:
    assert store_key("s3://a/x", None) == store_key("s3://a/y", None)
    assert store_key("s3://a/x", None) != store_key("s3://b/x", None)
    assert store_key("s3://a/x", "ns/one") != store_key("s3://a/x", "ns/two")
