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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from rtj_operator.api import keys
from rtj_operator.api.reasons import ConditionType, FailureCategory, FailureClass, Phase, Reason
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.api.status import (
    AttemptRecord,
    Condition,
    FirstFailed,
    QuarantinedNode,
    ResilientTrainingJobStatus,
    VerifiedCheckpoint,
)
from rtj_operator.policy.classify import Classification, classify_failure
from rtj_operator.policy.decide import Fail, Quarantine, Restart, StartAttempt, Wait, decide
from rtj_operator.policy.observed import parse_time
from rtj_operator.policy.render import jobset_name, quarantine_taint, render_jobset
from rtj_operator.selection import (
    Selection,
    operator_reads_store,
    parse_init_result,
    pin_for,
)

Json = Mapping[str, Any]

MAX_ATTEMPT_RECORDS = 32
"""Older records are trimmed (`status.restarts` keeps the counts)."""
MAX_EVIDENCE_LINES = 16
MAX_EVIDENCE_CHARS = 1024
MAX_EVENT_MESSAGE = 1024
JOBSET_APPEAR_GRACE = timedelta(seconds=15)
"""A JobSet just created may not be in the watch cache yet: that is not a lost JobSet."""
JOBSET_FAILED_GRACE = timedelta(seconds=5)
"""A failed JobSet whose failed pod has not been seen yet: wait this long for the pod."""
CONVERGE_POLL_SECONDS = 5.0
DELETE_RESEND = timedelta(seconds=5)
"""The plan that records a failure deletes the attempt's JobSet and pods; for this long after
it (the record's `endedAt`) they are not deleted again while the watch cache has not caught
up. A delete that failed is sent again after it."""
STORE_FRESH = timedelta(seconds=10)
"""A store reading older than this is re-read before an attempt is started."""
STORE_RETRY_SECONDS = 30.0
"""The longest wait before an unreadable store is read again."""
STORE_RETRY_MIN_SECONDS = 2.0
"""The first wait after a store turned unreadable. The wait then grows with the outage (it
about doubles) up to STORE_RETRY_SECONDS: a blip delays a restart by seconds, a long outage
costs one read per STORE_RETRY_SECONDS."""
STALE_FACTOR = 2
"""CheckpointStale when the newest verified step is older than this many planned intervals."""
QUEUE_RECHECK = timedelta(seconds=60)
"""While a JobSet waits for admission, the job's LocalQueue is looked up this often."""
USER_FAILURE_SETTLE = timedelta(seconds=5)
"""A failure whose root cause is user-category (UserError, OutOfMemory, ConfigError) is
recorded only this long after the first failed rank's termination (its `finishedAt`): a
GPU node agent may report the XID that explains a CUDA traceback a moment after the
traceback reaches the operator, and a user-category record fails the job for good.
Infrastructure, preemption and checkpoint classes are recorded at once."""


# --- the observed world -------------------------------------------------------------------


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def attempt_of(obj: Json) -> int | None:
    """The attempt label of a JobSet or pod (None: not labelled)."""
    value = _get(obj, "metadata", "labels", keys.ATTEMPT_LABEL)
    return int(value) if isinstance(value, str) and value.isdigit() else None


@dataclass(frozen=True)
class JobSetView:
    name: str
    attempt: int | None
    deleting: bool
    suspended: bool
    created_at: datetime | None
    resume_step: int | None
    completed: bool
    failed: bool
    failed_at: datetime | None
    failure_message: str
    queue_name: str | None = None


def read_jobset(raw: Json) -> JobSetView:
    conditions = _get(raw, "status", "conditions") or []
    true = {
        c.get("type"): c for c in conditions if isinstance(c, Mapping) and c.get("status") == "True"
    }
    failed = true.get("Failed")
    step = _get(raw, "metadata", "annotations", keys.RESUME_STEP_ANNOTATION)
    name = _get(raw, "metadata", "name") or ""
    return JobSetView(
        name=name,
        attempt=attempt_of(raw),
        deleting=_get(raw, "metadata", "deletionTimestamp") is not None,
        suspended=bool(_get(raw, "spec", "suspend")),
        created_at=parse_time(_get(raw, "metadata", "creationTimestamp")),
        resume_step=int(step) if isinstance(step, str) and step.isdigit() else None,
        completed="Completed" in true,
        failed=failed is not None,
        failed_at=parse_time(failed.get("lastTransitionTime")) if failed else None,
        failure_message=str(failed.get("message", "")) if failed else "",
        queue_name=_get(raw, "metadata", "labels", keys.KUEUE_QUEUE_LABEL),
    )


@dataclass(frozen=True)
class StoreReading:
    """The latest reading of an s3:// checkpoint store: a selection, or why it failed."""

    read_at: datetime
    selection: Selection | None = None
    error: str | None = None


@dataclass(frozen=True)
class QueueReading:
    """The job's Kueue LocalQueue as last looked up: whether it exists (None: unknown,
    e.g. the lookup failed or is not permitted; `detail` says why)."""

    read_at: datetime
    exists: bool | None
    detail: str = ""
    name: str = ""
    """The LocalQueue looked up; a reading of another name is no answer for this one."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one reconcile decides from; immutable, gathered without API calls."""

    rtj: ResilientTrainingJob
    resource_version: str
    jobsets: tuple[Json, ...]
    pods: tuple[Json, ...]
    """Live pods labelled for this job, every attempt."""
    gone_pods: tuple[Json, ...]
    """Pods of this job deleted while the operator watched (last state seen)."""
    nodes: Mapping[str, Json]
    """Nodes the pods ran on, those that exist."""
    events: tuple[Json, ...] | None
    """Events about the pods, their nodes and the Kueue Workload; None: not read yet (they
    are read only once a failure is seen, so watching every Event is never needed)."""
    now: datetime
    store: StoreReading | None = None
    stored_status: Mapping[str, Any] = field(default_factory=dict)
    """`status` exactly as the API server returned it (the base of the merge patch)."""
    queue: QueueReading | None = None
    deleted_nodes: frozenset[str] = frozenset()
    """Nodes of these pods seen deleted (a watch DELETED or absent from a LIST): positive
    evidence the machine is gone, unlike a node the cache merely lacks."""


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch turning `old` into `new`: removed keys become null."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value)
            if inner:
                patch[key] = inner
        elif before != value or key not in old:
            patch[key] = value
    return patch


# --- actions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateJobSet:
    body: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteJobSet:
    name: str


@dataclass(frozen=True)
class DeletePod:
    name: str
    grace_seconds: int | None = None
    """None: the pod's own grace period; 0: force (its node no longer exists)."""


@dataclass(frozen=True)
class TaintNode:
    node: str
    taint: Mapping[str, str]


@dataclass(frozen=True)
class UntaintNode:
    node: str
    taint: Mapping[str, str]


@dataclass(frozen=True)
class PatchStatus:
    status: Mapping[str, Any]
    """The whole new status."""
    patch: Mapping[str, Any]
    """The JSON merge patch from the stored status to `status` (removed fields as null)."""
    resource_version: str


@dataclass(frozen=True)
class PostEvent:
    type: str
    reason: str
    message: str


KubeAction = CreateJobSet | DeleteJobSet | DeletePod | TaintNode | UntaintNode | PatchStatus
Action = KubeAction | PostEvent


@dataclass(frozen=True)
class MetricRecord:
    """A metric to record once the plan has been applied: kind in failure, restart,
    detection, recovery, lost_steps."""

    kind: str
    failure_class: FailureClass | None = None
    value: float = 1.0


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    """In order: side effects before the status patch, the patch, side effects after it,
    then events (posted only when everything before them succeeded)."""
    requeue_after: float | None = None
    needs_store: bool = False
    metrics: tuple[MetricRecord, ...] = ()
    summary: str = ""
    needs_events: bool = False
    needs_queue: str | None = None
    """The LocalQueue to look up (the one the waiting JobSet is labelled with)."""

    @property
    def status_patch(self) -> PatchStatus | None:
        return next((a for a in self.actions if isinstance(a, PatchStatus)), None)


# --- pure helpers -------------------------------------------------------------------------


def set_condition(
    conditions: Sequence[Condition],
    type_: ConditionType,
    status: bool,
    reason: Reason | str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> list[Condition]:
    """metav1 semantics: lastTransitionTime moves only when `status` changes."""
    value: Literal["True", "False"] = "True" if status else "False"
    reason_text = reason.value if isinstance(reason, Reason) else reason
    old = next((c for c in conditions if c.type == type_.value), None)
    since = old.last_transition_time if old is not None and old.status == value else now
    new = Condition(
        type=type_.value,
        status=value,
        reason=reason_text,
        message=message[:MAX_EVIDENCE_CHARS],
        last_transition_time=since,
        observed_generation=generation,
    )
    out = [c for c in conditions if c.type != type_.value]
    out.append(new)
    return sorted(out, key=lambda c: c.type)


def condition_true(status: ResilientTrainingJobStatus, type_: ConditionType) -> bool:
    return any(c.type == type_.value and c.status == "True" for c in status.conditions)


def add_taint(taints: Sequence[Json], taint: Json) -> list[dict[str, Any]] | None:
    """The node's taints with `taint` added; None when nothing changes.

    A node holds one taint per key and effect: if another job already quarantined it
    (same key and effect, other value), the node stays quarantined and nothing changes.
    """
    same = [
        t for t in taints if t.get("key") == taint["key"] and t.get("effect") == taint["effect"]
    ]
    if same:
        return None
    return [dict(t) for t in taints] + [dict(taint)]


def remove_taint(taints: Sequence[Json], taint: Json) -> list[dict[str, Any]] | None:
    """The node's taints without ours (key, value and effect all match); None: unchanged."""
    kept = [
        dict(t)
        for t in taints
        if not (
            t.get("key") == taint["key"]
            and t.get("effect") == taint["effect"]
            and t.get("value", "") == taint.get("value", "")
        )
    ]
    return kept if len(kept) != len(taints) else None


def _trim(lines: Iterable[str]) -> list[str]:
    out = []
    for line in list(lines)[:MAX_EVIDENCE_LINES]:
        out.append(
            line if len(line) <= MAX_EVIDENCE_CHARS else line[: MAX_EVIDENCE_CHARS - 1] + "…"
        )
    return out


def _event_message(text: str) -> str:
    return text if len(text) <= MAX_EVENT_MESSAGE else text[: MAX_EVENT_MESSAGE - 1] + "…"


def _first_failed(found: Classification) -> FirstFailed | None:
    first = found.first_failed
    if first is None:
        return None
    return FirstFailed(
        pod=first.pod,
        rank=first.rank,
        node_rank=first.node_rank,
        node=first.node,
        container=first.container,
        exit_code=first.exit_code,
        finished_at=first.finished_at,
    )


def synthetic_failure(evidence: str) -> Classification:
    """A failure seen on the JobSet rather than on a pod (gone, or failed with no pod)."""
    return Classification(FailureClass.UNKNOWN, None, (), (evidence,))


def _describe(found: Classification, lines: int = 3) -> str:
    evidence = " | ".join(found.evidence[:lines])
    return f"class {found.failure_class.value} ({found.category.value}); evidence: {evidence}"


# --- the plan builder ---------------------------------------------------------------------


@dataclass
class _Builder:
    snap: Snapshot
    status: ResilientTrainingJobStatus
    before: list[KubeAction] = field(default_factory=list)
    after: list[KubeAction] = field(default_factory=list)
    events: list[PostEvent] = field(default_factory=list)
    metrics: list[MetricRecord] = field(default_factory=list)
    requeue: float | None = None
    needs_store: bool = False
    needs_events: bool = False
    needs_queue: str | None = None
    """The LocalQueue to look up (the one the waiting JobSet is labelled with)."""
    notes: list[str] = field(default_factory=list)

    @property
    def now(self) -> datetime:
        return self.snap.now

    @property
    def rtj(self) -> ResilientTrainingJob:
        return self.snap.rtj

    def update(self, **fields: Any) -> None:
        self.status = self.status.model_copy(update=fields)

    def condition(
        self, type_: ConditionType, status: bool, reason: Reason | str, message: str
    ) -> None:
        conditions = set_condition(
            self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.now,
            self.rtj.metadata.generation or None,
        )
        self.update(conditions=conditions)

    def event(self, warning: bool, reason: Reason | str, message: str) -> None:
        text = reason.value if isinstance(reason, Reason) else reason
        self.events.append(
            PostEvent("Warning" if warning else "Normal", text, _event_message(message))
        )

    def requeue_in(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def replace_current(self, record: AttemptRecord) -> None:
        attempts = list(self.status.attempts)
        attempts[-1] = record
        self.update(attempts=attempts)

    def build(self) -> Plan:
        if self.needs_store:  # incomplete: plan again with a fresh reading of the store
            return Plan((), None, True, (), "reading the checkpoint store")
        if self.needs_events:  # incomplete: plan again with the events about the failure
            return Plan((), None, False, (), "reading events", needs_events=True)
        if self.needs_queue:  # incomplete: plan again with the LocalQueue looked up
            return Plan(
                (), None, False, (), "looking up the LocalQueue", needs_queue=self.needs_queue
            )
        original = self.snap.rtj.status
        generation = self.rtj.metadata.generation or None
        if generation is not None and self.status.observed_generation != generation:
            self.update(observed_generation=generation)
        actions: list[Action] = [*self.before]
        new = self.status.to_json()
        if new != original.to_json():
            patch = merge_patch(self.snap.stored_status, new)
            actions.append(PatchStatus(new, patch, self.snap.resource_version))
        actions += self.after
        actions += self.events
        return Plan(
            tuple(actions),
            self.requeue,
            self.needs_store,
            tuple(self.metrics),
            "; ".join(self.notes),
        )


def plan(snap: Snapshot) -> Plan:
    """What to do now for one job. Pure: the same snapshot always gives the same plan."""
    b = _Builder(snap, snap.rtj.status)
    _lift_expired_quarantines(b)
    status = b.status
    if status.phase.terminal:
        b.notes.append(f"job is {status.phase.value}")
    elif status.attempt == 0 or status.phase is Phase.RESTARTING:
        _plan_next_attempt(b)
    else:
        _plan_current_attempt(b)
    return b.build()


# --- quarantine TTL -----------------------------------------------------------------------


def _lift_expired_quarantines(b: _Builder) -> None:
    ttl = b.rtj.spec.node_health.quarantine_ttl_seconds
    if ttl is None or not b.status.quarantined_nodes:
        return
    taint = quarantine_taint(b.rtj)
    kept: list[QuarantinedNode] = []
    for q in b.status.quarantined_nodes:
        expires = q.since + timedelta(seconds=ttl)
        if expires > b.now:
            kept.append(q)
            b.requeue_in((expires - b.now).total_seconds())
            continue
        b.before.append(UntaintNode(q.node, taint))
        b.event(
            False,
            Reason.QUARANTINE_LIFTED,
            f"node {q.node}: quarantine TTL of {ttl}s expired "
            f"(quarantined at {q.since.isoformat()} for {q.failure_class.value})",
        )
        b.notes.append(f"lift quarantine of {q.node}")
    b.update(quarantined_nodes=kept)
    if not kept:
        b.condition(
            ConditionType.NODES_QUARANTINED,
            False,
            Reason.QUARANTINE_LIFTED,
            "no node is quarantined by this job",
        )


# --- starting the next attempt ------------------------------------------------------------


def _plan_next_attempt(b: _Builder) -> None:
    snap, status = b.snap, b.status
    n = status.attempt + 1
    name = jobset_name(b.rtj.metadata.name, n)
    views = [read_jobset(js) for js in snap.jobsets]
    mine = next((v for v in views if v.name == name and not v.deleting), None)
    if mine is not None:  # created before a crash or a lost status patch: adopt it
        b.notes.append(f"adopt {name}")
        _record_started(b, n, name, mine.created_at or b.now, mine.resume_step, adopted=True)
        b.event(
            False,
            Reason.ATTEMPT_STARTED,
            f"attempt {n}: adopted JobSet {name} (created before the operator restarted)",
        )
        return
    if _converge(b, views):
        return
    action = decide(b.rtj.spec, status, None, b.now)
    if isinstance(action, Wait):
        if action.until is not None:
            b.requeue_in((action.until - b.now).total_seconds())
        b.condition(ConditionType.RESTARTING, True, action.reason, action.message)
        b.notes.append(action.message)
        return
    if not isinstance(action, StartAttempt):  # decide never returns more here
        b.notes.append(f"unexpected {type(action).__name__} before an attempt")
        return
    uri = b.rtj.spec.checkpoint.uri
    selection: Selection | None = None
    if operator_reads_store(uri):
        store = snap.store
        failed = status.current.ended_at if status.current is not None else None
        if store is None or _store_stale(b, store) or (failed and store.read_at < failed):
            b.needs_store = True  # read after the failure: a step published just before counts
            return
        if store.error is not None:
            _store_unreadable(b, store.error, blocking=f"attempt {n} is blocked")
            b.requeue_in((_store_retry_at(b.status, store) - b.now).total_seconds())
            return
        selection = store.selection
        _store_readable(b)
    pin = pin_for(uri, selection, action.resume_step)
    if selection is not None and selection.step is not None and selection.committed_at:
        _note_verified(b, selection.step, selection.uri or uri, selection.committed_at, b.now)
    rendered = b.rtj.model_copy(update={"status": b.status})
    b.before.append(CreateJobSet(render_jobset(rendered, n, pin)))
    where = f"step {pin}" if pin is not None else "the newest step the init container verifies"
    detail = f" (store: {selection.summary()})" if selection is not None else ""
    b.event(
        False,
        Reason.ATTEMPT_STARTED,
        f"attempt {n} ({action.message.partition(':')[0]}): JobSet {name} resumes from "
        f"{where}{detail}",
    )
    _record_started(b, n, name, b.now, pin, adopted=False)


def _pod_name(pod: Json) -> str:
    return str(_get(pod, "metadata", "name"))


def _on_deleted_nodes(snap: Snapshot) -> set[str]:
    """Pods bound to a node seen deleted (a node the cache merely lacks does not count:
    force-deleting a pod a live kubelet still runs would free its GPUs too early)."""
    return {
        _pod_name(p)
        for p in snap.pods
        if (node := _get(p, "spec", "nodeName")) in snap.deleted_nodes and node not in snap.nodes
    }


def _queued_pod_deletes(b: _Builder) -> set[str]:
    return {a.name for a in (*b.before, *b.after) if isinstance(a, DeletePod)}


def _delete_orphans(b: _Builder, pods: Iterable[Json], views: Sequence[JobSetView]) -> None:
    """Pods whose JobSet is gone (orphaned by a non-cascading delete) are deleted directly."""
    alive = {v.name for v in views}
    queued = _queued_pod_deletes(b)
    for pod in pods:
        owner = _get(pod, "metadata", "labels", keys.JOBSET_NAME_LABEL)
        deleting = _get(pod, "metadata", "deletionTimestamp") is not None
        if not deleting and owner not in alive and _pod_name(pod) not in queued:
            b.after.append(DeletePod(_pod_name(pod)))


def _delete_pods(b: _Builder, pods: Iterable[Json], spare: Iterable[str] = ()) -> None:
    """Delete these pods directly: those not being deleted yet with their own grace period,
    those on a node that no longer exists by force (grace 0) unless already forced: no
    kubelet will ever confirm their end, and the machine is gone (what the pod garbage
    collector does too, but only after its 40 s quarantine and on its own period, which
    would hold the restart). `spare`: pods not to delete again (a delete just sent)."""
    on_gone_nodes = _on_deleted_nodes(b.snap)
    skip = _queued_pod_deletes(b) | set(spare)
    for pod in pods:
        name = _pod_name(pod)
        if name in skip:
            continue
        if name in on_gone_nodes:
            if _get(pod, "metadata", "deletionGracePeriodSeconds") != 0:
                b.after.append(DeletePod(name, grace_seconds=0))
        elif _get(pod, "metadata", "deletionTimestamp") is None:
            b.after.append(DeletePod(name))


def _teardown_sent(b: _Builder) -> datetime | None:
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


def _converge(b: _Builder, views: Sequence[JobSetView]) -> bool:
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
            created = parse_time(_get(pod, "metadata", "creationTimestamp"))
            if attempt_of(pod) == n and (created is None or created <= sent):
                spare.append(_pod_name(pod))
    spared = spared or bool(spare)
    _delete_pods(b, b.snap.pods, spare)
    if not views and not b.snap.pods:
        return False
    message = (
        f"converging before attempt {n + 1}: waiting for the JobSets and pods of earlier "
        "attempts to go"
    )  # no counts: one status patch while converging, not one per pod gone
    b.condition(ConditionType.RESTARTING, True, Reason.WAITING_FOR_OLD_WORLD, message)
    b.notes.append(
        f"converging before attempt {n + 1}: {len(views)} JobSet(s) and {len(b.snap.pods)} "
        "pod(s) of earlier attempts remain"
    )
    b.requeue_in(CONVERGE_POLL_SECONDS)
    if spared and sent is not None:
        b.requeue_in((sent + DELETE_RESEND - b.now).total_seconds())
    return True


def _record_started(
    b: _Builder, n: int, name: str, started: datetime, pin: int | None, *, adopted: bool
) -> None:
    status = b.status
    attempts = list(status.attempts)
    previous = attempts[-1] if attempts else None
    if (
        previous is not None
        and previous.failure_class is not None
        and previous.recovery_seconds is None
    ):
        onset = (
            previous.first_failed.finished_at if previous.first_failed else None
        ) or previous.ended_at
        if onset is not None:
            seconds = max((started - onset).total_seconds(), 0.0)
            attempts[-1] = previous.model_copy(update={"recovery_seconds": round(seconds, 3)})
            b.metrics.append(MetricRecord("recovery", previous.failure_class, seconds))
    before = b.snap.rtj.status.last_verified_checkpoint  # as known before this plan
    known = before.step if before is not None else None
    # file:// roots: the step resumed is known once the init container reports it
    lost = _lost_steps(known, pin) if operator_reads_store(b.rtj.spec.checkpoint.uri) else None
    if lost:
        b.metrics.append(MetricRecord("lost_steps", None, float(lost)))
    attempts.append(
        AttemptRecord(
            attempt=n, job_set=name, started_at=started, resumed_from_step=pin, lost_steps=lost
        )
    )
    b.update(
        attempt=n,
        attempts=attempts[-MAX_ATTEMPT_RECORDS:],
        phase=Phase.PENDING,
        next_attempt_at=None,
    )
    message = f"attempt {n} started: JobSet {name}" + (" (adopted)" if adopted else "")
    b.condition(ConditionType.RESTARTING, False, Reason.ATTEMPT_STARTED, message)
    b.condition(
        ConditionType.ADMITTED,
        False,
        Reason.AWAITING_ADMISSION,
        f"JobSet {name} waits for Kueue to admit the whole group",
    )
    b.condition(
        ConditionType.RUNNING, False, Reason.AWAITING_ADMISSION, f"attempt {n} not running yet"
    )
    b.notes.append(message)


def _lost_steps(known: int | None, resumed: int | None) -> int:
    """Verified steps passed over: the newest known before the start minus the one resumed."""
    if known is None:
        return 0
    return max(known - (resumed if resumed is not None else 0), 0)


def _note_verified(
    b: _Builder, step: int, uri: str, committed_at: datetime, verified_at: datetime
) -> None:
    current = b.status.last_verified_checkpoint
    superseded = current is not None and current.step in b.status.bad_steps
    if current is not None and current.step > step and not superseded:
        return  # a newer verified step is known (a step marked bad is not verified)
    if current is not None and current.step == step and current.uri == uri:
        return
    b.update(
        last_verified_checkpoint=VerifiedCheckpoint(
            step=step, uri=uri, committed_at=committed_at, verified_at=verified_at
        )
    )


def _store_stale(b: _Builder, store: StoreReading) -> bool:
    """Whether to read the store again before deciding: a good reading after STORE_FRESH,
    an error when its retry is due."""
    if store.error is not None:
        return b.now >= _store_retry_at(b.status, store)
    return store.read_at < b.now - STORE_FRESH


def _store_retry_at(status: ResilientTrainingJobStatus, store: StoreReading) -> datetime:
    """When an unreadable store is read again: after as long as it has been unreadable when
    it was last read (STORE_RETRY_MIN_SECONDS at first, STORE_RETRY_SECONDS at most)."""
    cond = next(
        (
            c
            for c in status.conditions
            if c.type == ConditionType.CHECKPOINT_UNREADABLE.value and c.status == "True"
        ),
        None,
    )
    since = min(cond.last_transition_time, store.read_at) if cond else store.read_at
    outage = (store.read_at - since).total_seconds()
    wait = min(max(outage, STORE_RETRY_MIN_SECONDS), STORE_RETRY_SECONDS)
    return store.read_at + timedelta(seconds=wait)


def _store_unreadable(b: _Builder, error: str, blocking: str) -> None:
    already = condition_true(b.status, ConditionType.CHECKPOINT_UNREADABLE)
    message = f"checkpoint store {b.rtj.spec.checkpoint.uri} cannot be read: {error}; {blocking} "
    message += "(an unreadable store is never treated as 'no checkpoint')"
    b.condition(
        ConditionType.CHECKPOINT_UNREADABLE, True, Reason.CHECKPOINT_STORE_UNREADABLE, message
    )
    if not already:
        b.event(True, Reason.CHECKPOINT_STORE_UNREADABLE, message)
    b.requeue_in(STORE_RETRY_SECONDS)
    b.notes.append(message)


def _store_readable(b: _Builder) -> None:
    if condition_true(b.status, ConditionType.CHECKPOINT_UNREADABLE):
        b.condition(
            ConditionType.CHECKPOINT_UNREADABLE,
            False,
            Reason.CHECKPOINT_READABLE,
            "the checkpoint store was read successfully",
        )
        b.event(False, Reason.CHECKPOINT_READABLE, "the checkpoint store is readable again")


# --- watching the current attempt ---------------------------------------------------------


def _plan_current_attempt(b: _Builder) -> None:
    snap, status = b.snap, b.status
    n = status.attempt
    name = jobset_name(b.rtj.metadata.name, n)
    views = [read_jobset(js) for js in snap.jobsets]
    current = next((v for v in views if v.name == name), None)
    strays = [v for v in views if v.attempt is not None and v.attempt < n and v.name != name]
    for v in strays:
        if not v.deleting:
            b.after.append(DeleteJobSet(v.name))
    _delete_orphans(b, [p for p in snap.pods if (attempt_of(p) or 0) < n], views)
    live = [p for p in snap.pods if attempt_of(p) == n]
    names = {_get(p, "metadata", "name") for p in live}
    gone = [
        p for p in snap.gone_pods if attempt_of(p) == n and _get(p, "metadata", "name") not in names
    ]
    _read_init_results(b, live)
    _refresh_checkpoint(b)

    found = classify_failure(
        [*live, *gone],
        list(snap.nodes.values()),
        list(snap.events or ()),
        b.now,
        node_health=b.rtj.spec.node_health,
    )
    if found is not None and snap.events is None:
        b.needs_events = True  # classify again with the events (eviction, preemption, node)
        return
    if found is None:
        record = status.current
        if current is None or current.deleting:
            started = record.started_at if record is not None else None
            if current is None and started is not None and b.now - started < JOBSET_APPEAR_GRACE:
                b.requeue_in(1.0)
                return
            what = "no longer exists" if current is None else "is being deleted"
            found = synthetic_failure(f"JobSet {name} of attempt {n} {what} (not by this operator)")
        elif current.completed:
            _succeed(b, n, name)
            return
        elif current.failed:
            failed_at = current.failed_at or b.now
            if b.now - failed_at < JOBSET_FAILED_GRACE:
                b.requeue_in((JOBSET_FAILED_GRACE - (b.now - failed_at)).total_seconds())
                return
            found = synthetic_failure(f"JobSet {name} failed: {current.failure_message}")
        else:
            _progress(b, current, live)
            return
    if _settling(b, found):
        return
    _on_failure(b, found, current)


def _settling(b: _Builder, found: Classification) -> bool:
    """A user-category failure is final only USER_FAILURE_SETTLE after the first failed
    rank's termination: until then nothing is recorded and the job is classified again at
    the window's end (or on any change before it: a node label or condition, a pod), with
    the events read afresh. Other categories are recorded at once."""
    failed_at = found.failed_at
    if found.category is not FailureCategory.USER or failed_at is None:
        return False
    settled = failed_at + USER_FAILURE_SETTLE
    if b.now >= settled or failed_at - b.now > USER_FAILURE_SETTLE:
        return False  # settled, or a kubelet clock so far ahead that waiting means nothing
    b.requeue_in((settled - b.now).total_seconds())
    b.notes.append(
        f"attempt {b.status.attempt}: {found.failure_class.value} on the first failed rank; "
        f"classifying again at {settled.isoformat()} (settle window, node agents may report late)"
    )
    return True


def _read_init_results(b: _Builder, pods: Sequence[Json]) -> None:
    """file:// roots: the init container tells which step it verified and resumed from."""
    for pod in pods:
        for raw in _get(pod, "status", "initContainerStatuses") or []:
            if not isinstance(raw, Mapping) or raw.get("name") != keys.RESUME_INIT_CONTAINER:
                continue
            term = _get(raw, "state", "terminated")
            if not isinstance(term, Mapping) or term.get("exitCode") != 0:
                continue
            result = parse_init_result(str(term.get("message") or ""))
            if result is None or result.error is not None:
                continue
            record = b.status.current
            if record is not None and record.resumed_from_step is None and result.step is not None:
                known = (
                    b.status.last_verified_checkpoint.step
                    if b.status.last_verified_checkpoint
                    else None
                )
                lost = _lost_steps(known, result.step)
                b.replace_current(
                    record.model_copy(update={"resumed_from_step": result.step, "lost_steps": lost})
                )
                if lost:
                    b.metrics.append(MetricRecord("lost_steps", None, float(lost)))
            if result.step is not None:
                at = parse_time(term.get("finishedAt")) or b.now
                _note_verified(b, result.step, result.uri or b.rtj.spec.checkpoint.uri, at, at)
            return


def _refresh_checkpoint(b: _Builder) -> None:
    """s3:// roots: the latest periodic reading moves lastVerifiedCheckpoint forward."""
    store = b.snap.store
    if store is not None and operator_reads_store(b.rtj.spec.checkpoint.uri):
        if store.error is not None:
            _store_unreadable(b, store.error, blocking="restarts are blocked until it is")
        else:
            _store_readable(b)
            sel = store.selection
            if sel is not None and sel.step is not None and sel.committed_at is not None:
                _note_verified(b, sel.step, sel.uri or "", sel.committed_at, store.read_at)
    _checkpoint_age(b)


def _checkpoint_age(b: _Builder) -> None:
    """CheckpointStale while running and the newest verified step is too old."""
    if b.status.phase is not Phase.RUNNING:
        return
    interval = b.rtj.spec.checkpoint.planned_interval_seconds
    limit = timedelta(seconds=STALE_FACTOR * interval)
    ckpt = b.status.last_verified_checkpoint
    running = next(
        (
            c
            for c in b.status.conditions
            if c.type == ConditionType.RUNNING.value and c.status == "True"
        ),
        None,
    )
    if running is None:
        return
    reference = running.last_transition_time
    if ckpt is not None and ckpt.committed_at > reference:
        reference = ckpt.committed_at
    age = b.now - reference
    stale = age > limit
    what = f"step {ckpt.step}" if ckpt is not None else "no verified checkpoint since the start"
    message = (
        f"{what}; age {int(age.total_seconds())}s, planned interval {interval}s "
        f"(stale beyond {STALE_FACTOR}x)"
    )
    was = condition_true(b.status, ConditionType.CHECKPOINT_STALE)
    if stale != was:
        reason = "CheckpointTooOld" if stale else "CheckpointFresh"
        b.condition(ConditionType.CHECKPOINT_STALE, stale, reason, message)
    if not stale:
        b.requeue_in((limit - age).total_seconds() + 1)


def _progress(b: _Builder, js: JobSetView, pods: Sequence[Json]) -> None:
    n = b.status.attempt
    if js.suspended:
        _awaiting_admission(b, js)
        return
    if b.status.phase is Phase.PENDING:
        b.update(phase=Phase.ADMITTED)
        b.condition(
            ConditionType.ADMITTED,
            True,
            Reason.ATTEMPT_ADMITTED,
            f"Kueue admitted JobSet {js.name}",
        )
        b.event(False, Reason.ATTEMPT_ADMITTED, f"attempt {n}: JobSet {js.name} admitted")
    running = sum(
        1
        for p in pods
        if _get(p, "status", "phase") == "Running"
        and _get(p, "metadata", "deletionTimestamp") is None
    )
    if running >= b.rtj.spec.replicas and b.status.phase is not Phase.RUNNING:
        b.update(phase=Phase.RUNNING)
        message = f"attempt {n}: all {running} workers of JobSet {js.name} are running"
        b.condition(ConditionType.RUNNING, True, Reason.ATTEMPT_RUNNING, message)
        b.event(False, Reason.ATTEMPT_RUNNING, message)


def _awaiting_admission(b: _Builder, js: JobSetView) -> None:
    """Kueue has not admitted the group yet. If spec.queueName names no LocalQueue it never
    will: say so in the Admitted condition (Kueue itself only tells its Workload)."""
    queue = b.snap.queue
    # the queue the JobSet was labelled with at creation (spec.queueName may change since)
    name, namespace = js.queue_name or b.rtj.spec.queue_name, b.rtj.metadata.namespace
    if queue is None or queue.name != name or b.now - queue.read_at >= QUEUE_RECHECK:
        b.needs_queue = name
        return
    b.requeue_in((queue.read_at + QUEUE_RECHECK - b.now).total_seconds())
    admitted = next(
        (c for c in b.status.conditions if c.type == ConditionType.ADMITTED.value), None
    )
    flagged = admitted is not None and admitted.reason == Reason.LOCAL_QUEUE_NOT_FOUND.value
    if queue.exists is False and not flagged:
        message = (
            f"LocalQueue {name} does not exist in namespace {namespace}; Kueue admits "
            f"JobSet {js.name} only once it does (spec.queueName)"
        )
        b.condition(ConditionType.ADMITTED, False, Reason.LOCAL_QUEUE_NOT_FOUND, message)
        b.event(True, Reason.LOCAL_QUEUE_NOT_FOUND, f"attempt {b.status.attempt}: {message}")
        b.notes.append(message)
    elif queue.exists is True and flagged:
        b.condition(
            ConditionType.ADMITTED,
            False,
            Reason.AWAITING_ADMISSION,
            f"JobSet {js.name} waits for Kueue to admit the whole group",
        )


def _succeed(b: _Builder, n: int, name: str) -> None:
    record = b.status.current
    if record is not None:
        b.replace_current(record.model_copy(update={"ended_at": b.now}))
    b.update(phase=Phase.SUCCEEDED)
    message = f"attempt {n}: JobSet {name} completed"
    b.condition(ConditionType.SUCCEEDED, True, Reason.JOB_SUCCEEDED, message)
    b.condition(ConditionType.RUNNING, False, Reason.JOB_SUCCEEDED, message)
    b.event(False, Reason.JOB_SUCCEEDED, message)
    b.notes.append(message)


def _end_record(b: _Builder, found: Classification) -> float | None:
    """Close the current attempt's record with the classification; detection seconds."""
    record = b.status.current
    if record is None:
        return None
    failed_at = found.failed_at
    detection = (b.now - failed_at).total_seconds() if failed_at is not None else None
    update = {
        "ended_at": b.now,
        "failure_class": found.failure_class,
        "failure_category": found.category,
        "first_failed": _first_failed(found),
        "evidence": _trim(found.evidence),
        "detection_seconds": round(max(detection, 0.0), 3) if detection is not None else None,
        "quarantined_nodes": sorted(
            {q.node for q in b.status.quarantined_nodes if q.attempt == record.attempt}
        ),
    }
    b.replace_current(record.model_copy(update=update))
    return detection


def _on_failure(b: _Builder, found: Classification, js: JobSetView | None) -> None:
    spec, n = b.rtj.spec, b.status.attempt
    action = decide(spec, b.status, found, b.now)
    name = jobset_name(b.rtj.metadata.name, n)
    if isinstance(action, Quarantine):
        if found.category is FailureCategory.USER:  # never blame a node for the user's code
            b.notes.append("refused to quarantine for a user-category failure")
            return
        taint = quarantine_taint(b.rtj)
        records = list(b.status.quarantined_nodes)
        for node in action.nodes:
            b.before.append(TaintNode(node, taint))
            records.append(
                QuarantinedNode(
                    node=node,
                    failure_class=action.failure_class,
                    attempt=n,
                    since=b.now,
                    evidence=(found.evidence[0] if found.evidence else "")[:MAX_EVIDENCE_CHARS],
                )
            )
        b.update(quarantined_nodes=records)
        nodes = ", ".join(action.nodes)
        b.condition(
            ConditionType.NODES_QUARANTINED,
            True,
            Reason.NODES_QUARANTINED,
            f"tainted {action.taint_key}={b.rtj.metadata.name}:{action.taint_effect} on {nodes}",
        )
        b.event(
            True,
            Reason.NODES_QUARANTINED,
            f"attempt {n}: tainted {nodes} "
            f"({action.taint_key}={b.rtj.metadata.name}:{action.taint_effect}); {_describe(found)}",
        )
        b.requeue_in(0.0)
        b.notes.append(action.message)
        return
    if isinstance(action, Restart):
        detection = _end_record(b, found)
        b.update(
            phase=Phase.RESTARTING,
            restarts=action.restarts,
            bad_steps=list(action.bad_steps),
            next_attempt_at=action.not_before,
        )
        b.condition(ConditionType.RESTARTING, True, action.reason, action.message)
        b.condition(ConditionType.RUNNING, False, action.reason, f"attempt {n} failed")
        b.condition(ConditionType.ADMITTED, False, action.reason, f"attempt {n} failed")
        if js is not None and not js.deleting:
            b.after.append(DeleteJobSet(name))
        _delete_pods(b, b.snap.pods)  # now, not after the JobSet's cascade (see DELETE_RESEND)
        b.event(True, action.reason, f"attempt {n}: {action.message}; {_describe(found)}")
        b.metrics.append(MetricRecord("failure", found.failure_class))
        b.metrics.append(MetricRecord("restart", found.failure_class))
        if detection is not None:
            b.metrics.append(MetricRecord("detection", found.failure_class, detection))
        b.requeue_in(action.backoff_seconds)
        b.notes.append(action.message)
        return
    if isinstance(action, Fail):
        detection = _end_record(b, found)
        b.update(phase=Phase.FAILED, next_attempt_at=None)
        b.condition(ConditionType.FAILED, True, action.reason, action.message)
        b.condition(ConditionType.RUNNING, False, action.reason, f"attempt {n} failed")
        b.event(True, action.reason, f"attempt {n}: {action.message}; {_describe(found)}")
        b.metrics.append(MetricRecord("failure", found.failure_class))
        if detection is not None:
            b.metrics.append(MetricRecord("detection", found.failure_class, detection))
        b.notes.append(action.message)
        return
    b.notes.append(f"no action: {getattr(action, 'message', action)}")


# --- snapshots from watch caches ------------------------------------------------------------


def plain(obj: Any) -> Any:
    """A deep copy as plain dicts and lists (watch bodies may be read-only mapping views)."""
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


_KEPT_METADATA = (
    "name", "namespace", "uid", "labels", "annotations",
    "deletionTimestamp", "creationTimestamp", "resourceVersion",
)  # fmt: skip


def _trim_meta(meta: Json, *extra: str) -> dict[str, Any]:
    return {k: plain(meta[k]) for k in (*_KEPT_METADATA, *extra) if k in meta}


def trim_pod(body: Json) -> dict[str, Any]:
    """The part of a pod the classifier and the planner read (indexes keep only this)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    return {
        "metadata": _trim_meta(meta, "deletionGracePeriodSeconds"),
        "spec": {"nodeName": spec["nodeName"]} if "nodeName" in spec else {},
        "status": plain(body.get("status") or {}),
    }


def trim_jobset(body: Json) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {
        "metadata": _trim_meta(meta),
        "spec": {"suspend": _get(body, "spec", "suspend")},
        "status": {"conditions": plain(_get(body, "status", "conditions") or [])},
    }


def trim_node(body: Json) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {
        "metadata": {
            k: plain(meta[k]) for k in ("name", "uid", "labels", "resourceVersion") if k in meta
        },
        "spec": {"taints": plain(_get(body, "spec", "taints") or [])},
        "status": {"conditions": plain(_get(body, "status", "conditions") or [])},
    }


def trim_event(body: Json) -> dict[str, Any]:
    keep = (
        "involvedObject",
        "regarding",
        "reason",
        "message",
        "note",
        "eventTime",
        "firstTimestamp",
        "lastTimestamp",
        "type",
    )
    out = {k: plain(body[k]) for k in keep if k in body}
    meta = body.get("metadata") or {}
    keep_meta = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
    out["metadata"] = {k: meta[k] for k in keep_meta if k in meta}
    return out


def with_store(snap: Snapshot, reading: StoreReading) -> Snapshot:
    return replace(snap, store=reading)


def with_queue(snap: Snapshot, reading: QueueReading) -> Snapshot:
    return replace(snap, queue=reading)
