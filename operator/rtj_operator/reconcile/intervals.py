"""`plannedIntervalSeconds: auto` and `fastTier.everySteps: auto` (issue 48): while the job
runs, put the intervals `policy.intervals.choose` picks into `status.checkpointIntervals`
(the progress poller hands the durable one to the trainers, `reconcile.pod_messages`; the
fast one goes with the next restart, `policy.fast_tier.fast_every` and the run order). Thin:
the inputs are the spec, the restart counts, the job's age, its step time and the ranks'
last reports; the choice is pure."""

from __future__ import annotations

from rtj_operator.api.reasons import Phase
from rtj_operator.policy import intervals
from rtj_operator.policy.intervals import FastTierUse, Measured
from rtj_operator.reconcile.builder import PlanBuilder
from rtj_shim.wire.save_costs import SaveTier


def choose_intervals(b: PlanBuilder) -> None:
    """Choose (or keep) the job's intervals; a job that sets its own has none."""
    checkpoint = b.rtj.spec.checkpoint
    tier = checkpoint.fast_tier
    if not checkpoint.auto_interval and not (tier is not None and tier.auto_every):
        if b.status.checkpoint_intervals is not None:
            b.update(checkpoint_intervals=None)
        return
    if b.status.phase not in (Phase.ADMITTED, Phase.RUNNING):
        return
    created = b.rtj.metadata.creation_timestamp
    exposure = max((b.now - created).total_seconds(), 0.0) / intervals.HOUR if created else 0.0
    readings = b.snap.ranks
    reports = readings.reports if readings and readings.attempt == b.status.attempt else ()
    progress = b.status.progress
    use: FastTierUse = "none" if tier is None else "auto" if tier.auto_every else "fixed"
    chosen = intervals.choose(
        b.snap.intervals,
        pods=b.status.world_size or b.rtj.spec.replicas,
        failures=intervals.work_losing_failures(b.status.restarts),
        exposure_hours=exposure,
        measured=Measured(
            durable_cost=intervals.save_cost(reports, SaveTier.DURABLE),
            fast_cost=intervals.save_cost(reports, SaveTier.FAST) if tier is not None else None,
            step_seconds=progress.step_seconds if progress is not None else None,
        ),
        current=b.status.checkpoint_intervals,
        now=b.now,
        fast_tier=use,
    )
    if chosen is not None:
        b.update(checkpoint_intervals=chosen)
