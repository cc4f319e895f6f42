"""`status.checkpointIntervals` (issue 48): the checkpoint intervals the operator chose for a
job with `spec.checkpoint.plannedIntervalSeconds: auto` or `fastTier.everySteps: auto`, and
what they were chosen from, so a user sees why the trainers save as often as they do
(`policy.intervals`)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from rtj_operator.api.base_status import StatusModel


class CheckpointIntervals(StatusModel):
    durable_seconds: int = Field(
        ge=1,
        description="Seconds of training between durable saves, handed to trainers whose "
        'Checkpointer follows the operator (every_seconds="auto").',
    )
    failures_per_hour: float = Field(
        ge=0,
        description="The failure rate it was chosen for: the platform's prior for a job of "
        "this size, moved toward the job's own failures as its hours accumulate.",
    )
    failures: int = Field(
        ge=0,
        description="The job's failures that cost it work so far (restarts after "
        "infrastructure, user and silent-data-corruption failures; not preemptions).",
    )
    exposure_hours: float = Field(ge=0, description="Hours since the job was created.")
    durable_save_seconds: float = Field(
        ge=0,
        description="What a durable save costs the training: the slowest rank's average "
        "seconds held by a save, as the trainers measured it (or the platform's assumption "
        "before any measurement, saveCostMeasured false).",
    )
    save_cost_measured: bool = Field(
        description="Whether durableSaveSeconds is the trainers' measurement."
    )
    fast_every_steps: int | None = Field(
        default=None,
        ge=1,
        description="Steps between fast-tier saves (`fastTier.everySteps: auto`), taking "
        "effect at each restart; null: no such tier, or no step time measured yet.",
    )
    fast_seconds: float | None = Field(
        default=None, ge=0, description="The fast interval in seconds of training."
    )
    fast_save_seconds: float | None = Field(
        default=None,
        ge=0,
        description="What a fast-tier save costs the training (the slowest rank's average, or "
        "the platform's assumption before a measurement).",
    )
    fast_save_cost_measured: bool | None = Field(
        default=None,
        description="Whether fastSaveSeconds is the trainers' measurement (null: no fast tier).",
    )
    fast_covers: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="The share of failures the fast tier recovers from (the platform's "
        "assumption); the durable interval is chosen against the rest.",
    )
    chosen_at: datetime = Field(description="When this interval was chosen.")
