"""The Events the classifier reads, kept from a watch (`event_cache`, `event_reads.cached_events`):
a failure reads the same Events from memory as its LISTs would find, and what a tenant writes
is bounded where it costs only itself."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from rtj_test_support import FIXTURES, load_json
from rtj_world import jobset, pod, rtj_raw, snapshot
from test_event_reads import RecordedEvents

from rtj_operator import event_reads
from rtj_operator import reconcile as rc
from rtj_operator.event_cache import EventCache
from rtj_operator.event_watch import kept, scopes_of

NODE = "gpu-node-001"
OTHER_NODE = "gpu-node-009"


def attempt() -> rc.Snapshot:
    raw = rtj_raw({"phase": "Running", "attempt": 1})
    pods = [pod(1, 0, exit_code=143, node=NODE), pod(1, 1, node=OTHER_NODE)]
    return snapshot(raw, jobsets=[jobset(1)], pods=pods)


def fixture_events() -> list[dict[str, Any]]:
    """Every Event of the classifier's fixture corpus (real components' Events, sources in
    tests/fixtures/classify/SOURCES.md), each renamed onto this attempt's pods, nodes and
    JobSet or onto another job's, in turn: relevant and not, trusted and forged. Only core/v1
    Events: both the LISTs and the watch read /api/v1 (where the API server shows an
    events.k8s.io/v1 Event as core/v1 too)."""
    snap = attempt()
    names = {
        "Pod": [*(p["metadata"]["name"] for p in snap.pods), "other-a1-w-0-0"],
        "Node": [NODE, OTHER_NODE, "gpu-node-042"],
        "JobSet": [snap.jobsets[0]["metadata"]["name"], "other-a1"],
    }
    turn = itertools.count()
    events = []
    for path in sorted(FIXTURES.glob("classify/*/events.json")):
        for item in load_json(path).get("items") or []:
            if "involvedObject" not in item:
                continue
            event = copy.deepcopy(item)
            obj = event["involvedObject"]
            kind = obj.get("kind")
            n = next(turn)
            if kind in names:
                obj["name"] = names[kind][n % len(names[kind])]
            elif kind == "Workload":
                obj["name"] = f"jobset-{names['JobSet'][n % 2]}-{n % 97:05x}"
            if kind != "Node":
                obj["namespace"] = event["metadata"]["namespace"] = "team-a"
            event["metadata"]["uid"] = f"event-{n}"
            events.append(event)
    return events


def filled(events: list[dict[str, Any]]) -> EventCache:
    cache = EventCache()
    cache.replace(t for e in events if (t := kept(e)) is not None)
    return cache


def by_uid(events: list[dict[str, Any]]) -> list[str]:
    return sorted(e["metadata"]["uid"] for e in events)


def test_the_cache_finds_what_the_lists_would_find_over_the_fixture_corpus() -> None:
    events = fixture_events()
    snap = attempt()
    listed = event_reads.read_events(RecordedEvents(events), snap)  # type: ignore[arg-type]
    cached = event_reads.cached_events(filled(events).about, snap)
    assert len(listed) >= 10, "the corpus reaches this attempt: the comparison means something"

    def uid(event: dict[str, Any]) -> str:
        return str(event["metadata"]["uid"])

    assert sorted(cached, key=uid) == sorted(listed, key=uid), "the same Events, as trimmed"


def test_the_cache_keeps_only_what_the_classifier_reads() -> None:
    events = fixture_events()
    cache = filled(events)
    kept_uids = {e["metadata"]["uid"] for e in events if event_reads.relevant_event(e)}
    assert 0 < len(cache) == len(kept_uids) < len(events)


def test_a_workload_event_is_read_only_once_kueue_stopped_the_jobset() -> None:
    snap = attempt()
    name = snap.jobsets[0]["metadata"]["name"]
    preempted = {
        "metadata": {"uid": "w1", "namespace": "team-a", "name": "w1"},
        "involvedObject": {"kind": "Workload", "name": f"jobset-{name}-5c1e2",
                           "namespace": "team-a"},
        "reason": "Preempted", "message": "Preempted to accommodate a workload",
    }  # fmt: skip
    stopped = {
        "metadata": {"uid": "s1", "namespace": "team-a", "name": "s1"},
        "involvedObject": {"kind": "JobSet", "name": name, "namespace": "team-a"},
        "reason": event_reads.KUEUE_STOPPED,
        "message": "Preempted to accommodate a workload (UID: 9f54) due to prioritization",
    }
    cache = filled([preempted])
    assert event_reads.cached_events(cache.about, snap) == []
    cache = filled([preempted, stopped])
    assert by_uid(event_reads.cached_events(cache.about, snap)) == ["s1", "w1"]


def evicted(n: int, pod_name: str, namespace: str = "team-a") -> dict[str, Any]:
    return {
        "metadata": {"uid": f"{namespace}-{pod_name}-{n}", "namespace": namespace,
                     "name": f"{pod_name}.{n}", "resourceVersion": str(100 + n)},
        "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": namespace},
        "reason": "Evicted", "message": f"The node was low on resource: memory ({n}).",
    }  # fmt: skip


def test_an_object_keeps_its_newest_events_and_an_update_replaces_in_place() -> None:
    cache = EventCache(per_object=3)
    for n in range(5):
        cache.apply("ADDED", evicted(n, "p"))
    assert by_uid(cache.about(("team-a", "Pod", "p"))) == [f"team-a-p-{n}" for n in (2, 3, 4)]
    cache.apply("MODIFIED", {**evicted(3, "p"), "message": "counted again"})
    held = cache.about(("team-a", "Pod", "p"))
    assert [e["message"] for e in held][-1] == "counted again" and len(held) == 3
    cache.apply("DELETED", evicted(4, "p"))
    assert by_uid(cache.about(("team-a", "Pod", "p"))) == ["team-a-p-2", "team-a-p-3"]
    assert len(cache) == 2


def test_a_tenant_flooding_made_up_names_evicts_only_its_own_namespace() -> None:
    cache = EventCache(per_namespace=10)
    cache.apply("ADDED", evicted(0, "real", "team-b"))
    cache.apply("ADDED", evicted(0, "real", "team-a"))
    for n in range(50):
        cache.apply("ADDED", evicted(n, f"made-up-{n}", "team-a"))
    assert cache.about(("team-b", "Pod", "real")), "another tenant's Events are untouched"
    assert not cache.about(("team-a", "Pod", "real")), "the flooder's own oldest went"
    assert len(cache) == 11
    assert cache.about(("team-a", "Pod", "made-up-49"))


def test_a_list_replaces_everything_and_marks_the_cache_synced() -> None:
    cache = EventCache()
    assert not cache.synced
    cache.apply("ADDED", evicted(0, "p"))
    cache.replace([evicted(1, "q")])
    assert cache.synced
    assert not cache.about(("team-a", "Pod", "p")), "an Event the LIST no longer holds is gone"
    assert by_uid(cache.about(("team-a", "Pod", "q"))) == ["team-a-q-1"]


def test_scopes_are_the_cluster_or_each_namespace_and_default() -> None:
    assert scopes_of(None) == [None]
    assert scopes_of(["team-a", "team-b"]) == ["team-a", "team-b", "default"]
    assert scopes_of(["default"]) == ["default"]
