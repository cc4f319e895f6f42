"""The per-job gauges of spec.elastic (issue 45): the world the trainers run as, the world
the job asks for, and since when it has run short (the RTJRunningShrunk alert counts from
it: a timestamp, so an operator restart does not reset the alert's clock)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from rtj_operator.api.reasons import Phase
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.metric_labels import JOB_LABELS


@dataclass(frozen=True)
class WorldFacts:
    size: int
    """The pods the trainers run as now (spec.replicas unless spec.elastic resized it)."""
    desired: int
    """spec.replicas."""
    shrunk_since: float | None = None
    """When the world became smaller than spec.replicas (Unix time; None: it is not)."""


def world_facts(rtj: ResilientTrainingJob) -> WorldFacts | None:
    """While the job runs: its world (None otherwise, no sample)."""
    status = rtj.status
    if status.phase is not Phase.RUNNING:
        return None
    desired = rtj.spec.replicas
    size = status.world_size or desired
    if size >= desired:
        return WorldFacts(size, desired)
    record = status.current
    shrinks = [
        e for e in (record.in_place_restarts if record is not None else ())
        if e.world_size is not None and e.world_size < desired
    ]  # fmt: skip
    since = (shrinks[-1].started_at or shrinks[-1].detected_at) if shrinks else None
    return WorldFacts(size, desired, since.timestamp() if since is not None else None)


def world_families(items: Iterable[tuple[tuple[str, str], WorldFacts | None]]) -> Iterator[Metric]:
    size = GaugeMetricFamily(
        "rtj_world_size",
        "Pods the job's trainers run as now (spec.elastic: fewer than spec.replicas while "
        "shrunk); only while Running.",
        labels=JOB_LABELS,
    )
    desired = GaugeMetricFamily(
        "rtj_world_size_desired", "spec.replicas; only while Running.", labels=JOB_LABELS
    )
    since = GaugeMetricFamily(
        "rtj_world_shrunk_since_timestamp_seconds",
        "When the running job's world became smaller than spec.replicas (Unix time; only "
        "while it is).",
        labels=JOB_LABELS,
    )
    for (namespace, name), facts in items:
        if facts is None:
            continue
        labels = [namespace, name]
        size.add_metric(labels, facts.size)
        desired.add_metric(labels, facts.desired)
        if facts.shrunk_since is not None:
            since.add_metric(labels, facts.shrunk_since)
    yield from (size, desired, since)
