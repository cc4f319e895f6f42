"""Tearing the old world down: every JobSet and pod of earlier attempts is deleted and
waited for before the next attempt starts (no orphan rank may keep writing)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from rtj_operator.api import keys
from rtj_operator.api.reasons import ConditionType, Reason
from rtj_operator.policy.observed import parse_time
from rtj_operator.reconcile.actions import DeleteJobSet, DeletePod
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_operator.reconcile.liveness import fenced_nodes
from rtj_operator.reconcile.world import JobSetView, Json, Snapshot, attempt_of, get_in, pod_name

CONVERGE_POLL_SECONDS = 5.0


DELETE_RESEND = timedelta(seconds=5)
"""The plan that records a failure deletes the attempt's JobSet and pods; for this long after
it (the record's `endedAt`) they are not deleted again while the watch cache has not caught
up. A delete that failed is sent again after it."""


def _on_deleted_nodes(snap: Snapshot) -> set[str]:
    """Pods bound to a node seen deleted, or silent long enough to be fenced (a node the
    cache merely lacks does not count: force-deleting a pod a live kubelet still runs would
    free its GPUs too early)."""
    gone = {n for n in snap.deleted_nodes if n not in snap.nodes} | fenced_nodes(snap)
    return {pod_name(p) for p in snap.pods if get_in(p, "spec", "nodeName") in gone}


def _queued_pod_deletes(b: PlanBuilder) -> set[str]:
    return {a.name for a in (*b.before, *b.after) if isinstance(a, DeletePod)}


def delete_orphans(b: PlanBuilder, pods: Iterable[Json], views: Sequence[JobSetView]) -> None:
    """Pods whose JobSet is gone (orphaned by a non-cascading delete) are deleted directly."""
    alive = {v.name for v in views}
    queued = _queued_pod_deletes(b)
    for pod in pods:
        owner = get_in(pod, "metadata", "labels", keys.JOBSET_NAME_LABEL)
        deleting = get_in(pod, "metadata", "deletionTimestamp") is not None
        if not deleting and owner not in alive and pod_name(pod) not in queued:
            _delete(b, pod, None)


HANG_TEARDOWN_GRACE = 5
"""Grace period for the pods of a hung attempt: the culprit cannot save, and the ranks
waiting for it in a collective cannot make a consistent emergency save without it."""


def delete_pods(
    b: PlanBuilder,
    pods: Iterable[Json],
    spare: Iterable[str] = (),
    *,
    grace_seconds: int | None = None,
) -> None:
    """Delete these pods directly: those not being deleted yet with their own grace period,
    those on a node that no longer exists by force (grace 0) unless already forced: no
    kubelet will ever confirm their end, and the machine is gone (what the pod garbage
    collector does too, but only after its 40 s quarantine and on its own period, which
    would hold the restart). `spare`: pods not to delete again (a delete just sent);
    `grace_seconds`: instead of the pods' own."""
    on_gone_nodes = _on_deleted_nodes(b.snap)
    skip = _queued_pod_deletes(b) | set(spare)
    for pod in pods:
        name = pod_name(pod)
        if name in skip:
            continue
        if name in on_gone_nodes:
            if get_in(pod, "metadata", "deletionGracePeriodSeconds") != 0:
                _delete(b, pod, 0)
        elif get_in(pod, "metadata", "deletionTimestamp") is None:
            _delete(b, pod, grace_seconds)


def _delete(b: PlanBuilder, pod: Json, grace_seconds: int | None) -> None:
    """Delete the pod unless the API server already accepted this delete of it (the watch
    cache has not shown it yet: at 1,250 pods it lags by tens of seconds, and each round of
    sending the same deletes again cost thousands of requests)."""
    name, uid = pod_name(pod), str(get_in(pod, "metadata", "uid") or "")
    accepted = b.snap.accepted_deletes.get(name)
    if accepted is None or not accepted.covers(uid, grace_seconds):
        b.after.append(DeletePod(name, grace_seconds=grace_seconds, uid=uid))


def _teardown_sent(b: PlanBuilder) -> datetime | None:
    """When the plan that recorded the current attempt's failure deleted its JobSet and
    pods, if less than DELETE_RESEND ago (None otherwise): the watch cache may not show
    those deletions yet, and sending them again would only cost requests."""
    record = b.status.current
    if record is None or record.failure_class is None or record.ended_at is None:
        return None
    since = b.now - record.ended_at  # negative: another replica's clock wrote ended_at
    if record.attempt != b.status.attempt or not timedelta(0) <= since < DELETE_RESEND:
        return None
    return record.ended_at


STUCK_TERMINATING = timedelta(seconds=60)
"""A pod still there this long after its deletion deadline (deletionTimestamp: the request
time plus its grace period) is reported stuck."""


def _stuck_terminating(b: PlanBuilder) -> list[str]:
    out = []
    for pod in b.snap.pods:
        deadline = parse_time(get_in(pod, "metadata", "deletionTimestamp"))
        if deadline is not None and b.now - deadline >= STUCK_TERMINATING:
            node = get_in(pod, "spec", "nodeName") or "no node"
            out.append(f"{pod_name(pod)} on {node}")
    return sorted(out)


def converge(b: PlanBuilder, views: Sequence[JobSetView]) -> bool:
    """Before attempt n+1: delete every JobSet and pod of this job; True while any remains.

    The failure's own plan already deleted attempt n's JobSet (background propagation) and
    its pods; for DELETE_RESEND after it those are not deleted again (a delete that got lost
    is sent again then). Nothing starts while the cache shows any JobSet or pod of the job:
    a pod that appears late (an old Job that had not failed yet) is deleted here too."""
    n = b.status.attempt
    sent = _teardown_sent(b)
    spared = False
    for v in views:
        if v.deleting:
            continue
        if sent is not None and v.attempt == n:
            spared = True
            continue
        b.after.append(DeleteJobSet(v.name))
    spare = []
    if sent is not None:
        for pod in b.snap.pods:
            created = parse_time(get_in(pod, "metadata", "creationTimestamp"))
            if attempt_of(pod) == n and (created is None or created <= sent):
                spare.append(pod_name(pod))
    spared = spared or bool(spare)
    delete_pods(b, b.snap.pods, spare)
    if not views and not b.snap.pods:
        return False
    message = (
        f"converging before attempt {n + 1}: waiting for the JobSets and pods of earlier "
        "attempts to go"
    )  # no counts: one status patch while converging, not one per pod gone
    reason = Reason.WAITING_FOR_OLD_WORLD
    stuck = _stuck_terminating(b)
    if stuck:
        reason = Reason.PODS_STUCK_TERMINATING
        message = (
            f"converging before attempt {n + 1}: pod(s) of earlier attempts still "
            f"Terminating over {int(STUCK_TERMINATING.total_seconds())} s past their grace "
            f"period, their kubelet has not confirmed: {', '.join(stuck[:5])}"
            + (f" and {len(stuck) - 5} more" if len(stuck) > 5 else "")
            + "; the next attempt waits (a silent node's pods are force-deleted once it is "
            "fenced; on a live node its kubelet or an administrator must end them)"
        )
        was = next(
            (c for c in b.status.conditions if c.type == ConditionType.RESTARTING.value), None
        )
        if was is None or was.reason != reason.value:
            b.event(True, reason, message)
    b.condition(ConditionType.RESTARTING, True, reason, message)
    b.notes.append(
        f"converging before attempt {n + 1}: {len(views)} JobSet(s) and {len(b.snap.pods)} "
        "pod(s) of earlier attempts remain"
    )
    b.requeue_in(CONVERGE_POLL_SECONDS)
    if spared and sent is not None:
        b.requeue_in((sent + DELETE_RESEND - b.now).total_seconds())
    return True
