"""The per-attempt records of a ResilientTrainingJob's status: each attempt (one JobSet),
the restarts in place inside it, the one in progress, and the rank that failed first.
Written only by the operator, read back ignoring unknown fields (`StatusModel`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field

from rtj_operator.api.base_status import StatusModel
from rtj_operator.api.keys import MAX_REPLICAS
from rtj_operator.api.reasons import FailureCategory, FailureClass, InPlaceStage

MAX_FAST_SOURCES = 64
"""Pods served from a peer replica in one in-place restart (at most the replaced pods)."""
MAX_FALLBACK_LENGTH = 512


class FirstFailed(StatusModel):
    """The rank whose failure broke the world (earliest termination, not the timeouts after)."""

    pod: str = Field(description="The worker pod that failed first.")
    rank: int | None = Field(default=None, ge=0, description="Global rank if the trainer named it.")
    node_rank: int | None = Field(default=None, ge=0, description="Job completion index.")
    node: str | None = Field(default=None, description="The node it ran on.")
    container: str | None = Field(default=None, description="The container that failed.")
    exit_code: int | None = Field(
        default=None, description="Its exit code (128+N: killed by signal N)."
    )
    finished_at: datetime | None = Field(
        default=None, description="When it failed (the kubelet's time, in seconds)."
    )
    suspect: bool = Field(
        default=False,
        description="Named by the trainers' verdict on a suspect state (SilentDataCorruption): "
        "the rank whose replicated state diverged from the others' or whose loss left its "
        "distribution, not the first to exit. The job's later attempts avoid its node; the "
        "trainers' word taints it for no one else.",
    )


class InPlaceRestart(StatusModel):
    """One restart inside the attempt's pods (spec.recovery.inPlace): what failed, and how
    the pods' trainers were stopped and started again."""

    generation: int = Field(ge=1, description="The trainers' generation it started.")
    failure_class: FailureClass | None = Field(
        default=None, description="What failed (null for a grow-back, which no failure began)."
    )
    failure_category: FailureCategory | None = None
    world_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICAS,
        description="The pods the new generation trains on when it changed them (spec.elastic): "
        "fewer than spec.replicas after a shrink, more after a grow-back.",
    )
    first_failed: FirstFailed | None = None
    evidence: list[str] = Field(
        default_factory=list, description="The signals that decided the class, one per line."
    )
    detected_at: datetime = Field(description="When the operator saw the failure.")
    resumed_from_step: int | None = Field(
        default=None, ge=0, description="Pinned step (null: the restored trainer resolved it)."
    )
    resumed_from_fast_step: int | None = Field(
        default=None,
        ge=0,
        description="Pinned fast-tier step every pod held (spec.checkpoint.fastTier): the "
        "trainers resumed from it when every rank verified it, else from resumedFromStep.",
    )
    fast_sources: dict[str, Annotated[str, Field(max_length=64)]] = Field(
        default_factory=dict,
        max_length=MAX_FAST_SOURCES,
        description="Per completion index of a pod that did not hold resumedFromFastStep "
        "itself (a replaced pod), the progress sidecar (ip:port) of the pod holding its "
        "peer replica, from which it copied the step (spec.checkpoint.fastTier.peerReplicas).",
    )
    fast_tier_fallback: str | None = Field(
        default=None,
        max_length=MAX_FALLBACK_LENGTH,
        description="Why no fast-tier step was pinned though the pods keep a fast tier (e.g. "
        "a replaced pod holds none and no pod holds its replica): the durable step was.",
    )
    fast_every_steps: int | None = Field(
        default=None,
        ge=1,
        description="The fast tier's interval the restarted trainers save at "
        "(fastTier.everySteps: auto); null: the pods' own.",
    )
    replaced: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Pods replaced (`<pod> on <node>`): deleted, and created again by their Job "
        "on another node (spec.recovery.inPlaceMaxReplacedPods); the others restarted in place.",
    )
    spares: list[Annotated[str, Field(max_length=512)]] = Field(
        default_factory=list,
        max_length=64,
        description="Warm spares that took a replaced pod's rank (spec.spares): `<spare> on "
        "<node> took rank <r> of <pod>`. Without a ready spare, the Job created the pod again.",
    )
    stopped_at: datetime | None = Field(
        default=None, description="When every trainer of the old generation had stopped."
    )
    started_at: datetime | None = Field(
        default=None, description="When the new generation was ordered to run."
    )
    outcome: str | None = Field(
        default=None,
        max_length=64,
        description="Running (every pod runs the new generation) or FellBack (the deadline "
        "passed: the whole world was re-created).",
    )


class InPlacePhase(StatusModel):
    """An in-place restart in progress: every pod is ordered to `Stopping` the old
    generation, then (all stopped) to `Starting` the new one."""

    generation: int = Field(ge=1, description="The trainers' generation being started.")
    phase: InPlaceStage = Field(
        description="Stopping (the old generation) or Starting (the new one, from `step`)."
    )
    since: datetime = Field(description="When this phase began.")
    step: int | None = Field(
        default=None,
        ge=0,
        description="The durable step the restart resumes from (none: the newest that verifies).",
    )
    fast_step: int | None = Field(
        default=None,
        ge=0,
        description="The fast-tier step every pod holds, pinned beside `step` (the fallback).",
    )
    fast_lineage: str | None = Field(
        default=None,
        max_length=16,
        pattern="^[0-9a-f]{16}$",
        description="The history (rtj_shim lineage id) fastStep is pinned in: every pod holds "
        "the step in it, and the run order names it, so a trainer restores no other "
        "history's copy of the step number.",
    )
    fast_sources: dict[str, Annotated[str, Field(max_length=64)]] = Field(
        default_factory=dict,
        max_length=MAX_FAST_SOURCES,
        description="Per completion index (as a string) of a pod that does not hold fastStep "
        "itself, the progress sidecar (ip:port) of the pod holding its peer replica: the run "
        "order to that pod names it (fast_source), and the pod copies the step from there.",
    )
    replacing: list[Annotated[str, Field(max_length=253)]] = Field(
        default_factory=list,
        max_length=64,
        description="Pods being replaced: deleted and not counted; their Job creates them again.",
    )
    replaced_ranks: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        max_length=64,
        description="The ranks the pods being replaced served (their replacement or a warm "
        "spare takes each).",
    )
    world_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICAS,
        description="The world the new generation forms when it changes (spec.elastic: a "
        "shrink or a grow-back; its run orders name each pod's rank in it); null: unchanged.",
    )
    fast_every_steps: int | None = Field(
        default=None,
        ge=1,
        description="The fast tier's interval the new generation saves at "
        "(`fastTier.everySteps: auto`, pinned when the restart starts it); null: the pods' own.",
    )


class AttemptRecord(StatusModel):
    """One attempt (one JobSet): how it started, how it ended, what it cost."""

    attempt: int = Field(ge=1, description="Attempt number, from 1.")
    job_set: str = Field(description="The JobSet the attempt ran as (<name>-a<attempt>).")
    started_at: datetime | None = Field(default=None, description="When its JobSet was created.")
    ended_at: datetime | None = Field(
        default=None, description="When it ended: failed, succeeded or replaced."
    )
    failure_class: FailureClass | None = None
    failure_category: FailureCategory | None = None
    first_failed: FirstFailed | None = None
    evidence: list[str] = Field(
        default_factory=list,
        description="The signals that decided its failure class, one per line.",
    )
    resumed_from_step: int | None = Field(
        default=None, ge=0, description="The checkpoint step it resumed from (none: a fresh start)."
    )
    lost_steps: int | None = Field(
        default=None,
        ge=0,
        description="Steps trained after the newest durable checkpoint, lost to its failure.",
    )
    detection_seconds: float | None = Field(
        default=None, ge=0, description="From the first failure to its classification."
    )
    recovery_seconds: float | None = Field(
        default=None,
        ge=0,
        description="From the first failure until the next attempt's workers all ran.",
    )
    quarantined_nodes: list[str] = Field(
        default_factory=list, description="Nodes tainted because of this attempt's failure."
    )
    in_place_restarts: list[InPlaceRestart] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Trainer restarts in place within this attempt (spec.recovery.inPlace), oldest first."
        ),
    )
    spare_ranks: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict,
        max_length=MAX_REPLICAS,
        description="Which pod serves which rank where it is not the pod's own (spec.spares): "
        "a warm spare that took a replaced pod's rank in an in-place restart. A worker pod "
        "whose rank a spare took serves none (the pod its Job creates again is a spare).",
    )
    world_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICAS,
        description="The pods the trainers run as once spec.elastic changed the world: fewer "
        "than spec.replicas while shrunk, spec.replicas after a grow-back (the pods' ranks "
        "and world size then travel in every run order); null: spec.replicas, never changed.",
    )
    end_reason: str | None = Field(
        default=None,
        max_length=64,
        description="Why the attempt ended when no failure of its own ended it: Suspended "
        "(spec.suspend) or DeadlineExceeded (spec.activeDeadlineSeconds).",
    )
