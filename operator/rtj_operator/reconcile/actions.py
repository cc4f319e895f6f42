"""What a plan asks the thin I/O layer to do: the actions, in order, and the plan itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rtj_operator.api.ledger import LedgerPhase, RecoveryPath
from rtj_operator.api.reasons import FailureClass


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


@dataclass(frozen=True)
class CreateJobSet:
    body: Mapping[str, Any]


@dataclass(frozen=True)
class CreateKeySecret:
    """Create the job's key Secret (`policy.control_key`) unless it is there: before the
    first JobSet whose pods refer to it."""

    body: Mapping[str, Any]


@dataclass(frozen=True)
class DeleteJobSet:
    name: str


@dataclass(frozen=True)
class DeletePod:
    name: str
    grace_seconds: int | None = None
    """None: the pod's own grace period; 0: force (its node no longer exists)."""
    uid: str = ""
    """The pod's uid as the plan saw it: the applier remembers the delete by it."""


@dataclass(frozen=True)
class TaintNode:
    """Claim `taint` on the node for the job (placing the taint if the node lacks it)."""

    node: str
    taint: Mapping[str, str]
    job: str = ""
    """namespace/name of the claiming job."""
    uid: str = ""


@dataclass(frozen=True)
class UntaintNode:
    """Release the job's claim on `taint` (the taint goes with the last claim)."""

    node: str
    taint: Mapping[str, str]
    job: str = ""
    uid: str = ""


@dataclass(frozen=True)
class SetFinalizer:
    """Add (present) or remove a finalizer on the job itself."""

    name: str
    present: bool


@dataclass(frozen=True)
class DeleteJob:
    """Delete the job itself (spec.ttlSecondsAfterFinished): only the object with this uid
    (a job re-created under the same name is not touched), with foreground propagation
    (its JobSets and pods go before it), as the TTL-after-finished controller deletes a
    Job (kubernetes pkg/controller/ttlafterfinished/ttlafterfinished_controller.go)."""

    uid: str
    propagation: str = "Foreground"


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


KubeAction = (
    CreateKeySecret
    | CreateJobSet
    | DeleteJobSet
    | DeletePod
    | TaintNode
    | UntaintNode
    | SetFinalizer
    | PatchStatus
    | DeleteJob
)


Action = KubeAction | PostEvent


@dataclass(frozen=True)
class MetricRecord:
    """A metric to record once the plan has been applied: kind in failure, restart,
    detection, recovery, lost_steps, ledger_phase, steps_retrained."""

    kind: str
    failure_class: FailureClass | None = None
    value: float = 1.0
    phase: LedgerPhase | None = None
    path: RecoveryPath | None = None
    """ledger_phase and steps_retrained only: the recovery ledger's phase and path."""
    in_place: bool = False
    """A restart only: the trainers restarted in their pods (rtj_restarts_total's
    scope="in_place") rather than a new attempt of every pod (scope="world")."""


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
