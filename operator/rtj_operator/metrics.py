"""Prometheus metrics: definitions, `record_*` helpers, and per-job gauges read from status.

Per-job gauges (checkpoint age, planned interval, last verified step, quarantined nodes)
and `rtj_jobs{phase}` are not set imperatively: a collector renders them at scrape time
from the latest status of every job the operator knows, so a deleted job's series vanish
with it and nothing is ever stale. Counters and histograms are recorded when a decision
has been applied (after its status patch succeeded), so a conflict or a crash before the
patch never counts a restart twice in one process.

The registry is injectable: tests build `Metrics(CollectorRegistry())` and read samples.
"""

from __future__ import annotations

import contextlib
import platform
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rtj_operator import __version__
from rtj_operator.api.reasons import FailureClass, Phase, Reason
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.metric_labels import JOB_LABELS
from rtj_operator.metrics_elastic import WorldFacts, world_facts, world_families
from rtj_operator.metrics_ledger import LedgerMetrics
from rtj_operator.policy.intervals import IntervalPolicy, planned_seconds

RESTART_SCOPES = ("world", "in_place")
"""The `scope` label of rtj_restarts_total: a whole-world restart (a new attempt, every pod
recreated) or a restart in place (spec.recovery: trainers restarted in their pods)."""
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


@dataclass(frozen=True)
class JobFacts:
    """What the per-job gauges show, read from one job's spec and status."""

    phase: Phase
    planned_interval_seconds: float
    last_success_timestamp: float | None
    last_verified_step: int | None
    quarantined_nodes: int
    max_restarts: int
    infrastructure_restarts: int
    running_since: float | None = None
    fast_step: int | None = None
    fast_timestamp: float | None = None
    """The fast checkpoint tier (spec.checkpoint.fastTier): its newest step every pod holds
    and when; the checkpoint-age alert stays on the durable tier."""
    failed_category: str | None = None
    """While Failed: the category of the failure that ended the job (user, infrastructure,
    ...), so the alert pages for what the platform must fix and warns for the user's code."""
    world: WorldFacts | None = None
    """While Running: the world the trainers run as (spec.elastic)."""


def _running_since(rtj: ResilientTrainingJob) -> float | None:
    """When the current attempt's workers all started running (None: not Running)."""
    if rtj.status.phase is not Phase.RUNNING:
        return None
    running = next(
        (c for c in rtj.status.conditions if c.type == "Running" and c.status == "True"), None
    )
    return running.last_transition_time.timestamp() if running is not None else None


def _failed_category(rtj: ResilientTrainingJob) -> str | None:
    if rtj.status.phase is not Phase.FAILED:
        return None
    failed = next((c for c in rtj.status.conditions if c.type == "Failed"), None)
    if failed is not None and failed.reason == Reason.DEADLINE_EXCEEDED.value:
        return "user"  # the job's own activeDeadlineSeconds, whatever failed before it
    record = rtj.status.current
    category = record.failure_category if record is not None else None
    return category.value if category is not None else "unknown"


def job_facts(rtj: ResilientTrainingJob) -> JobFacts:
    status = rtj.status
    ckpt = status.last_verified_checkpoint
    # the checkpoint age is known only where the operator reads the store (s3://): for a
    # file:// root it knows the resumed step, not the steps published since, so no timestamp
    # the age alert would misread is exported
    ages = rtj.spec.checkpoint.uri.startswith("s3://")
    return JobFacts(
        phase=status.phase,
        planned_interval_seconds=float(
            planned_seconds(
                rtj.spec.checkpoint.planned_interval_seconds,
                status.checkpoint_intervals,
                IntervalPolicy.max_seconds,  # `auto` before its first choice: no early alert
            )
        ),
        last_success_timestamp=ckpt.committed_at.timestamp() if ckpt is not None and ages else None,
        last_verified_step=ckpt.step if ckpt is not None else None,
        quarantined_nodes=len(status.quarantined_nodes),
        max_restarts=rtj.spec.failure_policy.max_restarts,
        infrastructure_restarts=status.restarts.infrastructure,
        running_since=_running_since(rtj) if ages else None,
        failed_category=_failed_category(rtj),
        world=world_facts(rtj),
        fast_step=status.progress.fast_step if status.progress is not None else None,
        fast_timestamp=(
            status.progress.fast_committed_at.timestamp()
            if status.progress is not None and status.progress.fast_committed_at is not None
            else None
        ),
    )


class _JobsCollector(Collector):
    def __init__(self, facts: dict[tuple[str, str], JobFacts], lock: threading.Lock) -> None:
        self._facts = facts
        self._lock = lock

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            items = sorted(self._facts.items())
        last = GaugeMetricFamily(
            "rtj_checkpoint_last_success_timestamp_seconds",
            "When the newest verified checkpoint was published (Unix time).",
            labels=JOB_LABELS,
        )
        planned = GaugeMetricFamily(
            "rtj_checkpoint_planned_interval_seconds",
            "Planned seconds between checkpoints (spec.checkpoint.plannedIntervalSeconds, or "
            "what `auto` chose: status.checkpointIntervals.durableSeconds).",
            labels=JOB_LABELS,
        )
        step = GaugeMetricFamily(
            "rtj_checkpoint_last_verified_step",
            "Step of the newest verified checkpoint.",
            labels=JOB_LABELS,
        )
        fast_step = GaugeMetricFamily(
            "rtj_checkpoint_fast_last_step",
            "Newest fast-tier step every pod holds (spec.checkpoint.fastTier): what a restart "
            "in place resumes from.",
            labels=JOB_LABELS,
        )
        fast_last = GaugeMetricFamily(
            "rtj_checkpoint_fast_last_success_timestamp_seconds",
            "When every pod held the newest fast-tier step (Unix time).",
            labels=JOB_LABELS,
        )
        since = GaugeMetricFamily(
            "rtj_job_running_since_timestamp_seconds",
            "When the current attempt's workers were all running (Unix time; only while "
            "Running). The checkpoint-age alert counts from it when no verified checkpoint is "
            "newer, so a job that never checkpoints still alerts.",
            labels=JOB_LABELS,
        )
        failed = GaugeMetricFamily(
            "rtj_job_failed",
            "1 while the job is Failed, labelled with the category of the failure that ended "
            "it (user: the job's own code or config; infrastructure, checkpoint, unknown).",
            labels=(*JOB_LABELS, "category"),
        )
        quarantined = GaugeMetricFamily(
            "rtj_quarantined_nodes", "Nodes this job has quarantined (tainted).", labels=JOB_LABELS
        )
        jobs = GaugeMetricFamily("rtj_jobs", "ResilientTrainingJobs by phase.", labels=("phase",))
        job_phase = GaugeMetricFamily(
            "rtj_job_phase",
            "1 for the job's current phase, 0 for the others (kube-state-metrics style).",
            labels=(*JOB_LABELS, "phase"),
        )
        budget_max = GaugeMetricFamily(
            "rtj_restart_budget_max",
            "Whole-group restarts allowed for infrastructure failures (maxRestarts).",
            labels=JOB_LABELS,
        )
        budget_left = GaugeMetricFamily(
            "rtj_restart_budget_remaining",
            "Infrastructure restarts left before the job fails.",
            labels=JOB_LABELS,
        )
        by_phase = {phase: 0 for phase in Phase}
        for (namespace, name), facts in items:
            labels = [namespace, name]
            by_phase[facts.phase] += 1
            for phase in Phase:
                job_phase.add_metric([*labels, phase.value], float(phase is facts.phase))
            budget_max.add_metric(labels, facts.max_restarts)
            budget_left.add_metric(
                labels, max(0, facts.max_restarts - facts.infrastructure_restarts)
            )
            planned.add_metric(labels, facts.planned_interval_seconds)
            quarantined.add_metric(labels, facts.quarantined_nodes)
            if facts.last_success_timestamp is not None:
                last.add_metric(labels, facts.last_success_timestamp)
            if facts.last_verified_step is not None:
                step.add_metric(labels, facts.last_verified_step)
            if facts.running_since is not None:
                since.add_metric(labels, facts.running_since)
            if facts.fast_step is not None:
                fast_step.add_metric(labels, facts.fast_step)
            if facts.fast_timestamp is not None:
                fast_last.add_metric(labels, facts.fast_timestamp)
            if facts.failed_category is not None:
                failed.add_metric([*labels, facts.failed_category], 1.0)
        for phase, count in by_phase.items():
            jobs.add_metric([phase.value], count)
        yield from (last, planned, step, since, failed, quarantined, jobs, job_phase, budget_max)
        yield budget_left
        yield from (fast_step, fast_last)
        yield from world_families((key, facts.world) for key, facts in items)


@dataclass(frozen=True)
class ProgressFacts:
    """One job's progress as its ranks last reported it (the progress poller's round)."""

    step: int | None
    step_seconds: float | None
    seconds_without_progress: float | None
    ranks: int
    stragglers: int
    fast_replicated_step: int | None = None
    """The newest fast-tier step whose peer replica every pod has complete in another pod
    (spec.checkpoint.fastTier.peerReplicas): what a replaced pod could copy back."""
    drained_step: int | None = None
    """The newest fast-tier step the drain has made durable, or left to the trainers' own
    save (spec.checkpoint.fastTier.drainEverySteps)."""


class _ProgressCollector(Collector):
    def __init__(self, facts: dict[tuple[str, str], ProgressFacts], lock: threading.Lock) -> None:
        self._facts = facts
        self._lock = lock

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            items = sorted(self._facts.items())
        step = GaugeMetricFamily(
            "rtj_job_progress_step",
            "The step every reporting rank of the job has completed (progress reports).",
            labels=JOB_LABELS,
        )
        step_time = GaugeMetricFamily(
            "rtj_job_step_seconds", "Median step time of the job's ranks.", labels=JOB_LABELS
        )
        age = GaugeMetricFamily(
            "rtj_job_progress_age_seconds",
            "Seconds since the rank furthest behind last made progress (entered a section or "
            "completed a step): what a hang is judged on.",
            labels=JOB_LABELS,
        )
        ranks = GaugeMetricFamily(
            "rtj_job_ranks_reporting", "Ranks with a fresh progress report.", labels=JOB_LABELS
        )
        slow = GaugeMetricFamily(
            "rtj_job_stragglers", "Ranks reported as stragglers.", labels=JOB_LABELS
        )
        replicated = GaugeMetricFamily(
            "rtj_checkpoint_fast_replicated_step",
            "Newest fast-tier step whose peer replica every pod has complete in another pod "
            "(spec.checkpoint.fastTier.peerReplicas): what a replaced pod resumes from.",
            labels=JOB_LABELS,
        )
        drained = GaugeMetricFamily(
            "rtj_checkpoint_drained_step",
            "Newest fast-tier step the drain has made durable, or left to the trainers' own "
            "durable save (spec.checkpoint.fastTier.drainEverySteps).",
            labels=JOB_LABELS,
        )
        for (namespace, name), facts in items:
            labels = [namespace, name]
            ranks.add_metric(labels, facts.ranks)
            slow.add_metric(labels, facts.stragglers)
            if facts.step is not None:
                step.add_metric(labels, facts.step)
            if facts.step_seconds is not None:
                step_time.add_metric(labels, facts.step_seconds)
            if facts.seconds_without_progress is not None:
                age.add_metric(labels, facts.seconds_without_progress)
            if facts.fast_replicated_step is not None:
                replicated.add_metric(labels, facts.fast_replicated_step)
            if facts.drained_step is not None:
                drained.add_metric(labels, facts.drained_step)
        yield from (step, step_time, age, ranks, slow, replicated, drained)


class Metrics:
    """Every metric the operator exports, on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._facts: dict[tuple[str, str], JobFacts] = {}
        self._progress: dict[tuple[str, str], ProgressFacts] = {}
        self._lock = threading.Lock()
        self._classes: dict[tuple[str, str], set[str]] = {}
        r = self.registry
        self.restarts = Counter(
            "rtj_restarts",
            "Restarts, by failure class and scope (world: every pod of a new attempt; "
            "in_place: the trainers restarted in the pods they ran in).",
            [*JOB_LABELS, "class", "scope"],
            registry=r,
        )
        self.failures = Counter(
            "rtj_failures",
            "Classified attempt failures, by failure class.",
            [*JOB_LABELS, "class"],
            registry=r,
        )
        self.lost_steps = Counter(
            "rtj_lost_steps",
            "Published steps passed over when resuming (newest verified step known at the "
            "failure minus the step resumed from).",
            JOB_LABELS,
            registry=r,
        )
        self.detection = Histogram(
            "rtj_detection_seconds",
            "From the first failed rank's termination to the classified attempt record.",
            ("class",),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.recovery = Histogram(
            "rtj_recovery_seconds",
            "From the first failed rank's termination to the next attempt's JobSet created.",
            ("class",),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ledger = LedgerMetrics(r)
        self.reconciles = Counter(
            "rtj_reconciles",
            "Reconciles by result (ok, conflict, error).",
            ("result",),
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "rtj_reconcile_seconds",
            "Duration of one reconcile (observe, plan, apply).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.api_requests = Counter(
            "rtj_api_requests",
            "Requests the operator sent to the API server (its own calls; kopf's watch "
            "streams are not counted), by Kubernetes verb and resource[/subresource].",
            ("verb", "resource"),
            registry=r,
        )
        self.build_info = Info(
            "rtj_operator_build",
            "The running operator's version and Python (rtj_operator_build_info).",
            registry=r,
        )
        self.build_info.info({"version": __version__, "python": platform.python_version()})
        self.leader = Gauge(
            "rtj_operator_leader",
            "1 while this replica holds the leader-election Lease (or runs without election).",
            registry=r,
        )
        self.queue_depth = Gauge(
            "rtj_workqueue_depth", "Jobs waiting in the work queue for a reconcile.", registry=r
        )
        self.queue_wait = Histogram(
            "rtj_workqueue_wait_seconds",
            "From a job being queued to a worker taking it.",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.loop_stall = Histogram(
            "rtj_event_loop_stall_seconds",
            "Each stall of the operator's event loop (its heartbeat 2 s late or more): how "
            "long it ran no heartbeat; the log names where the loop was (loop_watch).",
            buckets=(2, 5, 10, 30, 60, 120),
            registry=r,
        )
        r.register(_JobsCollector(self._facts, self._lock))
        r.register(_ProgressCollector(self._progress, self._lock))

    # --- per-job gauges ------------------------------------------------------------------

    def observe_job(self, rtj: ResilientTrainingJob) -> None:
        with self._lock:
            self._facts[(rtj.metadata.namespace, rtj.metadata.name)] = job_facts(rtj)

    def observe_progress(self, namespace: str, name: str, facts: ProgressFacts | None) -> None:
        with self._lock:
            if facts is None:
                self._progress.pop((namespace, name), None)
            else:
                self._progress[(namespace, name)] = facts

    def forget_job(self, namespace: str, name: str) -> None:
        with self._lock:
            self._facts.pop((namespace, name), None)
            self._progress.pop((namespace, name), None)
            classes = self._classes.pop((namespace, name), set())
        for cls in classes:
            with contextlib.suppress(KeyError):
                self.failures.remove(namespace, name, cls)
            for scope in RESTART_SCOPES:
                with contextlib.suppress(KeyError):
                    self.restarts.remove(namespace, name, cls, scope)
        with contextlib.suppress(KeyError):
            self.lost_steps.remove(namespace, name)

    # --- decisions -----------------------------------------------------------------------

    def _seen(self, namespace: str, name: str, cls: FailureClass) -> None:
        with self._lock:
            self._classes.setdefault((namespace, name), set()).add(cls.value)

    def record_failure(self, namespace: str, name: str, cls: FailureClass) -> None:
        self._seen(namespace, name, cls)
        self.failures.labels(namespace, name, cls.value).inc()

    def record_restart(
        self, namespace: str, name: str, cls: FailureClass, *, in_place: bool = False
    ) -> None:
        """One restart: whole-world (a new attempt) unless `in_place`."""
        self._seen(namespace, name, cls)
        self.restarts.labels(namespace, name, cls.value, restart_scope(in_place=in_place)).inc()

    def record_detection(self, cls: FailureClass, seconds: float) -> None:
        self.detection.labels(cls.value).observe(max(seconds, 0.0))

    def record_recovery(self, cls: FailureClass, seconds: float) -> None:
        self.recovery.labels(cls.value).observe(max(seconds, 0.0))

    def record_lost_steps(self, namespace: str, name: str, steps: int) -> None:
        if steps > 0:
            self.lost_steps.labels(namespace, name).inc(steps)

    def record_reconcile(self, result: str, seconds: float) -> None:
        self.reconciles.labels(result).inc()
        self.reconcile_seconds.observe(seconds)

    def record_api_request(self, verb: str, resource: str) -> None:
        """The `on_request` callback of `Kube`: one request sent."""
        self.api_requests.labels(verb, resource).inc()

    # --- serving -------------------------------------------------------------------------

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:  # noqa: S104 (a pod's metrics port)
        """Serve `/metrics` from a background thread; returns (server, thread)."""
        return start_http_server(port, addr=addr, registry=self.registry)


def restart_scope(*, in_place: bool) -> str:
    """The `scope` label value of rtj_restarts_total."""
    return RESTART_SCOPES[1] if in_place else RESTART_SCOPES[0]


class UnknownLabels(LookupError):
    """Asked for a sample by label names none of the metric's series carries."""


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    """One sample's value (0.0 when absent): a helper for tests and benchmarks.

    Raises UnknownLabels when the metric has series but none with exactly the label names
    asked (a label added or renamed since the caller was written), rather than reading 0."""
    want = labels or {}
    shapes: set[tuple[str, ...]] = set()
    for family in registry.collect():
        for s in family.samples:
            if s.name != name:
                continue
            if s.labels == want:
                return float(s.value)
            shapes.add(tuple(sorted(s.labels)))
    if shapes and tuple(sorted(want)) not in shapes:
        raise UnknownLabels(f"{name} has series labelled {sorted(shapes)}, none {sorted(want)}")
    return 0.0


def names(registry: CollectorRegistry) -> Iterable[str]:
    return [m.name for m in registry.collect()]
