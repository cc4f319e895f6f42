"""One piece of evidence about one pod, where it came from, and how the pieces rank. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from rtj_operator.api.reasons import FailureClass
from rtj_operator.policy.observed import PodView
from rtj_shim.wire.suspect_verdict import SuspectVerdict

C = FailureClass

PRIORITY = (
    C.GPU_FAULT,
    C.NODE_LOST,
    C.PREEMPTED,
    C.PODS_READY_TIMEOUT,
    C.EVICTED,
    C.PREFLIGHT_FAILED,
    C.CHECKPOINT_CORRUPT,
    C.CONFIG_ERROR,
    C.IMAGE_PULL_FAILED,
    C.OUT_OF_MEMORY,
    C.SILENT_DATA_CORRUPTION,
    C.NETWORK_FAULT,
    C.USER_ERROR,
    C.UNKNOWN,
)
"""Among one pod's findings, the most specific wins: hardware evidence beats the exit code
it caused, an eviction beats the SIGTERM it sent."""
RANK = {cls: i for i, cls in enumerate(PRIORITY)}
FAR_FUTURE = datetime.max.replace(tzinfo=timezone.utc)
CLOCK_SKEW = timedelta(seconds=5)
"""kubelet timestamps have second resolution and node clocks drift: closer calls are ties."""

# Where a finding comes from: what it can prove (only node-level evidence quarantines).
KUBELET = "kubelet"  # pod status written by the node's kubelet or container runtime
CONTROL_PLANE = "control-plane"  # node lifecycle, taint manager, PodGC, scheduler
NODE_AGENT = "node-agent"  # NVSentinel, EKS node monitoring agent, NPD, device plugin
TRAINER = "trainer"  # the container's own words: a hint, never proof of hardware
PLATFORM = "platform-preflight"  # the platform's preflight (its image, its command, its verdict)
KUEUE = "kueue"


@dataclass(frozen=True)
class Finding:
    """One piece of evidence and the class it points to (None: a note only)."""

    failure_class: FailureClass | None
    evidence: str
    at: datetime | None = None
    container: str | None = None
    exit_code: int | None = None
    quarantine: str | None = None
    """The node this evidence proves bad (only node-level evidence names one)."""
    rank: int | None = None
    source: str = KUBELET
    signal: str = ""
    """The field or object that carried it, e.g. `node condition SysLogsXIDError`."""
    suspect: bool = False
    """Hardware words with no node-level evidence: restart, do not quarantine."""
    verdict: SuspectVerdict | None = None
    """The trainers' verdict on a suspect state (silent data corruption), as its message
    carried it: the ranks and pods it suspects (the tenant's word: names no node)."""


def most_specific(findings: Iterable[Finding]) -> Finding | None:
    """The finding that decides: the most specific class; within a class, evidence over a
    suspect (a node agent's report over the trainer's words), then the earliest."""
    ranked = [f for f in findings if f.failure_class is not None]
    return min(
        ranked,
        key=lambda f: (RANK[f.failure_class or C.UNKNOWN], f.suspect, f.at or FAR_FUTURE),
        default=None,
    )


def iso(at: datetime | None) -> str | None:
    return at.isoformat().replace("+00:00", "Z") if at else None


def who(pod: PodView) -> str:
    rank = f" (node rank {pod.node_rank})" if pod.node_rank is not None else ""
    return f"pod {pod.name}{rank} on node {pod.node or '?'}"


def within(at: datetime | None, limit: datetime | None, slack: timedelta = CLOCK_SKEW) -> bool:
    return at is None or limit is None or at <= limit + slack
