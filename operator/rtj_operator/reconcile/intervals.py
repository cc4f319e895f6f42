"""`plannedIntervalSeconds: auto` (issue 48): while the job runs, put the durable interval
`policy.intervals.choose` picks into `status.checkpointIntervals` (the progress poller hands
it to the trainers, `reconcile.pod_messages`). Thin: the inputs are the spec, the restart
counts, the job's age and the ranks' last reports; the choice is pure."""

from __future__ import annotations

from rtj_operator.api.reasons import Phase
from rtj_operator.policy import intervals
from rtj_operator.reconcile.builder import PlanBuilder


def choose_intervals(b: PlanBuilder) -> None:
    """Choose (or keep) the job's interval; a job that sets its own seconds has none."""
    if not b.rtj.spec.checkpoint.auto_interval:
        if b.status.checkpoint_intervals is not None:
            b.update(checkpoint_intervals=None)
        return
    if b.status.phase not in (Phase.ADMITTED, Phase.RUNNING):
        return
    created = b.rtj.metadata.creation_timestamp
    exposure = max((b.now - created).total_seconds(), 0.0) / intervals.HOUR if created else 0.0
    readings = b.snap.ranks
    current = readings is not None and readings.attempt == b.status.attempt
    chosen = intervals.choose(
        b.snap.intervals,
        pods=b.status.world_size or b.rtj.spec.replicas,
        failures=intervals.work_losing_failures(b.status.restarts),
        exposure_hours=exposure,
        measured_cost=intervals.durable_cost(readings.reports) if current and readings else None,
        current=b.status.checkpoint_intervals,
        now=b.now,
    )
    if chosen is not None:
        b.update(checkpoint_intervals=chosen)
