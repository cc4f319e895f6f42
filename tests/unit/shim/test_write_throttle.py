"""Durable writes paced to spec.checkpoint.maxWriteBytesPerSecond
(rtj_shim.checkpoint.storage.throttle): the bucket's arithmetic on a fake clock, a real
filesystem store's step written through it (the bytes and digests unchanged), an emergency
save never paced, and the variable's bad values named."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.checkpoint.storage.throttle import (
    PACED_CHUNK_BYTES,
    ThrottledStore,
    TokenBucket,
    throttled,
    unwrapped,
)
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.wire import pod_env

MiB = 1 << 20


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_bucket_lets_a_seconds_worth_through_then_paces() -> None:
    clock = FakeClock()
    bucket = TokenBucket(100, clock=clock, sleep=clock.sleep)
    bucket.take(100)  # the first second's worth: no wait
    bucket.take(50)
    assert clock.slept == [0.5]
    clock.now += 60  # an idle minute banks one second's worth, not sixty
    bucket.take(100)
    bucket.take(100)
    assert clock.slept == [0.5, 1.0] and bucket.waited == 1.5


def test_an_emergency_save_is_never_paced() -> None:
    clock, sigterm = FakeClock(), [False]
    bucket = TokenBucket(10, clock=clock, sleep=clock.sleep, unpaced=lambda: sigterm[0])
    bucket.take(10)
    sigterm[0] = True
    bucket.take(10_000)
    assert clock.slept == []


@pytest.mark.parametrize("rate", [0, -1, float("nan")])
def test_a_rate_that_is_not_positive_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="rate: expected bytes per second > 0"):
        TokenBucket(rate)


def test_a_step_written_through_the_pace_is_the_same_step(tmp_path: Path) -> None:
    clock = FakeClock()
    bucket = TokenBucket(MiB, clock=clock, sleep=clock.sleep)
    store = ThrottledStore(FilesystemStore(tmp_path / "root"), bucket)
    source = tmp_path / "src"
    source.mkdir()
    blob = random.Random(3).randbytes(3 * MiB + 17)
    (source / "model.bin").write_bytes(blob)
    (source / "meta.json").write_text("{}")
    CommitProtocol(store, run_id="r", retention=None).publish_directory(5, source)  # type: ignore[arg-type]
    # 3 MiB + 19 bytes at 1 MiB/s with 1 MiB of credit: two seconds and a little held,
    # in pieces of at most PACED_CHUNK_BYTES
    assert bucket.waited == pytest.approx(2.0 + 19 / MiB)
    assert max(clock.slept) <= PACED_CHUNK_BYTES / MiB
    found = resolve(FilesystemStore(tmp_path / "root"), Depth.DEEP)
    assert found.step == 5
    published = tmp_path / "root" / "steps" / "step-000000000005" / "model.bin"
    assert hashlib.sha256(published.read_bytes()).digest() == hashlib.sha256(blob).digest()


def test_no_limit_leaves_the_store_as_it_is(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path)
    assert throttled(store, None, lambda: False) is store
    paced = throttled(store, 10 * MiB, lambda: False)
    assert isinstance(paced, ThrottledStore) and unwrapped(paced) is store


@pytest.mark.parametrize("raw", ["0", "-5", "1.5", "10MB", " 7"])
def test_a_bad_limit_in_the_pod_is_named(raw: str) -> None:
    with pytest.raises(ValueError, match="RTJ_MAX_WRITE_BYTES_PER_SECOND"):
        pod_env.max_write_bytes_per_second({"RTJ_MAX_WRITE_BYTES_PER_SECOND": raw})
    assert pod_env.max_write_bytes_per_second({}) is None
    assert pod_env.max_write_bytes_per_second({"RTJ_MAX_WRITE_BYTES_PER_SECOND": "52428800"}) == (
        50 * MiB
    )
