"""One reconcile of one ResilientTrainingJob: observe -> plan (pure) -> apply (thin I/O).

`plan` is a pure function of a `Snapshot` (the job, every JobSet and pod labelled for it,
the nodes its pods ran on, the events about them, the latest checkpoint-store reading, the
LocalQueue lookup while Kueue has not admitted the attempt, and `now`). It calls the policy
functions (`classify_failure`, `decide`, `render_jobset`) and returns an ordered list of
actions with at most one status patch. `apply` executes them through `kube.Kube`, the only
module that talks to the API server.

Why this converges after a crash at any moment (the operator is level-triggered):

- Attempt n's JobSet is always named `<name>-a<n>`; creating it twice answers 409, and a
  JobSet for attempt `status.attempt + 1` that status does not record yet is *adopted*.
- A failure is recorded (status patch, phase Restarting, restart counts) *before* the old
  JobSet is deleted; the patch carries `metadata.resourceVersion`, so a decision taken on
  a stale read is refused by the API server (409) instead of counting a restart twice.
- In phase Restarting nothing new starts while any JobSet or pod of an earlier attempt
  remains. The plan that records the failure deletes the old JobSet (background
  propagation) and every old pod directly, in the same pass, rather than waiting for the
  garbage collector's cascade; later passes delete whatever is still not being deleted.
  No old Job recreates a pod: a rendered Job has `backoffLimit: 0` and the default pod
  replacement policy (a deleted pod counts as failed, so the Job fails), and a Job that
  Kueue suspended creates none; a pod that shows up anyway is deleted and waited for.
- Taints are idempotent (the same key/value/effect is a no-op), quarantine records keyed
  by node, so a repeated Quarantine decision re-applies nothing.

Attempt records: the failed attempt's record gets the class, first failed rank, evidence,
`detectionSeconds` (first failed termination -> classified record) and, once the next
attempt's JobSet exists, `recoverySeconds` (first failed termination -> next JobSet
created). The new attempt's record gets `resumedFromStep` and `lostSteps` (published steps
passed over: the newest verified step known before the restart minus the step resumed).

The package, by phase: `world` (the snapshot), `trim` (what the caches keep), `actions` and
`builder` (the plan), `admit` (the next attempt), `converge` (the old world's teardown),
`detect` (the current attempt), `failure` (recording and acting on a failure), `healthy_attempt`
(admission, running, success), `checkpoints` (verified steps, store readings, checkpoint
age), `quarantine` (taints), `orphan_claims` (claims of jobs gone without releasing them),
`liveness` (silent nodes, flickers, partitions), `ranks` (hangs, stragglers and the progress
summary, from the ranks' progress reports), `lifecycle` (suspend and resume,
activeDeadlineSeconds, ttlSecondsAfterFinished) and `deprecated` (warnings about deprecated
spec fields).
"""

from __future__ import annotations

from dataclasses import replace

from rtj_operator.api.reasons import Phase
from rtj_operator.policy.platform import effective_node_health
from rtj_operator.reconcile import lifecycle
from rtj_operator.reconcile.actions import (
    Action,
    CreateJobSet,
    CreateKeySecret,
    DeleteJob,
    DeleteJobSet,
    DeletePod,
    KubeAction,
    MetricRecord,
    PatchStatus,
    Plan,
    PostEvent,
    SetFinalizer,
    TaintNode,
    UntaintNode,
    merge_patch,
)
from rtj_operator.reconcile.admit import plan_next_attempt
from rtj_operator.reconcile.builder import PlanBuilder, condition_true, set_condition
from rtj_operator.reconcile.checkpoints import (
    STALE_FACTOR,
    STORE_FRESH,
    STORE_RETRY_MIN_SECONDS,
    STORE_RETRY_SECONDS,
)
from rtj_operator.reconcile.converge import CONVERGE_POLL_SECONDS, DELETE_RESEND
from rtj_operator.reconcile.deprecated import warn_deprecated
from rtj_operator.reconcile.detect import USER_FAILURE_SETTLE, plan_current_attempt
from rtj_operator.reconcile.failure import release_failed_job
from rtj_operator.reconcile.finalizer import release_deleted_job
from rtj_operator.reconcile.healthy_attempt import QUEUE_RECHECK
from rtj_operator.reconcile.in_place import restart_order
from rtj_operator.reconcile.pod_messages import PodMessages, pod_messages
from rtj_operator.reconcile.quarantine import (
    Claimant,
    NodeEdit,
    claim,
    ensure_quarantines,
    lift_expired_quarantines,
    release,
)
from rtj_operator.reconcile.ranks import (
    answers_sealed,
    poll_targets,
    progress_facts,
)
from rtj_operator.reconcile.round_news import PlannedRound, planned_round, round_has_news
from rtj_operator.reconcile.trim import plain, trim_event, trim_jobset, trim_node, trim_pod
from rtj_operator.reconcile.world import (
    AcceptedDelete,
    JobSetView,
    PollMessage,
    PollTarget,
    QueueReading,
    RankReadings,
    Rejection,
    Snapshot,
    StoreReading,
    attempt_of,
    pod_name,
    read_jobset,
    with_queue,
    with_store,
)

__all__ = [
    "CONVERGE_POLL_SECONDS",
    "DELETE_RESEND",
    "QUEUE_RECHECK",
    "STALE_FACTOR",
    "STORE_FRESH",
    "STORE_RETRY_MIN_SECONDS",
    "STORE_RETRY_SECONDS",
    "USER_FAILURE_SETTLE",
    "AcceptedDelete",
    "Action",
    "Claimant",
    "CreateJobSet",
    "CreateKeySecret",
    "DeleteJob",
    "DeleteJobSet",
    "DeletePod",
    "JobSetView",
    "KubeAction",
    "MetricRecord",
    "NodeEdit",
    "PatchStatus",
    "Plan",
    "PlannedRound",
    "PodMessages",
    "PollMessage",
    "PollTarget",
    "PostEvent",
    "QueueReading",
    "RankReadings",
    "Rejection",
    "SetFinalizer",
    "Snapshot",
    "StoreReading",
    "TaintNode",
    "UntaintNode",
    "answers_sealed",
    "attempt_of",
    "claim",
    "condition_true",
    "merge_patch",
    "plain",
    "plan",
    "planned_round",
    "pod_messages",
    "pod_name",
    "poll_targets",
    "progress_facts",
    "read_jobset",
    "release",
    "restart_order",
    "round_has_news",
    "set_condition",
    "trim_event",
    "trim_jobset",
    "trim_node",
    "trim_pod",
    "with_queue",
    "with_store",
]  # fmt: skip


def plan(snap: Snapshot) -> Plan:
    """What to do now for one job. Pure: the same snapshot always gives the same plan."""
    if snap.rtj.spec.managed_elsewhere:  # spec.managedBy: another controller's job
        return Plan((), None, False, (), f"managed by {snap.rtj.spec.managed_by}")
    deprecated = snap.rtj.spec.deprecations()  # as the user wrote it
    snap = _judged_by_platform_policy(snap)
    b = PlanBuilder(snap, snap.rtj.status)
    lift_expired_quarantines(b)
    if snap.rtj.metadata.deletion_timestamp is not None:
        release_deleted_job(b)  # nothing else: a job being deleted starts nothing
        return b.build()
    warn_deprecated(b, deprecated)
    held = lifecycle.hold(b)  # suspended, or failed by its deadline: nothing else runs
    status = b.status  # a resume has just made it Restarting: the next attempt follows now
    if held:
        pass
    elif status.phase.terminal:
        b.notes.append(f"job is {status.phase.value}")
        if status.phase is Phase.FAILED:
            release_failed_job(b)
    elif status.attempt == 0 or status.phase is Phase.RESTARTING:
        plan_next_attempt(b)
    else:
        plan_current_attempt(b)
    lifecycle.follow(b)  # the deadline's clock, the deletion after ttlSecondsAfterFinished
    ensure_quarantines(b)
    return b.build()


def _judged_by_platform_policy(snap: Snapshot) -> Snapshot:
    """The job as the plan sees it: its nodeHealth narrowed within the platform's policy
    (classification, quarantine and rendering all read `rtj.spec.node_health`), and the
    platform's resolver image where the job names none."""
    spec = snap.rtj.spec
    update: dict[str, object] = {}
    health = effective_node_health(spec.node_health, snap.node_health)
    if health != spec.node_health:
        update["node_health"] = health
    if spec.checkpoint.resolver_image is None and snap.resolver_image:
        image = {"resolver_image": snap.resolver_image}
        update["checkpoint"] = spec.checkpoint.model_copy(update=image)
    if not update:
        return snap
    rtj = snap.rtj.model_copy(update={"spec": spec.model_copy(update=update)})
    return replace(snap, rtj=rtj)
