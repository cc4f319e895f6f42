"""A LocalQueue lookup is shared by every job on the queue for a few seconds
(`job_reads.QUEUE_SHARED`): with 1,000 jobs waiting for admission each asked on its own
(5,000 GETs of one LocalQueue in six minutes, `bench.operator_scale_jobs`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, cast

from rtj_test_support import NOW

from rtj_operator.job_reads import QUEUE_SHARED, QUEUES_KEPT, JobReads
from rtj_operator.kube_errors import NotFound


class Kueue:
    """The API server's answers to LocalQueue GETs (v1beta2 served), counted; a lookup may
    be held until released, as a slow API server holds it."""

    def __init__(self, queues: set[tuple[str, str]]) -> None:
        self.queues = queues
        self.paths: list[str] = []
        self.release = threading.Event()
        self.release.set()

    def request(self, what: str, method: str, path: str, body: Any = None,
                *, query: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        self.paths.append(path)
        self.release.wait(10)
        parts = path.strip("/").split("/")
        namespace, name = parts[4], parts[6]
        if (namespace, name) not in self.queues:
            raise NotFound(f'{what}: localqueues.kueue.x-k8s.io "{name}" not found')
        return {"metadata": {"name": name}}


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


def reads(kueue: Kueue, clock: Clock) -> JobReads:
    return JobReads(cast(Any, kueue), cast(Any, None), cast(Any, None), clock, ())


def test_one_lookup_answers_every_job_on_the_queue_until_it_is_old() -> None:
    kueue, clock = Kueue({("team-a", "gpu")}), Clock()
    r = reads(kueue, clock)
    first = r.queue("team-a", "gpu")
    clock.now += QUEUE_SHARED - timedelta(seconds=1)
    assert r.queue("team-a", "gpu") is first and first.exists is True
    assert len(kueue.paths) == 1
    clock.now += timedelta(seconds=1)
    again = r.queue("team-a", "gpu")
    assert again.read_at == clock.now and len(kueue.paths) == 2


def test_queues_and_namespaces_are_looked_up_apart_and_a_missing_one_is_an_answer() -> None:
    kueue, clock = Kueue({("team-a", "gpu")}), Clock()
    r = reads(kueue, clock)
    assert r.queue("team-b", "gpu").exists is False  # team-b has no queue "gpu"
    assert r.queue("team-a", "gpu").exists is True
    assert r.queue("team-a", "cpu").exists is False
    assert r.queue("team-b", "gpu").exists is False
    assert len(kueue.paths) == 3


def test_jobs_asking_at_once_wait_for_the_one_lookup() -> None:
    kueue, clock = Kueue({("team-a", "gpu")}), Clock()
    kueue.release.clear()
    r = reads(kueue, clock)
    with ThreadPoolExecutor(8) as pool:
        asked = [pool.submit(r.queue, "team-a", "gpu") for _ in range(8)]
        while not kueue.paths:
            threading.Event().wait(0.01)
        kueue.release.set()
        answers = [f.result(timeout=10) for f in asked]
    assert len(kueue.paths) == 1
    assert all(a is answers[0] and a.exists for a in answers)


def test_old_lookups_of_many_queue_names_are_dropped() -> None:
    """spec.queueName is the tenant's word: lookups of ever new names must not pile up."""
    kueue, clock = Kueue(set()), Clock()
    r = reads(kueue, clock)
    for i in range(QUEUES_KEPT + 1):
        r.queue("team-a", f"q{i}")
    clock.now += QUEUE_SHARED
    r.queue("team-a", "fresh")
    assert len(r._queues) == 1 and len(r._queue_locks) == 1
    assert r.queue("team-a", "fresh").exists is False and kueue.paths[-1].endswith("/fresh")
