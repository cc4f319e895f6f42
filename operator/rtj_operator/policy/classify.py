"""Classify why an attempt failed, from plain pod / node / event JSON. Pure.

A synchronous job fails as a group: one rank dies and every other rank times out in a
collective a little later. The useful answer is the *first* failed rank and the evidence
that explains it, not the last NCCL timeout. The rules, in order:

1. Every pod that failed (terminated non-zero, disrupted, deleted, on a lost node, stuck on
   a config error) becomes a `PodFailure` with an onset time and the most specific class
   its findings support (`PRIORITY`: hardware evidence beats the exit code it caused).
2. The first failure is the earliest onset; failures within `CLOCK_SKEW` of it compete on
   specificity, because kubelet timestamps have second resolution and node clocks drift.
3. A network-looking or unexplained first failure yields to infrastructure evidence (a
   configured XID, an unhealthy device, a lost node) on any rank's node that is not later
   than it: "NCCL timeout with no earlier root cause" is what `NetworkFault` means.
4. A Kueue preemption of the whole workload, not later than the first pod failure, makes
   the attempt `Preempted`.

Nodes are proposed for quarantine only for infrastructure-category results, never for a
user-category failure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from rtj_operator.api.keys import RESUME_INIT_CONTAINER
from rtj_operator.api.reasons import FailureCategory, FailureClass
from rtj_operator.api.spec import NodeHealth
from rtj_operator.policy.observed import (
    EventView,
    NodeView,
    PodView,
    Termination,
    first_line,
    read_event,
    read_node,
    read_pod,
)

C = FailureClass
CLOCK_SKEW = timedelta(seconds=5)
CONFIG_ERROR_GRACE = timedelta(seconds=120)
"""Image pulls and missing Secrets can be transient: stuck this long, they are config errors."""

PRIORITY = (
    C.GPU_FAULT, C.NODE_LOST, C.PREEMPTED, C.EVICTED, C.CHECKPOINT_CORRUPT, C.CONFIG_ERROR,
    C.OUT_OF_MEMORY, C.NETWORK_FAULT, C.USER_ERROR, C.UNKNOWN,
)  # fmt: skip
_RANK = {cls: i for i, cls in enumerate(PRIORITY)}
_SECONDARY = (C.NETWORK_FAULT, C.UNKNOWN)
_ROOT_CAUSES = (C.GPU_FAULT, C.NODE_LOST)

_CUDA_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED"
)
_XID_TEXT = re.compile(r"\bXid\b\s*(?:\([^)]*\))?\s*:?\s*(\d+)", re.I)
_XID_CONDITION = re.compile(r"(?:ErrorCode|\bXid\b)\s*(?:\([^)]*\))?\s*[:=]?\s*(\d+)", re.I)
_GPU_HARDWARE = re.compile(
    r"uncorrectable ECC error|fallen off the bus|GPU is lost|NVML_ERROR_GPU_IS_LOST"
    r"|Row remapp\w* fail",
    re.I,
)
_NETWORK = re.compile(
    r"NCCL (?:error|timeout|WARN)|Watchdog caught collective operation timeout"
    r"|ProcessGroupNCCL.*(?:time ?out|timed out)|c10d.*(?:timed out|timeout)|DistNetworkError"
    r"|Connection reset by peer|Connection closed by (?:remote )?peer|ncclRemoteError"
    r"|ncclSystemError|NCCL communicator was aborted|RendezvousClosedError"
    r"|RendezvousTimeoutError|Broken pipe",
    re.I,
)
_TRACEBACK = re.compile(
    r"Traceback \(most recent call last\)|ChildFailedError|\bnon-finite loss\b|\bloss is nan\b",
    re.I,
)
_TORCHRUN_ROOT_RANK = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.S)
_CONFIG_WAITING_NOW = frozenset({"InvalidImageName", "ErrImageNeverPull"})
_CONFIG_WAITING = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "CreateContainerError"}
)
_CANNOT_RUN = frozenset({"ContainerCannotRun", "StartError"})
_NODE_GONE_EVENTS = frozenset({"NodeNotReady", "RemovingNode", "DeletingNode", "NodeShutdown"})
_EVENT_CLASSES = {
    "Evicted": C.EVICTED,
    "Preempted": C.PREEMPTED,
    "TaintManagerEviction": C.NODE_LOST,
    "NodeNotReady": C.NODE_LOST,
}
_DISRUPTION_CLASSES = {
    "PreemptionByScheduler": C.PREEMPTED,
    "DeletionByTaintManager": C.NODE_LOST,
    "DeletionByPodGC": C.NODE_LOST,
    "EvictionByEvictionAPI": C.EVICTED,
}
_FAR_FUTURE = datetime.max.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Finding:
    """One piece of evidence about one pod, and the class it points to (None: a note)."""

    failure_class: FailureClass | None
    evidence: str
    at: datetime | None = None
    container: str | None = None
    exit_code: int | None = None
    quarantine: str | None = None
    rank: int | None = None


@dataclass(frozen=True)
class PodFailure:
    pod: PodView
    onset: datetime | None
    cause: Finding
    findings: tuple[Finding, ...]

    @property
    def failure_class(self) -> FailureClass:
        assert self.cause.failure_class is not None
        return self.cause.failure_class

    def order(self) -> tuple[datetime, int, int]:
        rank = self.pod.node_rank if self.pod.node_rank is not None else 1 << 30
        return (self.onset or _FAR_FUTURE, _RANK[self.failure_class], rank)


@dataclass(frozen=True)
class FirstFailedRank:
    pod: str
    rank: int | None
    node_rank: int | None
    node: str | None
    container: str | None
    exit_code: int | None
    finished_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "rank": self.rank,
            "node_rank": self.node_rank,
            "node": self.node,
            "container": self.container,
            "exit_code": self.exit_code,
            "finished_at": _iso(self.finished_at),
        }


@dataclass(frozen=True)
class Classification:
    """Why the attempt failed, which rank failed first, and the evidence used."""

    failure_class: FailureClass
    first_failed: FirstFailedRank | None
    nodes_to_quarantine: tuple[str, ...] = ()
    evidence: tuple[str, ...] = field(default_factory=tuple)

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
            "first_failed": self.first_failed.to_json() if self.first_failed else None,
            "nodes_to_quarantine": list(self.nodes_to_quarantine),
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
        "evidence": [],
    }


def _iso(at: datetime | None) -> str | None:
    return at.isoformat().replace("+00:00", "Z") if at else None


def _who(pod: PodView) -> str:
    rank = f" (node rank {pod.node_rank})" if pod.node_rank is not None else ""
    return f"pod {pod.name}{rank} on node {pod.node or '?'}"


# --- findings from one container termination --------------------------------------------


def _message_class(term: Termination, health: NodeHealth) -> tuple[FailureClass, str]:
    """The class a termination's reason and message point to, and the phrase that says so."""
    text = term.message
    xids = {int(code) for code in _XID_TEXT.findall(text)}
    if term.reason == "OOMKilled":
        return C.OUT_OF_MEMORY, "OOMKilled"
    if term.reason in _CANNOT_RUN or term.exit_code in (126, 127):
        return C.CONFIG_ERROR, f"could not run ({term.reason or term.exit_code})"
    if xids & set(health.xid_codes):
        return C.GPU_FAULT, f"GPU Xid {sorted(xids & set(health.xid_codes))} in its message"
    if match := _GPU_HARDWARE.search(text):
        return C.GPU_FAULT, f"GPU hardware error in its message ({match.group(0)})"
    if _CUDA_OOM.search(text):
        return C.OUT_OF_MEMORY, "CUDA out of memory"
    if match := _NETWORK.search(text):
        return C.NETWORK_FAULT, f"collective/network failure ({match.group(0)})"
    if _TRACEBACK.search(text):
        return C.USER_ERROR, "a traceback"
    return C.UNKNOWN, f"no recognizable cause (reason {term.reason or '-'})"


def _init_class(term: Termination) -> tuple[FailureClass, str]:
    """The resume init container's exit codes are rtj-shim's: 1 invalid step, 2 usage, 3 store."""
    if term.exit_code == 1:
        return C.CHECKPOINT_CORRUPT, "the pinned checkpoint step failed verification"
    if term.exit_code == 2:
        return C.CONFIG_ERROR, "rtj-shim usage error"
    return C.UNKNOWN, "the checkpoint store could not be read"


def _termination_finding(pod: PodView, term: Termination, health: NodeHealth) -> Finding | None:
    if term.exit_code in (0, None) and term.reason != "OOMKilled":
        return None
    if term.init and term.container == RESUME_INIT_CONTAINER:
        cls, why = _init_class(term)
    elif term.init:
        cls, why = C.CONFIG_ERROR, "an init container failed"
    else:
        cls, why = _message_class(term, health)
    rank = _TORCHRUN_ROOT_RANK.search(term.message)
    gpu = cls is C.GPU_FAULT
    detail = first_line(term.message)
    return Finding(
        cls,
        f"{_who(pod)}: container {term.container} exited {term.exit_code} at "
        f"{_iso(term.finished_at)}: {why}" + (f": {detail}" if detail else ""),
        at=term.finished_at,
        container=term.container,
        exit_code=term.exit_code,
        quarantine=pod.node if gpu else None,
        rank=int(rank.group(1)) if rank else None,
    )


# --- findings from the pod object, its node and its events ------------------------------


def _disruption(pod: PodView) -> list[Finding]:
    cond = pod.condition("DisruptionTarget")
    if cond is None:
        return []
    cls = _DISRUPTION_CLASSES.get(cond.reason)
    if cond.reason == "TerminationByKubelet":
        cls = C.EVICTED if pod.reason == "Evicted" else C.NODE_LOST
    cls = cls or C.UNKNOWN
    lost = pod.node if cls is C.NODE_LOST else None
    return [
        Finding(
            cls,
            f"{_who(pod)}: DisruptionTarget {cond.reason} at {_iso(cond.since)}: {cond.message}",
            at=cond.since,
            quarantine=lost,
        )
    ]


def _status_reason(pod: PodView) -> list[Finding]:
    shutdown = pod.reason in ("Terminated", "Shutdown") and "shut" in pod.message.lower()
    cls = {"Evicted": C.EVICTED, "NodeLost": C.NODE_LOST}.get(pod.reason)
    cls = C.NODE_LOST if shutdown else cls
    if cls is None:
        return []
    lost = pod.node if cls is C.NODE_LOST else None
    return [Finding(cls, f"{_who(pod)}: status {pod.reason}: {pod.message}", quarantine=lost)]


def _lost_node(pod: PodView, nodes: Mapping[str, NodeView] | None) -> list[Finding]:
    if pod.node is None or nodes is None:
        return []
    node = nodes.get(pod.node)
    if node is None:
        return [Finding(C.NODE_LOST, f"{_who(pod)}: node {pod.node} no longer exists")]
    if not node.lost:
        return []
    ready = node.ready
    since = node.unreachable_since or (ready.since if ready else None)
    state = f"Ready={ready.status} ({ready.reason}: {ready.message})" if ready else "unreachable"
    return [
        Finding(
            C.NODE_LOST,
            f"{_who(pod)}: node {pod.node} {state} since {_iso(since)}",
            at=since,
            quarantine=pod.node,
        )
    ]


def _config_waiting(pod: PodView, now: datetime) -> list[Finding]:
    onset = pod.scheduled_at
    stuck = onset is not None and now - onset >= CONFIG_ERROR_GRACE
    return [
        Finding(
            C.CONFIG_ERROR,
            f"{_who(pod)}: container {w.container} waiting: {w.reason}: {w.message}",
            at=onset,
            container=w.container,
        )
        for w in pod.waiting
        if w.reason in _CONFIG_WAITING_NOW or (w.reason in _CONFIG_WAITING and stuck)
    ]


def _deleted(pod: PodView) -> list[Finding]:
    if pod.deletion_onset is None:
        return []
    at = _iso(pod.deletion_onset)
    return [Finding(C.UNKNOWN, f"{_who(pod)}: deleted at {at}", at=pod.deletion_onset)]


def _pod_events(pod: PodView, events: Sequence[EventView]) -> list[Finding]:
    return [
        Finding(
            _EVENT_CLASSES[e.reason],
            f"{_who(pod)}: event {e.reason} at {_iso(e.at)}: {e.message}",
            at=e.at,
            quarantine=pod.node if _EVENT_CLASSES[e.reason] is C.NODE_LOST else None,
        )
        for e in events
        if e.kind == "Pod" and e.name == pod.name and e.reason in _EVENT_CLASSES
    ]


def _failures(pod: PodView, ctx: _Context) -> list[Finding]:
    found = [f for t in pod.terminations if (f := _termination_finding(pod, t, ctx.health))]
    found += _disruption(pod) + _status_reason(pod) + _lost_node(pod, ctx.nodes)
    found += _config_waiting(pod, ctx.now) + _deleted(pod) + _pod_events(pod, ctx.events)
    if not found and pod.phase == "Failed":
        found.append(Finding(C.UNKNOWN, f"{_who(pod)}: phase Failed ({pod.reason or '-'})"))
    return found


# --- explanations: what a pod's node and devices say -----------------------------------


def _codes(text: str, pattern: re.Pattern[str]) -> set[int]:
    return {int(code) for code in pattern.findall(text)}


def _node_xids(pod: PodView, ctx: _Context) -> list[Finding]:
    node = ctx.nodes.get(pod.node) if ctx.nodes is not None and pod.node else None
    if node is None:
        return []
    found: list[Finding] = []
    for key in ctx.health.xid_label_keys:
        value = node.labels.get(key)
        if value:
            found.append(
                _xid_finding(
                    pod, _codes(value, re.compile(r"(\d+)")), f"label {key}={value}", None, ctx
                )
            )
    for cond in node.conditions:
        if cond.type in ctx.health.xid_condition_types and cond.status == "True":
            codes = _codes(cond.message, _XID_CONDITION)
            seen = f"condition {cond.type}: {cond.message}"
            found.append(_xid_finding(pod, codes, seen, cond.since, ctx))
    return found


def _xid_finding(
    pod: PodView, codes: set[int], seen: str, at: datetime | None, ctx: _Context
) -> Finding:
    bad = sorted(codes & set(ctx.health.xid_codes))
    where = f"node {pod.node} {seen}"
    if not bad:
        return Finding(None, f"note: {where} (XID {sorted(codes)} not configured to quarantine)")
    return Finding(C.GPU_FAULT, f"{where}: XID {bad}", at=at, quarantine=pod.node)


def _devices(pod: PodView) -> list[Finding]:
    return [
        Finding(
            C.GPU_FAULT,
            f"{_who(pod)}: {d.resource} device {d.device} Unhealthy"
            + (f": {d.message}" if d.message else ""),
            container=d.container,
            quarantine=pod.node,
        )
        for d in pod.unhealthy_devices
    ]


def _node_events(pod: PodView, ctx: _Context) -> list[Finding]:
    after = pod.scheduled_at
    what = "node {}: event {} at {}: {}"
    return [
        Finding(C.NODE_LOST, what.format(pod.node, e.reason, _iso(e.at), e.message), e.at)
        for e in ctx.events
        if e.kind == "Node" and e.name == pod.node and e.reason in _NODE_GONE_EVENTS
        and (after is None or e.at is None or e.at >= after)
    ]  # fmt: skip


def _explanations(pod: PodView, ctx: _Context) -> list[Finding]:
    return _node_xids(pod, ctx) + _devices(pod) + _node_events(pod, ctx)


# --- putting it together -----------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    health: NodeHealth
    nodes: Mapping[str, NodeView] | None
    events: Sequence[EventView]
    now: datetime


def _most_specific(findings: Iterable[Finding]) -> Finding | None:
    ranked = [f for f in findings if f.failure_class is not None]
    return min(ranked, key=lambda f: (_RANK[f.failure_class], f.at or _FAR_FUTURE), default=None)  # type: ignore[index]


def _pod_failure(pod: PodView, ctx: _Context) -> PodFailure | None:
    failures = _failures(pod, ctx)
    if not failures or pod.phase == "Succeeded":
        return None
    findings = tuple(failures + _explanations(pod, ctx))
    cause = _most_specific(findings)
    assert cause is not None
    onset = min((f.at for f in failures if f.at is not None), default=None)
    return PodFailure(pod, onset, cause, findings)


def _within(at: datetime | None, limit: datetime | None) -> bool:
    return at is None or limit is None or at <= limit + CLOCK_SKEW


def _first(failures: Sequence[PodFailure]) -> PodFailure:
    """Earliest onset; close calls (clock skew) go to the most specific cause."""
    earliest = min(failures, key=PodFailure.order)
    close = [f for f in failures if f.onset is None or _within(f.onset, earliest.onset)]
    if earliest.onset is not None:
        close = [f for f in close if f.onset is not None]
    return min(close, key=lambda f: (_RANK[f.failure_class], f.order()))


def _root_cause(first: PodFailure, pods: Sequence[PodView], ctx: _Context) -> PodFailure:
    """A network-looking or unexplained first failure yields to earlier hardware evidence."""
    if first.failure_class not in _SECONDARY:
        return first
    for pod in sorted(pods, key=lambda p: (p.node_rank is None, p.node_rank or 0)):
        found = [f for f in _explanations(pod, ctx) if f.failure_class in _ROOT_CAUSES]
        found = [f for f in found if _within(f.at, first.onset)]
        if cause := _most_specific(found):
            return PodFailure(pod, cause.at or first.onset, cause, tuple(found))
    return first


def _kueue_preemption(events: Sequence[EventView]) -> EventView | None:
    """Kueue evicts a preempted workload (Workload events, message 'Preempted to accommodate')."""
    found = [
        e for e in events
        if "Preempted to accommodate" in e.message
        or (e.kind == "Workload" and e.reason in ("Preempted", "EvictedDueToPreempted"))
    ]  # fmt: skip
    return min(found, key=lambda e: e.at or _FAR_FUTURE, default=None)


def _first_failed(failure: PodFailure) -> FirstFailedRank:
    cause, pod = failure.cause, failure.pod
    term = next((f for f in failure.findings if f.exit_code is not None), None)
    exit_from = cause if cause.exit_code is not None else term
    rank = next((f.rank for f in failure.findings if f.rank is not None), None)
    return FirstFailedRank(
        pod=pod.name,
        rank=rank if rank is not None else pod.node_rank,
        node_rank=pod.node_rank,
        node=pod.node,
        container=cause.container or (exit_from.container if exit_from else None),
        exit_code=exit_from.exit_code if exit_from else None,
        finished_at=failure.onset,
    )


def _quarantine(
    cls: FailureClass, failures: Sequence[PodFailure], root: PodFailure, ctx: _Context
) -> tuple[str, ...]:
    """Nodes with hardware or lost-node evidence; never for a user-category failure."""
    if cls.category is not FailureCategory.INFRASTRUCTURE:
        return ()
    findings = [f for pf in (*failures, root) for f in pf.findings]
    named = {f.quarantine for f in findings if f.quarantine}
    if ctx.nodes is not None:
        named &= set(ctx.nodes)
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


def classify_failure(
    pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]] | None,
    events: Sequence[Mapping[str, Any]],
    now: datetime,
    *,
    node_health: NodeHealth | None = None,
) -> Classification | None:
    """Why this attempt failed, or None while no pod has failed.

    `pods` are the attempt's pods (deleted ones as last seen, with deletionTimestamp);
    `nodes` the nodes they ran on, or None when unknown (then a missing node proves
    nothing); `events` those about the pods, their nodes, the JobSet and its Kueue Workload.
    """
    ctx = _Context(
        node_health or NodeHealth(),
        None if nodes is None else {v.name: v for v in map(read_node, nodes)},
        [read_event(e) for e in events],
        now,
    )
    views = [read_pod(p) for p in pods]
    failures = [f for pod in views if (f := _pod_failure(pod, ctx))]
    kueue = _kueue_preemption(ctx.events)
    if not failures and kueue is None:
        return None
    first = _first(failures) if failures else None
    if kueue is not None and (first is None or _within(kueue.at, first.onset)):
        return _preempted_by_kueue(kueue, first, failures)
    assert first is not None
    root = _root_cause(first, views, ctx)
    cls = root.failure_class
    extra = (
        [] if root is first else [f"root cause before the first failure ({first.cause.evidence})"]
    )
    return Classification(
        cls,
        _first_failed(root),
        _quarantine(cls, failures, root, ctx),
        _evidence(root, failures, extra),
    )


def _preempted_by_kueue(
    event: EventView, first: PodFailure | None, failures: Sequence[PodFailure]
) -> Classification:
    line = f"Kueue evicted the workload at {_iso(event.at)}: {event.reason}: {event.message}"
    others = [f"then: {f.cause.evidence}" for f in sorted(failures, key=PodFailure.order)[:8]]
    return Classification(C.PREEMPTED, _first_failed(first) if first else None, (), (line, *others))
