"""`status` of a ResilientTrainingJob: what happened, attempt by attempt, and why.

Status is written only by the operator. Unknown fields are ignored when reading it back so
that a field another tool adds (or a newer operator wrote) never makes the job unreadable.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from rtj_operator.api.attempts import AttemptRecord, InPlacePhase
from rtj_operator.api.base_status import StatusModel
from rtj_operator.api.intervals import CheckpointIntervals
from rtj_operator.api.ledger import MAX_RECOVERY_RECORDS, RecoveryRecord
from rtj_operator.api.reasons import FailureClass, Phase, RecoveryPhase


class Condition(StatusModel):
    """A metav1.Condition: the latest observation of one aspect of the job."""

    type: str = Field(
        min_length=1,
        max_length=316,
        description=(
            "Admitted, Running, Restarting, Complete, Succeeded (deprecated alias of Complete), "
            "Failed, NodesQuarantined, CheckpointStale, CheckpointUnreadable, NodesUnreachable, "
            "Stalled, Straggling or Suspended."
        ),
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        description="Why, in one CamelCase word (docs/operations.md lists them).",
    )
    message: str = Field(default="", max_length=32768, description="What happened, for people.")
    last_transition_time: datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The spec generation the condition was set from."
    )


class VerifiedCheckpoint(StatusModel):
    """The newest step known to verify (COMMITTED + manifest + checksums)."""

    step: int = Field(ge=0, description="The newest step whose manifest and files verify.")
    uri: str = Field(description="Its directory.")
    committed_at: datetime = Field(description="When the step was published (its age).")
    verified_at: datetime = Field(description="When the operator last verified it.")


class QuarantinedNode(StatusModel):
    """A node this job tainted, and the evidence that condemned it."""

    node: str = Field(description="The node's name.")
    failure_class: FailureClass
    attempt: int = Field(ge=1, description="The attempt whose failure quarantined it.")
    since: datetime = Field(description="When it was tainted.")
    evidence: str = Field(default="", description="The node signal that justified the taint.")
    taint_key: str | None = Field(
        default=None,
        max_length=317,
        description=(
            "The key of the taint the operator applied (and removes when the quarantine ends)."
        ),
    )
    """The taint placed (recorded so a later change of the taint settings never strands it;
    None in records written before it was recorded: the job's current settings apply)."""
    taint_value: str | None = Field(default=None, max_length=63, description="That taint's value.")
    taint_effect: str | None = Field(
        default=None, max_length=32, description="That taint's effect."
    )


class Straggler(StatusModel):
    """A rank slower than the others (busy time per step), as last reported."""

    rank: int = Field(ge=0, description="Its global rank.")
    pod: str = Field(description="Its pod.")
    node: str | None = Field(default=None, description="Its node.")
    ratio: float = Field(ge=0, description="Its busy time per step / the others' median.")
    attempt: int = Field(ge=1, description="The attempt it straggles in.")
    since: datetime = Field(description="When it was first seen straggling.")


class MisalignedResume(StatusModel):
    """The trainers' data alignment check after a resume named ranks whose losses left the
    ranks' spread before the fault (`rtj_shim.alignment`): they may have resumed reading
    their data at the wrong position. The tenant's word about its own ranks."""

    attempt: int = Field(ge=1, description="The attempt whose trainers resumed.")
    generation: int = Field(ge=0, description="The trainers' generation in it.")
    step: int = Field(ge=0, description="The step the check ran at.")
    ranks: list[Annotated[int, Field(ge=0)]] = Field(
        max_length=64, description="The global ranks named."
    )
    factors: list[Annotated[float, Field(ge=0)]] = Field(
        default_factory=list,
        max_length=64,
        description="Per rank named, its mean loss over the check's window as a factor of "
        "the other ranks'.",
    )


class JobProgress(StatusModel):
    """The job's progress from its ranks' reports (per job, not per rank; refreshed at most
    every 30 s while it changes, so the object stays small and writes stay rare)."""

    attempt: int = Field(ge=1, description="The attempt this progress belongs to.")
    step: int | None = Field(
        default=None, ge=0, description="The step every reporting rank has completed."
    )
    step_seconds: float | None = Field(default=None, ge=0, description="Median step time.")
    steps_per_second: float | None = Field(
        default=None, ge=0, description="Training throughput, from the median step time."
    )
    ranks: int = Field(default=0, ge=0, description="Ranks that reported.")
    observed_at: datetime = Field(description="When the ranks were last read.")
    stragglers: list[Straggler] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Ranks whose busy time per step stays above the others' median by "
            "spec.progress.stragglers' ratio."
        ),
    )
    fast_step: int | None = Field(
        default=None,
        ge=0,
        description="The newest fast-tier step every pod holds (spec.checkpoint.fastTier): "
        "what an in-place restart would resume from.",
    )
    fast_committed_at: datetime | None = Field(
        default=None, description="When every pod held fastStep (the fast tier's age)."
    )
    drained_step: int | None = Field(
        default=None,
        ge=0,
        description="The newest fast-tier step the drain made durable or left to the "
        "trainers' own save (spec.checkpoint.fastTier.drainEverySteps).",
    )
    misaligned_resume: MisalignedResume | None = Field(
        default=None,
        description="The ranks the data alignment check named after this attempt's newest "
        "resume (with a Warning Event ResumeMisaligned); null: none named.",
    )


class RestartCounts(StatusModel):
    """Restarts spent so far, per budget (explicit, so trimming `attempts` loses nothing)."""

    infrastructure: int = Field(
        default=0,
        ge=0,
        description=(
            "Restarts after infrastructure or unknown failures (spec.failurePolicy.maxRestarts "
            "bounds them)."
        ),
    )
    user: int = Field(
        default=0,
        ge=0,
        description=(
            "Restarts after the job's own failures: OutOfMemory, UserError, ConfigError "
            "(spec.failurePolicy.userErrorRestarts)."
        ),
    )
    preemption: int = Field(
        default=0,
        ge=0,
        description=(
            "Restarts after Kueue preempted the job (free unless "
            "spec.failurePolicy.countPreemptions)."
        ),
    )
    checkpoint: int = Field(
        default=0,
        ge=0,
        description="Restarts from an older step after the pinned checkpoint proved corrupt.",
    )
    preflight: int = Field(
        default=0,
        ge=0,
        description=(
            "New attempts after a pod failed the platform's preflight and its node was "
            "quarantined (free while each quarantines a new node)."
        ),
    )
    silent_data_corruption: int = Field(
        default=0,
        ge=0,
        description="Restarts after the trainers refused a suspect state "
        "(spec.failurePolicy.silentDataCorruptionRestarts bounds them).",
    )


class ResilientTrainingJobStatus(StatusModel):
    phase: Phase = Field(
        default=Phase.PENDING,
        description="Pending, Admitted, Running, Restarting, Suspended, Succeeded or Failed.",
    )
    recovery_phase: RecoveryPhase | None = Field(
        default=None,
        description="Where the job stands in the recovery state machine: NotStarted, Running, "
        "StoppingInPlace, StartingInPlace, BackingOff, Starting, Suspended, Succeeded or "
        "Failed (derived from the rest of status on every status write; docs/DESIGN.md has "
        "the transition table).",
    )
    workers: str | None = Field(
        default=None,
        max_length=16,
        pattern=r"^[0-9]+/[0-9]+$",
        description="The pods the trainers run as now / spec.replicas (`kubectl get`'s "
        "Workers column): fewer while spec.elastic keeps the job training shrunk (derived "
        "on every status write; null before the first attempt).",
    )
    attempt: int = Field(default=0, ge=0, description="Current attempt (0: none started).")
    attempts: list[AttemptRecord] = Field(
        default_factory=list, description="Every attempt, oldest first."
    )
    recoveries: list[RecoveryRecord] = Field(
        default_factory=list,
        max_length=MAX_RECOVERY_RECORDS,
        description="The recovery ledger: per recovery, newest first, when each phase ended "
        "(detected, decided, stopped, replacementReady, preflight, started, rendezvous, "
        "restored, firstStep) and the steps trained again (docs/operations.md#recovery-ledger).",
    )
    last_verified_checkpoint: VerifiedCheckpoint | None = None
    checkpoint_intervals: CheckpointIntervals | None = Field(
        default=None,
        description="The durable interval the operator chose and why "
        "(spec.checkpoint.plannedIntervalSeconds: auto).",
    )
    bad_steps: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        description="Steps the resume init container rejected; never pinned again.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    quarantined_nodes: list[QuarantinedNode] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["node"]},
        description="Nodes the operator has tainted for this job and not yet released.",
    )
    restarts: RestartCounts = Field(default_factory=RestartCounts)
    next_attempt_at: datetime | None = Field(
        default=None, description="Backoff: the next attempt starts no earlier than this."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="The latest observations, one per type (metav1.Condition).",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The spec generation this status reflects."
    )
    progress: JobProgress | None = None
    in_place: InPlacePhase | None = Field(
        default=None, description="The in-place restart in progress (spec.recovery.inPlace)."
    )
    trainer_generation: int = Field(
        default=0, ge=0, description="The trainers' generation: in-place restarts so far."
    )
    start_time: datetime | None = Field(
        default=None,
        description="When Kueue first admitted an attempt of the job (again after each "
        "resume): spec.activeDeadlineSeconds counts from it.",
    )

    @property
    def current(self) -> AttemptRecord | None:
        """The record of the attempt now running (or last run)."""
        return self.attempts[-1] if self.attempts else None

    @property
    def spare_ranks(self) -> dict[str, int]:
        """The current attempt's pods that serve another rank than their own: warm spares
        that took a replaced pod's rank (`AttemptRecord.spare_ranks`; `policy.spares`)."""
        record = self.current
        if record is None or record.attempt != self.attempt:
            return {}
        return dict(record.spare_ranks)

    @property
    def world_size(self) -> int | None:
        """The current attempt's world size once spec.elastic changed it (None: never)."""
        record = self.current
        if record is None or record.attempt != self.attempt:
            return None
        return record.world_size

    @property
    def attempt_generation(self) -> int:
        """The trainers' generation in the current attempt's pods: its newest in-place
        restart's, or 0 (a new attempt's pods start at 0 whatever `trainerGeneration`
        reached before)."""
        record = self.current
        if record is None or record.attempt != self.attempt or not record.in_place_restarts:
            return 0
        return record.in_place_restarts[-1].generation
