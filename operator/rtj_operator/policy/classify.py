"""Classify why an attempt failed, from plain pod / node / event JSON. Pure.

A synchronous job fails as a group: one rank dies and every other rank times out in a
collective a little later. The useful answer is the *first* failed rank and the evidence
that explains it, not the last NCCL timeout. The rules, in order:

1. Every pod that failed (terminated non-zero, disrupted, deleted, on a lost node, stuck on
   a config or pull error, rejected at admission) becomes a `PodFailure` with an onset time
   and the most specific class its findings support (`findings.PRIORITY`: node-level
   hardware evidence beats the exit code it caused). Findings come from `pod_signals` (the
   pod object and its container's words) and `node_signals` (its node).
2. The first failure is the earliest onset; failures within `CLOCK_SKEW` of it compete on
   specificity. A lost node's onset is its last heartbeat (bounded by the controller's grace
   period), not its NotReady declaration 40-50 s later, so a dead node comes before the
   transport errors its peers print while it is still called Ready.
3. A network-looking or unexplained first failure yields to node-level evidence (a fatal
   agent condition, an unhealthy device, a lost node, the kernel's OOM killer) on any rank's
   node that is not later than it: "NCCL timeout with no earlier root cause" is what
   `NetworkFault` means.
4. Kueue evicting the whole workload (preemption, or the PodsReady timeout), not later than
   the first pod failure, is the answer: the job's code did not fail.

Nodes are proposed for quarantine only for infrastructure-category results and only on
node-level evidence: what a trainer prints ("Xid 79", "fallen off the bus") makes a GPU
fault *suspect* (restart elsewhere) and never taints a node by itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rtj_operator.api.attempts import FirstFailed
from rtj_operator.api.detection_spec import NodeHealth
from rtj_operator.api.reasons import FailureCategory, FailureClass
from rtj_operator.policy import node_event_sources, node_signals, pod_signals
from rtj_operator.policy.findings import (
    CLOCK_SKEW,
    FAR_FUTURE,
    KUEUE,
    RANK,
    Finding,
    iso,
    most_specific,
    within,
)
from rtj_operator.policy.node_signals import NODE_MONITOR_GRACE, NodeContext
from rtj_operator.policy.observed import (
    EventView,
    PodView,
    ReadOnce,
    read_event,
    read_node,
    read_pod,
)
from rtj_operator.policy.pod_signals import CONFIG_ERROR_GRACE, PodContext
from rtj_operator.policy.xid import xid_codes

__all__ = [
    "CLOCK_SKEW",
    "CONFIG_ERROR_GRACE",
    "NODE_MONITOR_GRACE",
    "Classification",
    "Decision",
    "FirstFailed",
    "classify_failure",
    "no_failure_json",
    "reads_event",
]

C = FailureClass
_SECONDARY = (C.NETWORK_FAULT, C.UNKNOWN)
_ROOT_CAUSES = (C.GPU_FAULT, C.NODE_LOST, C.OUT_OF_MEMORY)


@dataclass(frozen=True)
class PodFailure:
    pod: PodView
    onset: datetime | None
    cause: Finding
    findings: tuple[Finding, ...]

    @property
    def failure_class(self) -> FailureClass:
        return self.cause.failure_class or C.UNKNOWN

    def order(self) -> tuple[datetime, int, int]:
        rank = self.pod.node_rank if self.pod.node_rank is not None else 1 << 30
        return (self.onset or FAR_FUTURE, RANK[self.failure_class], rank)


@dataclass(frozen=True)
class Decision:
    """Which signal decided the class, where it came from, and the rule that applied."""

    signal: str
    source: str
    rule: str
    suspect: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "source": self.source,
            "rule": self.rule,
            "suspect": self.suspect,
        }


@dataclass(frozen=True)
class Classification:
    """Why the attempt failed, which rank failed first, and the evidence used."""

    failure_class: FailureClass
    first_failed: FirstFailed | None
    nodes_to_quarantine: tuple[str, ...] = ()
    evidence: tuple[str, ...] = field(default_factory=tuple)
    decided_by: Decision | None = None

    @property
    def category(self) -> FailureCategory:
        return self.failure_class.category

    @property
    def retryable(self) -> bool:
        return self.category.retryable

    @property
    def failed_at(self) -> datetime | None:
        return self.first_failed.finished_at if self.first_failed else None

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.failure_class.value,
            "category": self.category.value,
            "retryable": self.retryable,
            "first_failed": _first_failed_json(self.first_failed),
            "nodes_to_quarantine": list(self.nodes_to_quarantine),
            "decided_by": self.decided_by.to_json() if self.decided_by else None,
            "evidence": list(self.evidence),
        }


def no_failure_json() -> dict[str, Any]:
    """`rtj classify` output when no pod has failed."""
    return {
        "class": None,
        "category": None,
        "retryable": None,
        "first_failed": None,
        "nodes_to_quarantine": [],
        "decided_by": None,
        "evidence": [],
    }


# --- one pod -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    pods: PodContext
    nodes: NodeContext


def _failures(pod: PodView, ctx: _Context) -> list[Finding]:
    found = [f for t in pod.terminations if (f := pod_signals.termination(pod, t, ctx.pods))]
    found += pod_signals.disruption(pod) + pod_signals.status_reason(pod)
    found += node_signals.lost_node(pod, ctx.nodes, pod_signals.planned_shutdown(pod))
    found += pod_signals.waiting(pod, ctx.pods) + pod_signals.deleted(pod)
    found += pod_signals.pod_events(pod, ctx.pods.events)
    if not found and pod.phase == "Failed":
        found.append(
            Finding(
                C.UNKNOWN,
                f"pod {pod.name}: phase Failed ({pod.reason or '-'})",
                signal=f"pod {pod.name} status.phase",
            )
        )
    return found


def _pod_failure(pod: PodView, ctx: _Context) -> PodFailure | None:
    failures = _failures(pod, ctx)
    if not failures or pod.phase == "Succeeded":
        return None
    findings = tuple(failures + node_signals.explanations(pod, ctx.nodes))
    cause = most_specific(findings)
    assert cause is not None
    onset = min((f.at for f in failures if f.at is not None), default=None)
    return PodFailure(pod, onset, cause, findings)


# --- the attempt ---------------------------------------------------------------------------


def _first(failures: Sequence[PodFailure]) -> PodFailure:
    """Earliest onset; close calls (clock skew) go to the most specific cause."""
    earliest = min(failures, key=PodFailure.order)
    close = [f for f in failures if f.onset is None or within(f.onset, earliest.onset)]
    if earliest.onset is not None:
        close = [f for f in close if f.onset is not None]
    return min(close, key=lambda f: (RANK[f.failure_class], f.order()))


def _root_cause(first: PodFailure, pods: Sequence[PodView], ctx: _Context) -> PodFailure:
    """A network-looking or unexplained first failure yields to earlier node evidence."""
    if first.failure_class not in _SECONDARY:
        return first
    for pod in sorted(pods, key=lambda p: (p.node_rank is None, p.node_rank or 0)):
        found = [
            f
            for f in node_signals.explanations(pod, ctx.nodes)
            if f.failure_class in _ROOT_CAUSES and within(f.at, first.onset)
        ]
        if lost := node_signals.lost_node(pod, ctx.nodes, pod_signals.planned_shutdown(pod)):
            found += [f for f in lost if within(f.at, first.onset)]
        if cause := most_specific(found):
            return PodFailure(pod, cause.at or first.onset, cause, tuple(found))
    return first


_KUEUE_PREEMPTION = re.compile(r"Preempted to accommodate|Preempted by another workload", re.I)
_KUEUE_PODS_READY = "Exceeded the PodsReady timeout"


def _kueue_eviction(events: Sequence[EventView]) -> tuple[EventView, FailureClass] | None:
    """Kueue evicting the workload: Workload events `Preempted`, `EvictedDueToPreempted`,
    `EvictedDueToPodsReadyTimeout` (v0.9+), or the JobSet's `Stopped` event carrying the
    eviction message (every version; the only trace in v0.6)."""
    found: list[tuple[EventView, FailureClass]] = []
    for e in events:
        if e.reason == "EvictedDueToPodsReadyTimeout" or _KUEUE_PODS_READY in e.message:
            found.append((e, C.PODS_READY_TIMEOUT))
        elif _KUEUE_PREEMPTION.search(e.message) or (
            e.kind == "Workload" and e.reason in ("Preempted", "EvictedDueToPreempted")
        ):
            found.append((e, C.PREEMPTED))
    return min(found, key=lambda f: f[0].at or FAR_FUTURE, default=None)


def reads_event(body: Mapping[str, Any]) -> bool:
    """Whether the classifier reads this Event (core/v1 or events.k8s.io/v1): the filter an
    event reader should apply, so the two never disagree about what counts."""
    event = read_event(body)
    text = f"{event.reason} {event.message}"
    return node_event_sources.counts(event) and (
        event.reason in pod_signals.READ_EVENT_REASONS
        or event.reason in node_signals.READ_EVENT_REASONS
        or (event.kind == "Workload" and event.reason.startswith(("Preempted", "EvictedDueTo")))
        or bool(_KUEUE_PREEMPTION.search(event.message))
        or _KUEUE_PODS_READY in event.message
        or event.message.startswith("Failed to pull image")
        or (event.kind == "Node" and bool(xid_codes(text)))
    )


def _first_failed(failure: PodFailure) -> FirstFailed:
    cause, pod = failure.cause, failure.pod
    term = next((f for f in failure.findings if f.exit_code is not None), None)
    exit_from = cause if cause.exit_code is not None else term
    rank = next((f.rank for f in failure.findings if f.rank is not None), None)
    return FirstFailed(
        pod=pod.name,
        rank=rank if rank is not None else pod.node_rank,
        node_rank=pod.node_rank,
        node=pod.node,
        container=cause.container or (exit_from.container if exit_from else None),
        exit_code=exit_from.exit_code if exit_from else None,
        finished_at=failure.onset,
    )


def suspected(
    first: FirstFailed,
    findings: Sequence[Finding],
    failures: Sequence[PodFailure],
    views: Sequence[PodView],
) -> FirstFailed:
    """For a suspect state (every rank exits with the same verdict): the first pod of the
    attempt the trainers' verdict names, with the rank it names, instead of the first pod to
    exit; `first` when the verdict names no pod of the attempt."""
    verdict = next((f.verdict for f in findings if f.verdict is not None), None)
    if verdict is None:
        return first
    by_rank = {v.node_rank: v for v in views if v.node_rank is not None}
    pod = next((by_rank[n] for n in verdict.pods if n in by_rank), None)
    if pod is None:
        return first
    own = next((f for f in failures if f.pod.name == pod.name), None)
    named = _first_failed(own) if own is not None else first
    return named.model_copy(update={
        "pod": pod.name, "node_rank": pod.node_rank, "node": pod.node, "suspect": True,
        "rank": verdict.ranks[0] if verdict.ranks else None,
        **({} if own is not None else {"exit_code": None}),
    })  # fmt: skip


def _quarantine(
    cls: FailureClass, failures: Sequence[PodFailure], root: PodFailure, ctx: _Context
) -> tuple[str, ...]:
    """Nodes with node-level evidence; never for a user-category failure."""
    if cls.category is not FailureCategory.INFRASTRUCTURE:
        return ()
    findings = [f for pf in (*failures, root) for f in pf.findings]
    named = {f.quarantine for f in findings if f.quarantine}
    if ctx.nodes.nodes is not None:
        named &= set(ctx.nodes.nodes)
    return tuple(sorted(named))


def _evidence(
    root: PodFailure, failures: Sequence[PodFailure], extra: Sequence[str]
) -> tuple[str, ...]:
    lines = [*extra, root.cause.evidence]
    lines += [f.evidence for f in root.findings if f is not root.cause]
    others = sorted((f for f in failures if f.pod.name != root.pod.name), key=PodFailure.order)
    lines += [f"then: {f.cause.evidence}" for f in others[:8]]
    if len(others) > 8:
        lines.append(f"then: {len(others) - 8} more failed pods")
    return tuple(dict.fromkeys(lines))


def _decision(root: PodFailure, first: PodFailure, quarantined: tuple[str, ...]) -> Decision:
    cause = root.cause
    if root is not first:
        rule = "node-level evidence no later than the first failure explains it"
    elif cause.suspect:
        rule = "hardware words in the trainer's own message: a suspect, restarted, not quarantined"
    else:
        rule = "the earliest failure, its most specific finding"
    if quarantined:
        rule += f"; quarantine {', '.join(quarantined)} on node-level evidence"
    return Decision(cause.signal or "pod status", cause.source, rule, cause.suspect)


def jobset_failure(evidence: str) -> Classification:
    """A failure seen on the JobSet rather than on a pod (gone, or failed with no pod)."""
    return Classification(FailureClass.UNKNOWN, None, (), (evidence,))


def classify_failure(
    pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]] | None,
    events: Sequence[Mapping[str, Any]],
    now: datetime,
    *,
    node_health: NodeHealth | None = None,
    read: ReadOnce | None = None,
    preflight_image: str | None = None,
) -> Classification | None:
    """Why this attempt failed, or None while no pod has failed.

    `pods` are the attempt's pods (deleted ones as last seen, with deletionTimestamp);
    `nodes` the nodes they ran on, or None when unknown (then a missing node proves
    nothing); `events` those about the pods, their nodes, the JobSet and its Kueue Workload
    (core/v1 and events.k8s.io/v1 alike; a Node's count only from its own reporters,
    `node_event_sources`). `read`: pods and nodes already read, kept across calls (for
    objects never edited in place, `ReadOnce`). `preflight_image`: the platform's preflight
    image (`policy.preflight`): a failed preflight that ran it blames its node.
    """
    health = node_health or NodeHealth()
    by_pod, by_node = (read.pod, read.node) if read is not None else (read_pod, read_node)
    views = [by_pod(p) for p in pods]
    seen_events = [v for e in events if node_event_sources.counts(v := read_event(e))]
    node_views = None if nodes is None else {v.name: v for v in map(by_node, nodes)}
    ctx = _Context(
        PodContext(
            frozenset(health.xid_codes),
            seen_events,
            frozenset(i for v in views for i in v.started_images),
            now,
            preflight_image,
        ),
        NodeContext(health, node_views, seen_events),
    )
    failures = [f for pod in views if (f := _pod_failure(pod, ctx))]
    kueue = _kueue_eviction(seen_events)
    if not failures and kueue is None:
        return None
    first = _first(failures) if failures else None
    if kueue is not None and (first is None or within(kueue[0].at, first.onset)):
        return _evicted_by_kueue(*kueue, first, failures)
    assert first is not None
    root = _root_cause(first, views, ctx)
    cls = root.failure_class
    extra = (
        [] if root is first else [f"root cause before the first failure ({first.cause.evidence})"]
    )
    quarantined = _quarantine(cls, failures, root, ctx)
    return Classification(
        cls,
        suspected(_first_failed(root), root.findings, failures, views),
        quarantined,
        _evidence(root, failures, extra),
        _decision(root, first, quarantined),
    )


def _evicted_by_kueue(
    event: EventView, cls: FailureClass, first: PodFailure | None, failures: Sequence[PodFailure]
) -> Classification:
    line = (
        f"Kueue evicted the workload at {iso(event.at)}: {event.kind} {event.name} "
        f"{event.reason}: {event.message}"
    )
    others = [f"then: {f.cause.evidence}" for f in sorted(failures, key=PodFailure.order)[:8]]
    rule = (
        "the queue evicted the admitted workload before any pod failed on its own"
        if cls is C.PREEMPTED
        else "the group's pods were not ready within Kueue's waitForPodsReady timeout: "
        "no failure of the job's code"
    )
    signal = f"{event.kind} {event.name} event {event.reason} ({event.api})"
    return Classification(
        cls,
        _first_failed(first) if first else None,
        (),
        (line, *others),
        Decision(signal, KUEUE, rule),
    )


def _first_failed_json(first: FirstFailed | None) -> dict[str, Any] | None:
    """The first failed rank as `rtj classify` prints it (snake_case, as since v0.1)."""
    if first is None:
        return None
    return {**first.model_dump(), "finished_at": iso(first.finished_at)}
