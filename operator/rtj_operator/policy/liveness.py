"""Is a node alive? Judged from its Lease and its Ready condition, before the node
lifecycle controller says so, and without overreacting. Pure.

Three things the control plane's own view gets wrong for a training job:

- **Silent loss is seen late.** A node whose kernel panicked keeps its pods "Running" in
  the API; the node controller marks it Unknown only `--node-monitor-grace-period` (40-50 s)
  after its last heartbeat. The kubelet renews its Lease in `kube-node-lease` every quarter
  of the lease duration (10 s of 40 s; KWOK: 5 s of 20 s). A lease not renewed for
  `SILENT_RENEWALS` renewal intervals (at least `SILENT_FLOOR`) means the kubelet is gone:
  the node is *silent*, and is judged lost at once (20 s after its last renewal, so 10-20 s
  after the machine died).
- **Two signals agree sooner.** When the job's pods on a node all stopped answering the
  operator's progress poll (they answered before in this attempt) and the node's Lease is
  *overdue* (its next renewal late by `OVERDUE_SLACK`), two independent channels say the
  machine is gone: the node is silent from the moment both hold (the Lease overdue 11 s after
  its last renewal, so 1-11 s after the machine died, instead of 10-20 s). Either alone is
  not enough: a restarting kubelet misses renewals while its pods answer, and a pod's
  progress server can stall while its kubelet renews.
- **A flicker is not a loss.** Ready=False or Unknown for less than `FLICKER_WINDOW`
  while the Lease is still renewed (a slow PLEG, a restarting kubelet) is ignored: no
  restart, no taint. After the window it counts, as before.
- **A partition is not a fleet of dead nodes.** When most nodes with a Lease are overdue
  at once, the operator lost contact with the kubelets (or the API server is struggling), not
  the machines: judge nothing (hold), like the node lifecycle controller's own "full
  disruption" mode, until contact returns.

`classifier_view` turns this judgement into the node objects the classifier reads: a
silent node gets a Ready=Unknown condition (reason `NodeLeaseExpired`, its last heartbeat
the lease's renewTime, declared when it went silent), a flickering node reads Ready=True.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rtj_operator.policy.observed import parse_time

SILENT_RENEWALS = 2.0
"""Renewal intervals without a renewal after which a node is silent (20 s for a kubelet:
its last renewal was 10-20 s after the last one before, so a partition has shown itself in
the other nodes' overdue renewals by then, see `partitioned`)."""
OVERDUE_SLACK = timedelta(seconds=1)
"""A renewal is overdue one interval after the last one, plus this (jitter, API latency)."""
SILENT_FLOOR = timedelta(seconds=5)
FLICKER_WINDOW = timedelta(seconds=10)
"""A Ready condition False/Unknown for less than this (lease still renewed) is a flicker."""
PARTITION_FRACTION = 0.5
PARTITION_MIN_NODES = 3
"""Silent nodes are a partition when at least this many and this fraction of all nodes
with a Lease are silent at once."""
LEASE_EXPIRED_REASON = "NodeLeaseExpired"
CONTROL_PLANE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
"""What the node lifecycle controller adds while Ready is False or Unknown."""


@dataclass(frozen=True)
class NodeLease:
    """What a node's Lease says: when the kubelet last renewed it, for how long."""

    renewed_at: datetime
    duration_seconds: int = 40

    @property
    def silent_after(self) -> timedelta:
        return max(self.interval * SILENT_RENEWALS, SILENT_FLOOR)

    @property
    def interval(self) -> timedelta:
        return timedelta(seconds=self.duration_seconds / 4)

    @property
    def overdue_at(self) -> datetime:
        """When the next renewal is late: one interval after the last one, plus slack."""
        return self.renewed_at + self.interval + OVERDUE_SLACK

    def overdue(self, now: datetime) -> bool:
        """Whether the next renewal should have come by now (one interval, plus slack)."""
        return now > self.overdue_at

    def silent_since(self, now: datetime) -> datetime | None:
        """When the node went silent (its last renewal plus the allowance); None: alive."""
        since = self.renewed_at + self.silent_after
        return since if now >= since else None


class Liveness(enum.Enum):
    ALIVE = "alive"
    FLICKER = "flicker"
    """Ready is not True, but only since less than FLICKER_WINDOW and the lease is renewed;
    or Ready is Unknown (no heartbeats, the controller said) from before the Lease's latest
    renewal: the kubelet is back after a partition and has not posted its status yet."""
    SILENT = "silent"
    """The lease is not renewed: judged lost before the control plane says so."""
    LOST = "lost"
    """The control plane says so (Ready not True beyond the flicker window)."""


@dataclass(frozen=True)
class NodeJudgement:
    liveness: Liveness
    since: datetime | None = None
    recheck_at: datetime | None = None
    """When the judgement may change without any new event (a flicker's window ending, a
    lease's silence allowance running out)."""


def _ready(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond
    return None


def judge_node(
    node: Mapping[str, Any],
    lease: NodeLease | None,
    now: datetime,
    pods_unreachable_since: datetime | None = None,
) -> NodeJudgement:
    """One node's liveness from its object and its Lease (None: no lease seen), and when
    the job's pods on it all stopped answering the progress poll (None: some answer, or
    none was ever heard)."""
    silent = silent_since(lease, now, pods_unreachable_since)
    if silent is not None:
        return NodeJudgement(Liveness.SILENT, silent)
    ready = _ready(node)
    down = ready is not None and ready.get("status") != "True"
    if not down:
        recheck = None
        if lease is not None:
            early = pods_unreachable_since is not None and now <= lease.overdue_at
            # both signals may agree at the overdue instant: look again then
            recheck = lease.overdue_at if early else lease.renewed_at + lease.silent_after
        return NodeJudgement(Liveness.ALIVE, recheck_at=recheck)
    since = parse_time(ready.get("lastTransitionTime")) if ready is not None else None
    if since is not None and lease is not None and now - since < FLICKER_WINDOW:
        return NodeJudgement(Liveness.FLICKER, since, recheck_at=since + FLICKER_WINDOW)
    if (
        ready is not None and ready.get("status") == "Unknown"
        and since is not None and lease is not None and lease.renewed_at > since
    ):  # fmt: skip
        # Unknown is the node lifecycle controller's word for missed heartbeats; a renewal
        # since says the kubelet is back (a partition ended) and its own status post is on
        # its way: no verdict while it keeps renewing
        return NodeJudgement(Liveness.FLICKER, since, recheck_at=lease.overdue_at)
    return NodeJudgement(Liveness.LOST, since)


def silent_since(
    lease: NodeLease | None, now: datetime, pods_unreachable_since: datetime | None = None
) -> datetime | None:
    """When the node went silent (None: it has not): its Lease unrenewed past the allowance,
    or, sooner, overdue while every pod of the job on it has stopped answering since about
    its last renewal. A machine that dies stops both at once; pods quiet since well before
    the kubelet last renewed (a crashed progress server, then a kubelet restart) are two
    unrelated troubles, judged by the Lease alone."""
    if lease is None:
        return None
    found = [t for t in (lease.silent_since(now),) if t is not None]
    together = (
        pods_unreachable_since is not None
        and pods_unreachable_since >= lease.renewed_at - OVERDUE_SLACK
    )
    if together and pods_unreachable_since is not None and lease.overdue(now):
        found.append(max(lease.overdue_at, pods_unreachable_since))
    return min(found) if found else None


def partitioned(overdue: int, with_lease: int) -> bool:
    """Whether this many nodes with an overdue renewal, of all nodes with a Lease, look like
    a partition. Overdue, not silent: when contact is lost at one instant, the nodes' last
    renewals are spread over one interval, so they turn silent one by one over an interval;
    by the time the first turns silent (two intervals after its last renewal), nearly all
    the others are already overdue, while a single dead node leaves the others on time."""
    return overdue >= PARTITION_MIN_NODES and overdue >= PARTITION_FRACTION * with_lease


def classifier_view(
    node: Mapping[str, Any], judgement: NodeJudgement, lease: NodeLease | None
) -> Mapping[str, Any]:
    """The node as the classifier should read it. The input is never changed: what differs
    is a new object sharing the rest (a node read as it is, the common case at 1,000+
    nodes, is the input itself, not a copy)."""
    if judgement.liveness is Liveness.LOST:
        return node
    if judgement.liveness is Liveness.ALIVE:
        if lease is not None:  # Ready and renewing: a not-ready taint is the past's, lagging
            return _without_control_plane_taints(node)
        return node
    out = dict(node)
    conditions = [
        c
        for c in (out.get("status") or {}).get("conditions") or []
        if not (isinstance(c, Mapping) and c.get("type") == "Ready")
    ]
    if judgement.liveness is Liveness.FLICKER:
        ready: dict[str, Any] = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
        # the node lifecycle controller's not-ready/unreachable taints follow the flicker
        # within a second: they are the same flicker, not more evidence
        out = dict(_without_control_plane_taints(out))
    else:
        renewed = lease.renewed_at if lease is not None else judgement.since
        stamp = (renewed or judgement.since or datetime.min).isoformat().replace("+00:00", "Z")
        declared = judgement.since.isoformat().replace("+00:00", "Z") if judgement.since else stamp
        early = (
            lease is not None
            and judgement.since is not None
            and judgement.since < lease.renewed_at + lease.silent_after
        )
        also = ", and none of the job's pods on it answers the progress poll" if early else ""
        ready = {
            "type": "Ready",
            "status": "Unknown",
            "reason": LEASE_EXPIRED_REASON,
            "message": f"the kubelet has not renewed its node Lease since {stamp}{also} "
            "(judged lost by the rtj operator before the node lifecycle controller)",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": declared,
        }
    out["status"] = {**(out.get("status") or {}), "conditions": [*conditions, ready]}
    return out


def _without_control_plane_taints(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """The node less the node lifecycle controller's not-ready/unreachable taints (itself
    when it has none)."""
    spec = node.get("spec") or {}
    taints = spec.get("taints") or []
    kept = [t for t in taints
            if not (isinstance(t, Mapping) and t.get("key") in CONTROL_PLANE_TAINTS)]  # fmt: skip
    if len(kept) == len(taints):
        return node
    return {**node, "spec": {**spec, "taints": kept}}


def lease_of(body: Mapping[str, Any]) -> tuple[str, NodeLease] | None:
    """A coordination.k8s.io/v1 Lease in kube-node-lease as (node name, what it says)."""
    name = (body.get("metadata") or {}).get("name")
    spec = body.get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    if not isinstance(name, str) or renewed is None:
        return None
    duration = spec.get("leaseDurationSeconds")
    seconds = int(duration) if isinstance(duration, int) and duration > 0 else 40
    return name, NodeLease(renewed, seconds)
