"""Node liveness in the plan: the nodes the classifier reads (silent nodes judged lost
before the control plane says so, Ready flickers ignored), the hold during a partition,
and which nodes are fenced (their pods force-deleted: no kubelet will ever confirm them)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from rtj_operator.api.reasons import ConditionType, FailureClass, Reason
from rtj_operator.policy.liveness import Liveness, classifier_view, judge_node
from rtj_operator.reconcile.builder import PlanBuilder, condition_true
from rtj_operator.reconcile.world import Snapshot, attempt_of, get_in, pod_name

FENCE_AFTER = timedelta(seconds=10)
"""A node silent this long has its pods force-deleted when the old world is torn down: its
kubelet is gone, so nothing would ever confirm their end (a zombie rank on a partitioned
node is fenced by the checkpoint protocol's attempt ownership, see docs/DESIGN.md)."""


def judged_nodes(b: PlanBuilder) -> dict[str, Mapping[str, Any]]:
    """The job's nodes as the classifier should read them; schedules the re-checks a
    judgement needs (a flicker's window ending, a lease's silence allowance running out)."""
    views: dict[str, Mapping[str, Any]] = {}
    quiet = pods_quiet_by_node(b.snap)
    for name, node in b.snap.nodes.items():
        lease = b.snap.node_leases.get(name)
        judgement = judge_node(node, lease, b.now, quiet.get(name))
        if judgement.recheck_at is not None:
            b.requeue_in((judgement.recheck_at - b.now).total_seconds() + 0.2)
        if judgement.liveness is Liveness.FLICKER:
            b.notes.append(f"node {name}: Ready not True since {judgement.since}: a flicker so far")
        views[name] = classifier_view(node, judgement, lease)
    return views


def pods_quiet_by_node(snap: Snapshot) -> dict[str, datetime | None]:
    """Per node, when the current attempt's running pods on it had all stopped answering
    the progress poll (each answered before in this attempt); None or absent: one still
    answers, or the poller has nothing to say (no pod there, progress off, another attempt's
    readings). One pass over the pods: a plan reads it for every node of the job (per node,
    it was a pass each: 1.5 M pod reads a plan at 1,250 pods, ~10 s of the operator's CPU)."""
    ranks = snap.ranks
    attempt = snap.rtj.status.attempt
    if ranks is None or ranks.attempt != attempt:
        return {}
    on_node: dict[str, list[str]] = {}
    for p in snap.pods:
        node = get_in(p, "spec", "nodeName")
        if (isinstance(node, str) and attempt_of(p) == attempt
                and get_in(p, "status", "phase") == "Running"):  # fmt: skip
            on_node.setdefault(node, []).append(pod_name(p))
    out: dict[str, datetime | None] = {}
    for node, names in on_node.items():
        quiet = [ranks.quiet_since.get(name) for name in names]
        stamps = [t for t in quiet if t is not None]
        out[node] = (
            datetime.fromtimestamp(max(stamps), timezone.utc) if len(stamps) == len(quiet) else None
        )
    return out


def fenced_nodes(snap: Snapshot) -> frozenset[str]:
    """Nodes of this job silent for at least FENCE_AFTER (never during a partition): by
    their Lease alone, or since an attempt recorded the node lost while its Lease has not
    been renewed again (the poll that corroborated it stops with the attempt)."""
    if snap.partition:
        return frozenset()
    out = set()
    quiet = pods_quiet_by_node(snap)
    for name, node in snap.nodes.items():
        lease = snap.node_leases.get(name)
        judgement = judge_node(node, lease, snap.now, quiet.get(name))
        starts = []  # the earlier of the two counts: each alone fences
        if judgement.liveness is Liveness.SILENT and judgement.since is not None:
            starts.append(judgement.since)
        recorded = _recorded_lost_at(snap, name)
        if (recorded is not None and lease is not None and lease.renewed_at < recorded
                and lease.overdue(snap.now)):  # fmt: skip
            starts.append(recorded)
        if starts and snap.now - min(starts) >= FENCE_AFTER:
            out.add(name)
    return frozenset(out)


def _recorded_lost_at(snap: Snapshot, node: str) -> datetime | None:
    """When this job recorded `node` lost (the newest such record): an attempt ended by it,
    or a restart in place that replaced the node's pod (its `detectedAt`: the verdict)."""
    found = None
    for record in snap.rtj.status.attempts:
        first = record.first_failed
        named = (first is not None and first.node == node) or node in record.quarantined_nodes
        if record.failure_class is FailureClass.NODE_LOST and named and record.ended_at:
            found = record.ended_at
        for entry in record.in_place_restarts:
            on_it = any(r.endswith(f" on {node}") for r in entry.replaced)
            if entry.failure_class is FailureClass.NODE_LOST and on_it:
                found = max(found, entry.detected_at) if found else entry.detected_at
    return found


def hold_for_partition(b: PlanBuilder) -> bool:
    """During a partition (most nodes silent at once) judge nothing: no restart, no taint;
    a condition says why. True while holding."""
    held = condition_true(b.status, ConditionType.NODES_UNREACHABLE)
    if not b.snap.partition:
        if held:
            b.condition(
                ConditionType.NODES_UNREACHABLE,
                False,
                Reason.CONTACT_RESTORED,
                "kubelets renew their Leases again: failures are judged as usual",
            )
            b.event(False, Reason.CONTACT_RESTORED, "contact with the nodes is back")
        return False
    message = (
        "most nodes stopped renewing their Leases at once: contact with the kubelets is lost "
        "(a partition or an API server in trouble), not the machines; holding: no restart, "
        "no taint until contact returns"
    )
    if not held:
        b.event(True, Reason.NODES_UNREACHABLE, message)
    b.condition(ConditionType.NODES_UNREACHABLE, True, Reason.NODES_UNREACHABLE, message)
    b.notes.append(message)
    b.requeue_in(2.0)
    return True
