"""Reading the Events about a failed attempt once a failure is seen: only the reasons the
classifier reads, from the watch's cache (`event_cache`, `cached_events`), or, while that
cache is not synced, by LISTs (`read_events`). Both pick the same Events."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rtj_operator import reconcile as rc
from rtj_operator.kube import Kube
from rtj_operator.policy.classify import reads_event
from rtj_operator.policy.node_event_sources import NODE_EVENT_NAMESPACE

QUERIES_BY_NAME = 16
"""Up to this many pods (nodes, JobSets) of a failed attempt, their Events are read by name
(one small answer each); beyond, one paged read of every such Event in the namespace. A
namespace of many jobs holds Events about every job's pods: read whole for each failure,
a recovery's cost grew with the number of jobs (`bench.operator_scale_jobs`)."""


def workload_jobset(name: str) -> str | None:
    """Kueue names a JobSet's Workload `jobset-<jobset>-<5 hex>`."""
    if not name.startswith("jobset-"):
        return None
    body, _, suffix = name[len("jobset-") :].rpartition("-")
    return body if body and len(suffix) == 5 else None


def queries_by_name(scope: str, kind: str, names: set[str]) -> list[tuple[str, str, str]]:
    """The Event queries for `names` of `kind` in `scope`: one by name each, or, for more
    than QUERIES_BY_NAME of them, one for the kind (filtered by name after)."""
    if len(names) > QUERIES_BY_NAME:
        return [(scope, kind, f"involvedObject.kind={kind}")]
    return [(scope, kind, f"involvedObject.kind={kind},involvedObject.name={n}")
            for n in sorted(names)]  # fmt: skip


EventKey = tuple[str, str, str]
"""(namespace, kind, name) of what an Event is about; Node: ("", "Node", node); a Kueue
Workload: its JobSet's name."""


def event_key(body: Mapping[str, Any]) -> EventKey | None:
    """Index key of an event: (namespace, kind, name); Node events have namespace ''."""
    obj = body.get("involvedObject") or body.get("regarding") or {}
    kind, name = obj.get("kind"), obj.get("name")
    if not kind or not name:
        return None
    if kind == "Node":
        return ("", "Node", name)
    namespace = obj.get("namespace") or (body.get("metadata") or {}).get("namespace") or ""
    if kind == "Workload":
        jobset = workload_jobset(name)
        return (namespace, "Workload", jobset) if jobset else None
    return (namespace, kind, name)


def relevant_event(body: Mapping[str, Any]) -> bool:
    """Events worth keeping for a classification: exactly those the classifier reads
    (`policy.classify.reads_event`), so the reader and the classifier never disagree."""
    return reads_event(body)


KUEUE_STOPPED = "Stopped"
"""The reason of the Event Kueue writes on a job it stops (suspends) after evicting its
Workload, with the eviction's message, in every version (v0.17.0:
pkg/controller/jobframework/reconciler.go, `stopJob`; fixtures in tests/fixtures/classify)."""


Query = tuple[str, str, str]
"""(namespace, kind, field selector) of one Event read."""
Answers = list[dict[str, Any]]
RunAll = Callable[[Callable[[Query], Answers], list[Query]], Iterable[Answers]]
"""How a batch of reads runs: `map` (one after another), or an executor's `map` (at once;
the controller's). Answers come back in the order asked; the first failed read raises."""


def read_events(kube: Kube, snap: rc.Snapshot, run_all: RunAll = map) -> list[dict[str, Any]]:
    """Events about the failed attempt, by LISTs (blocking): while the watch's cache is not
    synced (`cached_events` otherwise). Pods and Kueue Workloads in the job's namespace,
    nodes where their own reporters write them (`node_event_sources`: an Event naming a node
    in a tenant's namespace is that tenant speaking); only the Events the classifier reads.

    The reads by name go out together (`run_all`): one after another, a failure's reads were
    most of its decision time on a busy API server (`bench.operator_scale_jobs`); at once, the
    API server still scans every Event of the namespace for each, which is why the watch's
    cache is read first. A
    Workload's name is its JobSet's plus a hash, so its Events are read by kind for the whole
    namespace, the largest read with many jobs there: it is made only when Kueue stopped one
    of the attempt's JobSets (its `Stopped` Event, written with every eviction and the same
    message, is read by name first): a Workload's Events only ever add to an eviction Kueue
    says it made."""
    namespace, pods, nodes, jobsets = attempt_objects(snap)
    queries: list[Query] = [
        # Kueue before v0.7 (and the JobSet controller) write about the JobSet itself
        *queries_by_name(namespace, "JobSet", jobsets),
        *queries_by_name(namespace, "Pod", pods),
        *queries_by_name(NODE_EVENT_NAMESPACE, "Node", nodes),
    ]

    def read(query: Query) -> Answers:
        # a failed read raises: a classification is never final on partial evidence
        return kube.list_events(query[0], query[2])

    answers = list(zip(queries, run_all(read, queries), strict=True))
    if any(kueue_stopped(event, jobsets) for (_, kind, _), found in answers
           if kind == "JobSet" for event in found):  # fmt: skip
        # read by kind, matched to its JobSet by `workload_jobset`
        workloads = (namespace, "Workload", "involvedObject.kind=Workload")
        answers.append((workloads, read(workloads)))
    wanted: list[dict[str, Any]] = []
    for (_, kind, _), found in answers:
        for event in found:
            ek = event_key(event)
            if ek is None or not relevant_event(event):
                continue
            name = ek[2]
            if (
                (kind == "Pod" and name in pods)
                or (kind == "Node" and name in nodes)
                or (kind in ("Workload", "JobSet") and name in jobsets)
            ):
                wanted.append(rc.trim_event(event))
    return wanted


AttemptObjects = tuple[str, set[str], set[str], set[str]]
"""The namespace, pods, nodes and JobSets of an attempt whose Events a failure reads."""


def attempt_objects(snap: rc.Snapshot) -> AttemptObjects:
    pods = {p["metadata"]["name"] for p in (*snap.pods, *snap.gone_pods)}
    nodes = set(snap.nodes) | {
        n for p in (*snap.pods, *snap.gone_pods) if (n := (p.get("spec") or {}).get("nodeName"))
    }
    jobsets = {js["metadata"]["name"] for js in snap.jobsets}
    return snap.rtj.metadata.namespace, pods, nodes, jobsets


def cached_events(
    about: Callable[[EventKey], list[dict[str, Any]]], snap: rc.Snapshot
) -> list[dict[str, Any]]:
    """What `read_events` would find, from the Events kept by the watch (`about` one object:
    `event_cache`; every one already passed `relevant_event` and is trimmed): no API call,
    and no cost that grows with the Events of other jobs."""
    namespace, pods, nodes, jobsets = attempt_objects(snap)
    on_jobsets = [e for n in sorted(jobsets) for e in about((namespace, "JobSet", n))]
    found = [
        *on_jobsets,
        *(e for n in sorted(pods) for e in about((namespace, "Pod", n))),
        *(e for n in sorted(nodes) for e in about(("", "Node", n))),
    ]
    if any(kueue_stopped(event, jobsets) for event in on_jobsets):
        found += [e for n in sorted(jobsets) for e in about((namespace, "Workload", n))]
    return found


def kueue_stopped(event: Mapping[str, Any], jobsets: set[str]) -> bool:
    """Whether `event` is Kueue's `Stopped` on one of `jobsets`."""
    key = event_key(event)
    return key is not None and key[2] in jobsets and event.get("reason") == KUEUE_STOPPED
