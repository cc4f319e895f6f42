"""Which Event queries a failed attempt's classification makes (`event_reads`): by name for
the attempt's few pods, nodes and JobSets, so a namespace of many jobs is not read whole
for each failure (`bench.operator_scale_jobs`)."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from rtj_test_support import FIXTURES, load_json
from rtj_world import jobset, pod, rtj_raw, snapshot

from rtj_operator import event_reads
from rtj_operator import reconcile as rc
from rtj_operator.kube_errors import Unavailable


def test_a_few_objects_are_asked_for_by_name() -> None:
    queries = event_reads.queries_by_name("team-a", "Pod", {"llm-a1-w-0-1", "llm-a1-w-0-0"})
    assert queries == [
        ("team-a", "Pod", "involvedObject.kind=Pod,involvedObject.name=llm-a1-w-0-0"),
        ("team-a", "Pod", "involvedObject.kind=Pod,involvedObject.name=llm-a1-w-0-1"),
    ]
    assert event_reads.queries_by_name("team-a", "JobSet", set()) == []


def test_many_objects_are_read_by_kind_in_one_paged_query() -> None:
    pods = {f"llm-a1-w-0-{i}" for i in range(event_reads.QUERIES_BY_NAME + 1)}
    assert event_reads.queries_by_name("team-a", "Pod", pods) == [
        ("team-a", "Pod", "involvedObject.kind=Pod")
    ]


class RecordedEvents:
    """`Kube.list_events` over a fixed list of Events, answering each field selector as the
    API server does (equality on involvedObject.kind and .name), and recording the queries."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.queries: list[tuple[str | None, str | None]] = []

    def list_events(
        self, namespace: str | None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        self.queries.append((namespace, field_selector))
        terms = dict(t.split("=", 1) for t in (field_selector or "").split(",") if t)
        return [
            e for e in self.events
            if (e["metadata"]["namespace"] == namespace or namespace is None)
            and all(e["involvedObject"].get(k.split(".")[1]) == v for k, v in terms.items())
        ]  # fmt: skip


def kueue_v017_preemption() -> list[dict[str, Any]]:
    """Kueue v0.17.0's Events for preempting job `llm`'s first JobSet (tests/fixtures/classify,
    sources there), and one about another job's Workload in the same namespace."""
    found = load_json(FIXTURES / "classify" / "preempted_by_kueue_v017" / "events.json")
    events: list[dict[str, Any]] = found["items"]
    other = copy.deepcopy(next(e for e in events if e["involvedObject"]["kind"] == "Workload"))
    other["involvedObject"]["name"] = "jobset-other-a1-0f3a9"
    return [*events, other]


def attempt_snapshot() -> rc.Snapshot:
    raw = rtj_raw({"phase": "Running", "attempt": 1})
    return snapshot(raw, jobsets=[jobset(1)], pods=[pod(1, 0, exit_code=143)])


def workload_queries(kube: RecordedEvents) -> list[tuple[str | None, str | None]]:
    return [q for q in kube.queries if "Workload" in (q[1] or "")]


def test_a_failure_kueue_did_not_stop_never_reads_the_namespaces_workload_events() -> None:
    """Every Workload Event of the namespace (one per admission, for every job there) is read
    only once Kueue says it stopped one of this attempt's JobSets."""
    kube = RecordedEvents([e for e in kueue_v017_preemption()
                           if e["involvedObject"]["kind"] == "Workload"])  # fmt: skip
    found = event_reads.read_events(kube, attempt_snapshot())  # type: ignore[arg-type]
    assert workload_queries(kube) == [] and found == []
    assert ("team-a", "involvedObject.kind=JobSet,involvedObject.name=llm-a1") in kube.queries


def test_kueue_stopping_the_jobset_reads_its_workloads_events_and_only_its_own() -> None:
    kube = RecordedEvents(kueue_v017_preemption())
    found = event_reads.read_events(kube, attempt_snapshot())  # type: ignore[arg-type]
    assert workload_queries(kube) == [("team-a", "involvedObject.kind=Workload")]
    assert sorted((e["involvedObject"]["kind"], e["reason"]) for e in found) == [
        ("JobSet", "Stopped"),
        ("Workload", "EvictedDueToPreempted"),
        ("Workload", "Preempted"),
    ]
    assert all(e["involvedObject"]["name"] != "jobset-other-a1-0f3a9" for e in found)


def test_another_jobs_stopped_jobset_does_not_open_the_workload_read() -> None:
    stopped = next(e for e in kueue_v017_preemption() if e["reason"] == "Stopped")
    stopped["involvedObject"]["name"] = "other-a1"
    kube = RecordedEvents([stopped])
    event_reads.read_events(kube, attempt_snapshot())  # type: ignore[arg-type]
    assert workload_queries(kube) == []


def test_the_reads_by_name_go_out_together_and_a_failed_one_fails_the_read() -> None:
    """One batch for the JobSet's, the pods' and the nodes' Events (the controller runs it on
    its event readers, at once); a read that fails raises: never a verdict on part of it."""
    kube = RecordedEvents(kueue_v017_preemption())
    batches: list[list[tuple[str, str, str]]] = []

    def run_all(read: Any, queries: list[tuple[str, str, str]]) -> Any:
        batches.append(list(queries))
        return map(read, queries)

    snap = attempt_snapshot()
    event_reads.read_events(kube, snap, run_all)  # type: ignore[arg-type]
    (batch,) = batches
    assert [kind for _, kind, _ in batch] == ["JobSet", "Pod", "Node"]
    assert kube.queries[: len(batch)] == [(scope, selector) for scope, _, selector in batch]

    class NodeEventsDown(RecordedEvents):
        def list_events(self, namespace: str | None, field_selector: str | None = None) -> Any:
            if "kind=Node" in (field_selector or ""):
                raise Unavailable("list events in default: HTTP 503")
            return super().list_events(namespace, field_selector)

    with ThreadPoolExecutor(4) as pool, pytest.raises(Unavailable, match="503"):
        event_reads.read_events(NodeEventsDown([]), snap, pool.map)  # type: ignore[arg-type]
