"""Watching the current attempt: classify a failure from its pods, nodes and events, hold a
user-category verdict for the settle window, or follow its progress."""

from __future__ import annotations

from datetime import timedelta

from rtj_operator.api.reasons import FailureCategory, FailureClass
from rtj_operator.policy import spares
from rtj_operator.policy.classify import Classification, classify_failure, jobset_failure
from rtj_operator.policy.render import jobset_name
from rtj_operator.reconcile import elastic, in_place
from rtj_operator.reconcile import ledger as recovery_ledger
from rtj_operator.reconcile.actions import DeleteJobSet
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_operator.reconcile.checkpoints import read_init_results, refresh_checkpoint
from rtj_operator.reconcile.converge import delete_orphans
from rtj_operator.reconcile.failure import on_failure, within_quarantine_limit
from rtj_operator.reconcile.healthy_attempt import finish_with_idle_pods, follow_admission, succeed
from rtj_operator.reconcile.intervals import choose_intervals
from rtj_operator.reconcile.liveness import hold_for_partition, judged_nodes
from rtj_operator.reconcile.ranks import find_hang, note_progress
from rtj_operator.reconcile.supervised_exits import supervisor_failure
from rtj_operator.reconcile.world import (
    attempt_of,
    owned_jobset_uids,
    pod_name,
    preflight_image,
    read_jobset,
    trusted_pod,
)

JOBSET_APPEAR_GRACE = timedelta(seconds=15)
"""A JobSet just created may not be in the watch cache yet: that is not a lost JobSet."""


JOBSET_FAILED_GRACE = timedelta(seconds=5)
"""A failed JobSet whose failed pod has not been seen yet: wait this long for the pod."""


USER_FAILURE_SETTLE = timedelta(seconds=5)
"""A failure whose root cause is user-category (UserError, OutOfMemory, ConfigError) is
recorded only this long after the first failed rank's termination (its `finishedAt`): a
GPU node agent may report the XID that explains a CUDA traceback a moment after the
traceback reaches the operator, and a user-category record fails the job for good.
Infrastructure, preemption and checkpoint classes are recorded at once."""

UNEXPLAINED_SETTLE = timedelta(seconds=2)
"""An Unknown failure (nothing its pods and nodes show says why: a bare SIGKILL, pods
deleted by another controller) is recorded only this long after its onset: the Events that
would explain it are written after the change the operator saw (Kueue records `Stopped` after
it suspends the JobSet whose pods then go; node-problem-detector posts `OOMKilling` as the
kubelet reports the kill), and reach the operator's Event watch a moment later. Caught by
`test_a_kueue_preemption_is_free_and_the_job_is_readmitted_when_quota_frees`: read from the
watch at once, one preemption in four was recorded Unknown."""


def plan_current_attempt(b: PlanBuilder) -> None:
    snap, status = b.snap, b.status
    n = status.attempt
    name = jobset_name(b.rtj.metadata.name, n)
    views = [read_jobset(js) for js in snap.jobsets]
    uid = b.rtj.metadata.uid
    current = next((v for v in views if v.name == name and v.owner_uid == uid), None)
    strays = [v for v in views if v.attempt is not None and v.attempt < n and v.name != name]
    for v in strays:
        if not v.deleting:
            b.after.append(DeleteJobSet(v.name))
    delete_orphans(b, [p for p in snap.pods if (attempt_of(p) or 0) < n], views)
    owned = owned_jobset_uids(snap)
    labelled = [p for p in snap.pods if attempt_of(p) == n]
    live = [p for p in labelled if trusted_pod(p, owned)]
    if len(live) < len(labelled):
        untrusted = sorted(pod_name(p) for p in labelled if not trusted_pod(p, owned))
        b.notes.append(
            f"ignored as evidence (not controlled by a Job of a JobSet this job owns): "
            f"{', '.join(untrusted[:5])}"
        )
    names = {pod_name(p) for p in labelled}
    gone = [
        p
        for p in snap.gone_pods
        if attempt_of(p) == n and pod_name(p) not in names and trusted_pod(p, owned)
    ]
    if replaced := in_place.replaced_pods(status):
        # pods replaced by a restart in place are no evidence any more: their node is
        # quarantined and their Job created them again; the others restarted in place
        live = [p for p in live if pod_name(p) not in replaced]
        gone = [p for p in gone if pod_name(p) not in replaced]
    # the world: the pods that serve a rank, each read under it; idle warm spares (and the
    # pods whose rank a spare took) are no evidence of the world's failure
    assigned, world = status.spare_ranks, status.world_size  # world: spec.elastic's size
    idle = spares.idle(live, assigned, world)
    live = [spares.as_serving(p, assigned) for p in spares.serving(live, assigned, world)]
    gone = [spares.as_serving(p, assigned) for p in spares.serving(gone, assigned, world)]
    read_init_results(b, live)
    refresh_checkpoint(b)
    choose_intervals(b)

    if hold_for_partition(b):
        return
    nodes = list(judged_nodes(b).values())
    found = classify_failure(
        [*live, *gone],
        nodes,
        list(snap.events or ()),
        b.now,
        node_health=b.rtj.spec.node_health,
        read=snap.read_once,
        preflight_image=preflight_image(snap),
    )
    if found is not None and snap.events is None:
        b.needs_events = True  # classify again with the events (eviction, preemption, node)
        return
    if found is not None and _settling(b, found, UNEXPLAINED_SETTLE):
        return
    if found is None and in_place.follow(b, live):
        return
    if found is None:
        record = status.current
        if current is None or current.deleting:
            started = record.started_at if record is not None else None
            if current is None and started is not None and b.now - started < JOBSET_APPEAR_GRACE:
                b.requeue_in(1.0)
                return
            what = "no longer exists" if current is None else "is being deleted"
            found = jobset_failure(f"JobSet {name} of attempt {n} {what} (not by this operator)")
        elif current.completed:
            succeed(b, n, name)
            return
        elif current.failed:
            failed_at = current.failed_at or b.now
            if b.now - failed_at < JOBSET_FAILED_GRACE:
                b.requeue_in((JOBSET_FAILED_GRACE - (b.now - failed_at)).total_seconds())
                return
            found = jobset_failure(f"JobSet {name} failed: {current.failure_message}")
        elif finish_with_idle_pods(b, n, name, live):
            return
        else:
            follow_admission(b, current, live)
            found = supervisor_failure(b, live, nodes) or find_hang(b, live)
            if found is None and elastic.grow(b, live, idle):
                return  # a shrunk world's missing ranks have pods again (spec.elastic)
            if found is None:
                note_progress(b)
                recovery_ledger.settle(b)
                return
    if _settling(b, found):
        return
    found = within_quarantine_limit(b, found)
    if b.status.in_place is None and in_place.begin(b, found, live, idle, gone):
        return
    on_failure(b, found, current)


def _settling(b: PlanBuilder, found: Classification, unexplained: timedelta | None = None) -> bool:
    """A user-category failure is final only USER_FAILURE_SETTLE after the first failed
    rank's termination, and, given `unexplained` (classified from pods, nodes and Events), an
    Unknown one that long after: until then nothing is recorded and the job is classified
    again at the window's end (or on any change before it: a node label or condition, a pod,
    a kept Event), with the events read afresh. Other categories are recorded at once."""
    failed_at = found.failed_at
    if found.category is FailureCategory.USER:
        window, why = USER_FAILURE_SETTLE, "node agents may report late"
    elif unexplained is not None and found.failure_class is FailureClass.UNKNOWN:
        window, why = unexplained, "the Events that explain it may land late"
    else:
        return False
    if failed_at is None:
        return False
    settled = failed_at + window
    if b.now >= settled or failed_at - b.now > window:
        return False  # settled, or a kubelet clock so far ahead that waiting means nothing
    b.requeue_in((settled - b.now).total_seconds())
    b.notes.append(
        f"attempt {b.status.attempt}: {found.failure_class.value} on the first failed rank; "
        f"classifying again at {settled.isoformat()} (settle window, {why})"
    )
    return True
