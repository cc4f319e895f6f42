"""The observed world one reconcile decides from: the job's JobSets, pods, nodes and events
as the watch caches hold them, and the latest checkpoint-store and LocalQueue readings."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from rtj_operator.api import keys
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.policy import progress as rank_progress
from rtj_operator.policy.intervals import IntervalPolicy
from rtj_operator.policy.liveness import NodeLease
from rtj_operator.policy.observed import ReadOnce, parse_time
from rtj_operator.policy.platform import NodeHealthPolicy
from rtj_operator.policy.preflight import PreflightPolicy
from rtj_operator.policy.stragglers import Straggler
from rtj_operator.selection import (
    Selection,
)
from rtj_shim.wire.supervisor_report import SupervisorReport

Json = Mapping[str, Any]


def get_in(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def attempt_of(obj: Json) -> int | None:
    """The attempt label of a JobSet or pod (None: not labelled)."""
    value = get_in(obj, "metadata", "labels", keys.ATTEMPT_LABEL)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def pod_name(pod: Json) -> str:
    return str(get_in(pod, "metadata", "name"))


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
    uid: str = ""
    owner_uid: str | None = None
    """The uid of the ResilientTrainingJob that controls it (None: no such ownerReference)."""


def controller_uid(obj: Json, api_version: str, kind: str) -> str | None:
    """The uid in `obj`'s controller ownerReference if it is of this apiVersion and kind."""
    for ref in get_in(obj, "metadata", "ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            if ref.get("apiVersion") == api_version and ref.get("kind") == kind:
                return str(ref.get("uid") or "") or None
            return None
    return None


def trusted_pod(pod: Json, jobset_uids: Collection[str]) -> bool:
    """Whether a pod is evidence about this job: a Job controls it, and the JobSet the JobSet
    controller labelled it with (by uid) is one this job owns. A pod labelled for the job
    by anyone else (a bare pod, a Job of the tenant's own) is not evidence; neither is a pod
    of an earlier job of the same name (its JobSet had another owner uid)."""
    if controller_uid(pod, "batch/v1", "Job") is None:
        return False
    return get_in(pod, "metadata", "labels", keys.JOBSET_UID_LABEL) in jobset_uids


def read_jobset(raw: Json) -> JobSetView:
    conditions = get_in(raw, "status", "conditions") or []
    true = {
        c.get("type"): c for c in conditions if isinstance(c, Mapping) and c.get("status") == "True"
    }
    failed = true.get("Failed")
    step = get_in(raw, "metadata", "annotations", keys.RESUME_STEP_ANNOTATION)
    name = get_in(raw, "metadata", "name") or ""
    return JobSetView(
        name=name,
        attempt=attempt_of(raw),
        deleting=get_in(raw, "metadata", "deletionTimestamp") is not None,
        suspended=bool(get_in(raw, "spec", "suspend")),
        created_at=parse_time(get_in(raw, "metadata", "creationTimestamp")),
        resume_step=int(step) if isinstance(step, str) and step.isdigit() else None,
        completed="Completed" in true,
        failed=failed is not None,
        failed_at=parse_time(failed.get("lastTransitionTime")) if failed else None,
        failure_message=str(failed.get("message", "")) if failed else "",
        queue_name=get_in(raw, "metadata", "labels", keys.KUEUE_QUEUE_LABEL),
        uid=str(get_in(raw, "metadata", "uid") or ""),
        owner_uid=controller_uid(raw, keys.API_VERSION, keys.KIND),
    )


@dataclass(frozen=True)
class StoreReading:
    """The latest reading of an s3:// checkpoint store: a selection, or why it failed.

    `read_at` is when the read *started* (anything published later may be missing from it)
    and `excluded` the steps it was told were bad. A reading is only good for a job whose
    `badSteps` it excluded: `badSteps` grows when a pinned step fails verification, and a
    read that started before that (a background refresh racing the failure's status patch)
    may still select the step just marked bad.
    """

    read_at: datetime
    selection: Selection | None = None
    error: str | None = None
    excluded: frozenset[int] = frozenset()

    def covers(self, bad_steps: Iterable[int]) -> bool:
        """Whether this reading excluded every step in `bad_steps` (and so selected none)."""
        bad = set(bad_steps)
        picked = self.selection.step if self.selection is not None else None
        return bad <= self.excluded and picked not in bad


@dataclass(frozen=True)
class AcceptedDelete:
    """A pod delete the API server accepted (or answered 404: already gone), as the applier
    remembers it until the pod leaves the watch cache."""

    uid: str
    grace_seconds: int | None

    def covers(self, uid: str, grace_seconds: int | None) -> bool:
        """Whether sending this delete again would change nothing: the same pod, and no
        force now wanted where the accepted one was graceful."""
        return self.uid == uid and (self.grace_seconds == 0 or grace_seconds != 0)


@dataclass(frozen=True)
class Rejection:
    """The API server (or an admission webhook) refused to create this JobSet for this
    generation of the job: the same render would be refused again."""

    jobset: str
    generation: int
    message: str


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
class PollTarget:
    """One worker pod whose progress server the poller reads."""

    pod: str
    ip: str
    port: int
    attempt: int
    index: int | None = None
    """The rank it serves: its completion index, or the rank a restart gave a spare (None:
    not annotated, or idle)."""
    node: str | None = None
    idle: bool = False
    """A warm spare, or a pod whose rank a spare took: held, serving no rank (`policy.spares`)."""
    sealed: bool = False
    """Its sidecar was rendered to seal its answers (``RTJ_SEALED_ANSWERS``): only an answer
    carrying its seal is its own (`rtj_shim.wire.answer_seal`)."""


CONTROL_PATH = "/control"
"""Where a pod's progress sidecar takes restart orders (rtj_shim.wire.control)."""
REPLICA_PATH = "/replica"
"""Where it takes its peer-replica assignment (rtj_shim.fast.peer_replica)."""
DRAIN_PATH = "/drain"
"""Where the sidecar of the pod holding rank 0 takes its drain order (rtj_shim.wire.drain_order)."""
INTERVALS_PATH = "/intervals"
"""Where each sidecar takes the checkpoint interval `auto` chose (rtj_shim.wire.interval_order)."""


@dataclass(frozen=True)
class PollMessage:
    """A signed message the poller posts to a pod's progress sidecar before reading it
    (``POST <path>``, header ``X-RTJ-Signature``; 202: accepted)."""

    path: str
    body: bytes
    signature: str
    standing: bool = False
    """An order the pod's report already shows carried out (a restart's stop or run, an idle
    pod's hold or finish): posted whenever the pod is read, at the usual pace; only orders
    still to be carried out bring the rounds close together (`reconcile.pod_messages`)."""


@dataclass(frozen=True)
class RankReadings:
    """What the job's progress servers last answered (kept in memory by the poller).

    `received_at` of every report and `polled_at` are Unix seconds on the operator's clock
    (the one `Snapshot.now` comes from)."""

    attempt: int
    reports: tuple[rank_progress.PodReport, ...]
    polled_at: float
    unanswered: tuple[str, ...] = ()
    """Pods polled in the last round whose server did not answer (and why)."""
    quiet_since: Mapping[str, float] = field(default_factory=dict)
    """Pods that answered earlier in this attempt but not in the last round: when the first
    poll of their current run of failures went unanswered (one of two signals of a node
    gone silent, `policy.liveness.silent_since`)."""
    stragglers: tuple[Straggler, ...] = ()
    supervisors: Mapping[str, SupervisorReport] = field(default_factory=dict)
    """Per pod, what its supervisor last reported (spec.recovery.inPlace): generation,
    state, exit code, fast-tier holdings (`rtj_shim.wire.supervisor_report`)."""
    fast_tiers: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    """Per pod, the newest fast-tier step every rank holds and when (spec.checkpoint.fastTier;
    `policy.fast_tier.summary`)."""
    replicas: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    """Per pod, the peer replica its sidecar keeps (spec.checkpoint.fastTier.peerReplicas):
    the source's index and address, the steps held, the last pull error; None: none."""
    drains: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    """Per pod, the drain its sidecar runs (spec.checkpoint.fastTier.drainEverySteps; the
    pod holding rank 0): the order followed, the last step drained, the error; None: none."""
    indexes: Mapping[str, int] = field(default_factory=dict)
    """Per polled pod, its completion index."""


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
    node_health: NodeHealthPolicy = field(default_factory=NodeHealthPolicy)
    """The platform's node-health policy (operator configuration): what the job may narrow."""
    node_leases: Mapping[str, NodeLease] = field(default_factory=dict)
    """The Leases (kube-node-lease) of the job's nodes: when each kubelet last renewed."""
    partition: bool = False
    """Most nodes with a Lease are silent at once (the controller counts them all)."""
    rejection: Rejection | None = None
    """The last JobSet create the API server refused (422, or an admission webhook)."""
    gone_jobsets: tuple[Json, ...] = ()
    """JobSets of this job deleted while the operator watched (their uids keep the pods of an
    attempt whose JobSet is gone trusted as evidence)."""
    resolver_image: str | None = None
    """The platform's default image for the resume init container and progress sidecar."""
    preflight: PreflightPolicy = field(default_factory=PreflightPolicy)
    """The platform's preflight (its image, None: resolver_image; its node-local command)."""
    intervals: IntervalPolicy = field(default_factory=IntervalPolicy)
    """The platform's prior and bounds for `plannedIntervalSeconds: auto`."""
    control_key: str | None = None
    """This job's key for signing restart orders (from the operator's control secret and
    the job's uid); None: the operator has no control secret, nothing restarts in place."""
    ranks: RankReadings | None = None
    """The current attempt's progress reports (the progress poller's last round)."""
    deleted_nodes: frozenset[str] = frozenset()
    """Nodes of these pods seen deleted (a watch DELETED or absent from a LIST): positive
    evidence the machine is gone, unlike a node the cache merely lacks."""
    read_once: ReadOnce | None = None
    """The views of the pods and nodes above already read, kept by the operator across plans
    (its watch cache never edits an object in place); None: every plan reads them again."""
    accepted_deletes: Mapping[str, AcceptedDelete] = field(default_factory=dict)
    """Pods of `pods` whose delete the API server already accepted (by name; the operator's
    memory, `plan_apply.PlanApplier.accepted`): not deleted again while the watch cache has
    not caught up with them (at 1,250 pods it lags by tens of seconds)."""


def preflight_image(snap: Snapshot) -> str | None:
    """The image the job's preflight runs (the platform's); None: the job has no preflight
    (disabled, or the platform has no image for it)."""
    if not snap.rtj.spec.preflight.enabled:
        return None
    return snap.preflight.image_for(snap.resolver_image)


def with_store(snap: Snapshot, reading: StoreReading) -> Snapshot:
    return replace(snap, store=reading)


def with_queue(snap: Snapshot, reading: QueueReading) -> Snapshot:
    return replace(snap, queue=reading)


def owned_jobset_uids(snap: Snapshot) -> frozenset[str]:
    """The uids of the JobSets, live or deleted, that this job (by uid) controls."""
    uid = snap.rtj.metadata.uid
    return frozenset(
        v.uid
        for v in map(read_jobset, (*snap.jobsets, *snap.gone_jobsets))
        if uid and v.uid and v.owner_uid == uid
    )
