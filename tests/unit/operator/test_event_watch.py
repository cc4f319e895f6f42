"""The controller reads a failure's Events from the watch's cache once it is synced, with no
API call (at 1,000 jobs each Event LIST scanned the whole namespace: issue 49), LISTs them
while it is not, and a kept Event that arrives wakes the job it is about."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from rtj_test_support import NOW
from rtj_world import iso, jobset, node, pod, rtj_raw
from test_runtime import SHARED_BUCKET, FakeKube

from rtj_operator import controller as ctl
from rtj_operator import event_watch
from rtj_operator.event_watch import kept
from rtj_operator.kube_errors import KubeError
from rtj_operator.kube_watch import WatchEvent
from rtj_operator.metrics import Metrics
from rtj_operator.selection import Selection
from rtj_operator.settings import Settings
from rtj_operator.work_queue import WorkQueue

KEY = ("team-a", "llm")
POD = "llm-a1-worker-0-0-abcde"


def evicted(pod_name: str = POD, uid: str = "") -> dict[str, Any]:
    """The kubelet's eviction Event (pkg/kubelet/eviction/eviction_manager.go `evictPod`:
    reason "Evicted", type Warning)."""
    return {
        "metadata": {"uid": "ev-1", "namespace": "team-a", "name": f"{pod_name}.1"},
        "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": "team-a", "uid": uid},
        "reason": "Evicted",
        "type": "Warning",
        "message": "The node was low on resource: memory.",
        "source": {"component": "kubelet", "host": "gpu-node-001"},
        "lastTimestamp": iso(NOW),
    }


class EvictionEvents(FakeKube):
    """LISTs answer the eviction Event for its pod."""

    def list_events(self, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        self.calls.append(("list_events", selector))
        return [evicted()] if selector.endswith((f"={POD}", "=Pod")) else []


def failed_job(kube: FakeKube) -> ctl.Controller:
    def reader(uri: str, bad: Any, credentials: Any) -> Selection:
        return Selection(1200, f"{uri}/steps/step-000000001200", NOW)

    settings = Settings(workers=1, operator_identity_stores=SHARED_BUCKET)
    c = ctl.Controller(kube, Metrics(CollectorRegistry()), settings,  # type: ignore[arg-type]
                       clock=lambda: NOW, store_reader=reader)  # fmt: skip
    status = {"phase": "Running", "attempt": 1, "attempts": [{"attempt": 1, "jobSet": "llm-a1"}]}
    c.on_rtj(None, rtj_raw(status))
    c.on_jobset(None, jobset(1))
    for name in ("gpu-node-000", "gpu-node-001"):
        c.on_node(None, node(name))
    c.on_pod(None, pod(1, 0, exit_code=137, message=""))
    c.on_pod(None, pod(1, 1))
    return c


def decided(c: ctl.Controller) -> tuple[str, list[Any]]:
    async def scenario() -> str:
        await c.reconcile(KEY)
        await asyncio.gather(*c._posting)
        return str(c.rtjs[KEY]["status"]["attempts"][0].get("failureClass"))

    try:
        found = asyncio.run(scenario())
    finally:
        c.executor.shutdown()
    kube: FakeKube = c.kube  # type: ignore[assignment]
    return found, [x for x in kube.calls if x[0] == "list_events"]


def test_a_synced_cache_answers_the_failure_without_a_list() -> None:
    c = failed_job(EvictionEvents())
    c.event_watch.caches[None].replace([kept(evicted())])
    found, lists = decided(c)
    assert found == "Evicted"
    assert lists == [], "no Event LIST once the watch's cache is synced"


def test_the_synced_cache_is_what_is_read_not_the_lists() -> None:
    """FakeKube's LISTs would say Evicted; the synced cache holds nothing about the pod."""
    c = failed_job(EvictionEvents())
    c.event_watch.caches[None].replace([])
    found, lists = decided(c)
    assert found != "Evicted" and lists == []


def test_until_the_cache_is_synced_a_failure_lists_its_events() -> None:
    c = failed_job(EvictionEvents())
    found, lists = decided(c)
    assert found == "Evicted" and lists, "the LISTs, as before the watch"


def test_a_kept_event_wakes_the_job_of_the_pod_it_names_by_uid() -> None:
    c = failed_job(EvictionEvents())
    body = pod(1, 0, exit_code=137, message="")
    body["metadata"]["uid"] = "pod-uid-0"
    c.on_pod("MODIFIED", body)
    c.queue = WorkQueue()
    c._next_plan.clear()
    c._held.clear()
    c.event_watch.apply(None, "ADDED", kept(evicted(uid="not-a-pod")) or {})
    assert len(c.queue) == 0, "an Event naming no cached pod wakes nothing"
    other = {**evicted(uid="pod-uid-0"), "metadata": {"uid": "ev-2", "namespace": "team-b"}}
    other["involvedObject"] = {**other["involvedObject"], "namespace": "team-b"}
    c.event_watch.apply(None, "ADDED", kept(other) or {})
    assert len(c.queue) == 0, "another namespace's Event naming this pod's uid wakes nothing"
    c.event_watch.apply(None, "ADDED", kept(evicted(uid="pod-uid-0")) or {})
    assert len(c.queue) == 1 and KEY in c.queue._dirty
    c.executor.shutdown()


class CompactedOnce:
    """A Kube whose first Event watch answers 410 (the version it resumes from is
    compacted: kube-apiserver serves Event watches from etcd) and whose second delivers one
    eviction; it counts LISTs."""

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0

    def list_kind(self, kind: str, namespace: str | None, **_: Any) -> tuple[list[Any], int]:
        assert kind == "events"
        self.lists += 1
        return [], 100 * self.lists

    def watch_kind(self, kind: str, namespace: str | None, *_: Any) -> Iterator[WatchEvent]:
        self.watches += 1
        if self.watches == 1:
            raise KubeError("watch events: too old resource version", 410)
        yield "ADDED", evicted()
        threading.Event().wait(30)  # the server holds the stream open


def test_a_compacted_version_is_listed_again_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_watch, "RETRY_SECONDS", 60.0)  # would outlast the test

    async def scenario() -> tuple[int, list[dict[str, Any]]]:
        kube = CompactedOnce()
        watch = event_watch.EventWatch([None], lambda key, uid: None)
        task = asyncio.create_task(watch.run(kube))  # type: ignore[arg-type]
        for _ in range(100):
            await asyncio.sleep(0.05)
            if watch.synced and watch.about(("team-a", "Pod", POD)):
                break
        task.cancel()
        return kube.lists, watch.about(("team-a", "Pod", POD))

    lists, held = asyncio.run(scenario())
    assert lists == 2, "listed, the watch answered 410, listed again without the retry wait"
    assert [e["reason"] for e in held] == ["Evicted"]
