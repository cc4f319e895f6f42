"""The lifecycle fields a batch Job user expects: `spec.suspend`, `spec.activeDeadlineSeconds`
and `spec.ttlSecondsAfterFinished`. Pure, like the rest of the plan: decisions over the
snapshot, written into the plan builder.

Their meaning follows the batch Job controller's (kubernetes
`pkg/controller/job/job_controller.go`: the Suspended condition with reasons JobSuspended
and JobResumed, Events Suspended and Resumed, the failure reason DeadlineExceeded, "Job was
active longer than specified deadline") and Kubeflow Trainer's TrainJob (the same names,
`pkg/apis/trainer/v1alpha1/trainjob_types.go`), where a whole-group restart is what sets an
RTJ apart:

- **suspend.** A suspended job runs nothing. Its running (or still queued) attempt is
  stopped like a preemption that spends no budget: the attempt record is closed
  (`endReason: Suspended`), the phase is `Suspended` (a phase, not only a condition: `kubectl
  get rtj` must not show a stopped job as Running, and `rtj_jobs{phase}` counts it apart)
  and the condition `Suspended` is True (what `kubectl wait` and Job users look for). Every
  JobSet and pod of the job is deleted, as when a failure is recorded (`converge.py`), after
  the status says so. Suspending between attempts (Restarting, backoff) or before the first
  one only changes the phase. Resuming clears the backoff and plans the next attempt in the
  same pass: it waits for the old world to go (`converge`), reads the store afresh and
  resumes from the newest verified step, no budget spent.
- **activeDeadlineSeconds.** Counted from `status.startTime`: the first admission by Kueue
  of one of the job's attempts (a batch Job's startTime is set when it is first unsuspended,
  which is Kueue's admission; time in the queue before the job ever ran does not count).
  Restarts, backoffs and re-admissions count: it is a bound on wall-clock time. Suspending
  stops the clock and resets it (startTime is cleared and set again at the first admission
  after the resume), as a batch Job's. When it passes the job fails for good with reason
  `DeadlineExceeded`, in category `user` (the user's own limit, so `rtj_job_failed` and the
  RTJJobFailed alert warn instead of paging), and its JobSet is deleted after the Failed
  status is written. A JobSet seen Completed wins over a deadline passed meanwhile.
- **ttlSecondsAfterFinished.** Counted from the Succeeded or Failed condition's transition
  (as the TTL-after-finished controller counts from a Job's finished condition). Then the
  operator deletes the job with foreground propagation and a uid precondition (what that
  controller does): its JobSets and pods go first, a job re-created under the same name is
  never touched, and the finalizer that releases quarantines runs as on any deletion. Only
  for a job already finished in the stored status, so the deletion never races this plan's
  own status patch.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from rtj_operator.api.reasons import ConditionType, FailureCategory, Phase, Reason
from rtj_operator.api.status import ResilientTrainingJobStatus
from rtj_operator.policy.render import jobset_name
from rtj_operator.reconcile.actions import DeleteJob, DeleteJobSet
from rtj_operator.reconcile.builder import PlanBuilder, condition_true
from rtj_operator.reconcile.converge import CONVERGE_POLL_SECONDS, DELETE_RESEND, delete_pods
from rtj_operator.reconcile.failure import release_failed_job
from rtj_operator.reconcile.world import read_jobset

ENDED_SUSPENDED = "Suspended"
ENDED_DEADLINE = "DeadlineExceeded"
"""`status.attempts[].endReason` of an attempt stopped by spec.suspend or by the deadline."""

_STOPPED_CONDITIONS = (
    ConditionType.ADMITTED,
    ConditionType.RUNNING,
    ConditionType.RESTARTING,
    ConditionType.STALLED,
)


def hold(b: PlanBuilder) -> bool:
    """Before the phase is planned: True when nothing else may run in this pass (the job is
    suspended, or its deadline just failed it). A resume returns False after preparing the
    status, so the next attempt is planned at once."""
    status = b.status
    if status.phase.terminal:
        return False
    if b.rtj.spec.suspend:
        _suspend(b)
        return True
    if status.phase is Phase.SUSPENDED:
        _resume(b)
        return False
    return _past_deadline(b)


def follow(b: PlanBuilder) -> None:
    """After the phase is planned: the deadline's clock (set at admission, a wake-up when it
    passes) and the deletion after ttlSecondsAfterFinished."""
    _note_start(b)
    deadline = deadline_of(b.rtj.spec.active_deadline_seconds, b.status)
    if deadline is not None and not b.status.phase.terminal:
        b.requeue_in((deadline - b.now).total_seconds())
    _expire_finished(b)


def deadline_of(seconds: int | None, status: ResilientTrainingJobStatus) -> datetime | None:
    """When the job's activeDeadlineSeconds passes (None: no deadline, or its clock is not
    running: never admitted since creation or since the last resume)."""
    if seconds is None or status.start_time is None or status.phase is Phase.SUSPENDED:
        return None
    return status.start_time + timedelta(seconds=seconds)


def suspended_since(status: ResilientTrainingJobStatus, moment: datetime) -> bool:
    """Whether the job was suspended or resumed after `moment` (the time from a failure to
    the next attempt then includes the suspension and is no recovery time)."""
    return any(
        c.type == ConditionType.SUSPENDED.value and c.last_transition_time >= moment
        for c in status.conditions
    )


# --- suspend ----------------------------------------------------------------------------------


def _suspend(b: PlanBuilder) -> None:
    status = b.status
    first = status.phase is not Phase.SUSPENDED
    if first:
        n = status.attempt
        record = status.current
        if record is not None and record.ended_at is None:
            b.replace_current(
                record.model_copy(update={"ended_at": b.now, "end_reason": ENDED_SUSPENDED})
            )
            what = f"attempt {n} stopped (its JobSet and pods are deleted)"
        elif n == 0:
            what = "no attempt started yet"
        else:
            what = f"between attempts (attempt {n} had ended)"
        message = (
            f"suspended (spec.suspend): {what}; no restart budget is spent, and setting "
            "spec.suspend to false resumes from the newest verified step"
        )
        b.update(phase=Phase.SUSPENDED, next_attempt_at=None, start_time=None)
        for type_ in _STOPPED_CONDITIONS:
            if condition_true(b.status, type_):
                b.condition(type_, False, Reason.JOB_SUSPENDED, "the job is suspended")
        b.condition(ConditionType.SUSPENDED, True, Reason.JOB_SUSPENDED, message)
        b.event(False, Reason.SUSPENDED, message)
        b.notes.append(message)
    _tear_down(b, resend=not first)


def _tear_down(b: PlanBuilder, *, resend: bool) -> None:
    """Delete every JobSet and pod of the job, as converge does before an attempt: the plan
    that suspends sends the deletes (after its status patch); later plans send again those
    still not being deleted DELETE_RESEND after it (the watch cache may lag behind)."""
    since = _suspended_at(b.status)
    if resend and since is not None and b.now - since < DELETE_RESEND:
        b.requeue_in((since + DELETE_RESEND - b.now).total_seconds())
        return
    views = [read_jobset(js) for js in b.snap.jobsets]
    for view in views:
        if not view.deleting:
            b.after.append(DeleteJobSet(view.name))
    delete_pods(b, b.snap.pods)
    if views or b.snap.pods:
        b.requeue_in(CONVERGE_POLL_SECONDS)


def _suspended_at(status: ResilientTrainingJobStatus) -> datetime | None:
    return next(
        (c.last_transition_time for c in status.conditions
         if c.type == ConditionType.SUSPENDED.value and c.status == "True"),
        None,
    )  # fmt: skip


def _resume(b: PlanBuilder) -> None:
    n = b.status.attempt
    b.update(phase=Phase.PENDING if n == 0 else Phase.RESTARTING, next_attempt_at=None)
    message = (
        f"resumed (spec.suspend is false): attempt {n + 1} starts from the newest verified "
        "step once the old world is gone, without backoff"
    )
    b.condition(ConditionType.SUSPENDED, False, Reason.JOB_RESUMED, message)
    b.event(False, Reason.RESUMED, message)
    b.notes.append(message)


# --- activeDeadlineSeconds --------------------------------------------------------------------


def _note_start(b: PlanBuilder) -> None:
    """startTime: the admission that starts the clock (the Admitted condition's transition),
    written by the plan that sees it. A job admitted before startTime existed gets it (from
    its current attempt's admission) only once it has a deadline, so no job is patched just
    for a field nothing reads."""
    status, active = b.status, (Phase.ADMITTED, Phase.RUNNING)
    if status.start_time is not None or status.phase not in active:
        return
    if b.snap.rtj.status.phase in active and b.rtj.spec.active_deadline_seconds is None:
        return
    admitted = next(
        (c for c in status.conditions
         if c.type == ConditionType.ADMITTED.value and c.status == "True"),
        None,
    )  # fmt: skip
    b.update(start_time=admitted.last_transition_time if admitted is not None else b.now)


def _past_deadline(b: PlanBuilder) -> bool:
    seconds = b.rtj.spec.active_deadline_seconds
    deadline = deadline_of(seconds, b.status)
    if deadline is None or b.now < deadline or _completed(b):
        return False
    status = b.status
    started = status.start_time.isoformat() if status.start_time is not None else "?"
    message = (
        f"active longer than spec.activeDeadlineSeconds ({seconds} s since {started}, "
        "restarts included): the job fails for good"
    )
    record = status.current
    if record is not None and record.ended_at is None:
        update = {
            "ended_at": b.now,
            "end_reason": ENDED_DEADLINE,
            "failure_category": FailureCategory.USER,  # the user's limit: warn, never page
        }
        b.replace_current(record.model_copy(update=update))
    b.update(phase=Phase.FAILED, next_attempt_at=None)
    b.condition(ConditionType.FAILED, True, Reason.DEADLINE_EXCEEDED, message)
    b.condition(
        ConditionType.RUNNING, False, Reason.DEADLINE_EXCEEDED, f"attempt {status.attempt} ended"
    )
    if condition_true(b.status, ConditionType.RESTARTING):
        b.condition(ConditionType.RESTARTING, False, Reason.DEADLINE_EXCEEDED, message)
    b.event(True, Reason.DEADLINE_EXCEEDED, message)
    b.notes.append(message)
    release_failed_job(b)  # after the Failed status: a failed job holds nothing
    return True


def _completed(b: PlanBuilder) -> bool:
    """The current attempt's JobSet is Completed: success is recorded, not a deadline."""
    name = jobset_name(b.rtj.metadata.name, b.status.attempt)
    uid = b.rtj.metadata.uid
    return any(
        v.name == name and v.owner_uid == uid and v.completed
        for v in map(read_jobset, b.snap.jobsets)
    )


# --- ttlSecondsAfterFinished ------------------------------------------------------------------


def finished_at(status: ResilientTrainingJobStatus) -> datetime | None:
    """When the job finished: its Complete (Succeeded, before Complete) or Failed condition's
    transition (the last attempt's end when the condition is missing)."""
    wanted = (
        (ConditionType.COMPLETE.value, ConditionType.SUCCEEDED.value)
        if status.phase is Phase.SUCCEEDED
        else (ConditionType.FAILED.value,)
    )
    condition = next(
        (c for c in status.conditions if c.type in wanted and c.status == "True"), None
    )
    if condition is not None:
        return condition.last_transition_time
    return status.current.ended_at if status.current is not None else None


def _expire_finished(b: PlanBuilder) -> None:
    ttl = b.rtj.spec.ttl_seconds_after_finished
    stored = b.snap.rtj.status  # finished before this plan: no status patch races the delete
    if ttl is None:
        return
    if not stored.phase.terminal:
        if b.status.phase.terminal:  # finishing in this plan: the next one deletes
            b.requeue_in(float(ttl))
        return
    since = finished_at(stored)
    if since is None:
        b.notes.append("finished, but when is unknown: ttlSecondsAfterFinished waits")
        return
    due = since + timedelta(seconds=ttl)
    if b.now < due:
        b.requeue_in((due - b.now).total_seconds())
        return
    message = (
        f"deleting the job: it is {stored.phase.value} since {since.isoformat()} and "
        f"spec.ttlSecondsAfterFinished is {ttl} s (its JobSets and pods go first)"
    )
    b.after.append(DeleteJob(b.rtj.metadata.uid))
    b.event(False, Reason.TTL_EXPIRED, message)
    b.notes.append(message)
