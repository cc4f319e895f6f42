"""The recovery ledger's histograms (issue 48; `api.ledger`): each phase of every completed
recovery, and the steps it trained again, by recovery path. Cluster-wide like
rtj_recovery_seconds (no job labels: a histogram per job would grow without bound)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from rtj_operator.api.ledger import LedgerPhase, RecoveryPath

PHASE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
STEP_BUCKETS = (0, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class LedgerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.phase = Histogram(
            "rtj_recovery_phase_seconds",
            "Per phase of each completed recovery (status.recoveries): from the end of the "
            "phase before it to its own end; a recovery's phases sum to its onset-to-first-"
            "step time.",
            ("phase", "path"),
            buckets=PHASE_BUCKETS,
            registry=registry,
        )
        self.retrained = Histogram(
            "rtj_recovery_steps_retrained",
            "Per completed recovery: the step every rank had completed at the failure minus "
            "the step the trainers restored (work done twice).",
            ("path",),
            buckets=STEP_BUCKETS,
            registry=registry,
        )

    def record_phase(self, phase: LedgerPhase, path: RecoveryPath, seconds: float) -> None:
        self.phase.labels(phase.value, path.value).observe(max(seconds, 0.0))

    def record_retrained(self, path: RecoveryPath, steps: int) -> None:
        self.retrained.labels(path.value).observe(max(steps, 0))
