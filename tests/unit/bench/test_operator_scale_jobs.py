"""The many-jobs scale report (`bench.operator_scale_jobs`): its figures from
`bench.operator_scale --json`'s phase, and the ratios to the smallest size."""

from __future__ import annotations

import math
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from bench.operator_scale_jobs import markdown, nodes_for, summarize
from bench.operator_scale_report import QUIET_SECONDS
from bench.operator_scale_workload import PROGRESS_MODES, SIM_PORT, worker_body
from bench.scale_probes import list_seconds, operator_reconciles
from rtj_operator.api import ResilientTrainingJob
from rtj_operator.api.detection_spec import DEFAULT_PROGRESS_PORT
from rtj_operator.metrics import Metrics


def _fault(detected: float | None, recovered: float | None) -> dict[str, Any]:
    return {"detected": detected, "recovered": recovered}


def _report(faults: list[dict[str, Any]], cpu: float, requests: int) -> dict[str, Any]:
    phase = {
        "faults": faults, "window_seconds": 10.0, "cluster_requests": requests,
        "quiet_rate": 2.0, "operator_requests": 50, "operator_lease_requests": 10,
        "cpu_window": {"operator": cpu, "kueue": 9.0}, "rss_steady": 80.0, "rss_peak": 95.0,
        "cpu_quiet": {"operator": 0.8 * QUIET_SECONDS / 10.0, "kueue": 1.0},
        "startup_seconds": 12.0, "problems": [], "operator_reconciles": 36,
        "progress_answered": 250, "namespace_events": 9000, "event_lists": 20,
        "event_list_seconds": 3.0,
    }  # fmt: skip
    return {"phases": [phase]}


def test_the_figures_come_from_the_phase_per_recovery() -> None:
    faults = [_fault(0.2, 3.0), _fault(0.4, 5.0), _fault(None, None), _fault(0.3, 4.0)]
    size = summarize(_report(faults, cpu=8.0, requests=132), jobs=10, workers=2, nodes=4)
    assert size.faults == 4 and size.pods == 20
    assert math.isclose(size.decision_p50, 0.3) and size.decision_p99 <= 0.4
    assert math.isclose(size.recovery_p50, 4.0)
    assert size.cpu_per_recovery == 2.0  # the operator's CPU over the faults, not kueue's
    # the quiet window ran at 0.08 of a core: 0.8 CPU-s of the 10 s window are routine
    assert math.isclose(size.idle_cpu_share, 0.08)
    assert math.isclose(size.recovery_cpu, (8.0 - 0.8) / 4)
    assert size.progress_reads_per_second == 25.0  # the sidecars' answers over the window
    assert size.namespace_events == 9000 and size.event_list_ms == 150.0
    assert size.operator_requests_per_recovery == 10.0  # its lease calls apart
    assert size.reconciles_per_recovery == 9.0
    # all clients, less the injector's 3 a fault and the quiet rate over the window
    assert size.cluster_requests_per_recovery == (132 - 12 - 20) / 4
    assert size.problems == ["1 faults never decided"]


def test_the_report_gives_each_size_as_a_ratio_to_the_smallest() -> None:
    small = summarize(_report([_fault(0.2, 3.0)], cpu=1.0, requests=40), 10, 2, 4)
    large = summarize(_report([_fault(0.4, 3.0)], cpu=1.0, requests=40), 1000, 2, 313)
    text = markdown([small, large], 2, (1.0, 2.0))
    row = next(line for line in text.splitlines() if line.startswith("| decision p50"))
    assert "(2.00x)" in row
    assert "| decision p99 s (goal < 2) |" in text


def test_a_run_from_before_reconciles_were_counted_still_reads() -> None:
    report = _report([_fault(0.2, 3.0)], cpu=1.0, requests=40)
    del report["phases"][0]["operator_reconciles"]
    del report["phases"][0]["cpu_quiet"]
    size = summarize(report, 300, 2, 94)
    assert math.isnan(size.reconciles_per_recovery) and math.isnan(size.recovery_cpu)


def test_every_job_and_its_next_world_fit() -> None:
    assert nodes_for(10, 2) == 4  # 25 GPUs: 4 nodes; never fewer than workers + 1
    assert nodes_for(1000, 2) * 8 >= 1000 * 2 * 1.25
    assert nodes_for(1, 4) == 5


def test_reconciles_are_read_from_the_operators_own_metrics() -> None:
    """`rtj_reconciles_total` as the operator's registry prints it (prometheus_client)."""
    metrics = Metrics(CollectorRegistry())
    for result, seconds in (("ok", 0.1), ("ok", 0.2), ("error", 0.3)):
        metrics.record_reconcile(result, seconds)
    text = generate_latest(metrics.registry).decode()
    assert operator_reconciles(text) == 3
    assert operator_reconciles("") == 0


def test_each_progress_mode_is_a_job_the_operator_reads_as_meant() -> None:
    def progress(mode: str) -> tuple[bool, int]:
        body = worker_body("s000", "t-bench", 2, 1, mode)
        spec = ResilientTrainingJob.from_object(body).spec.progress
        return spec.enabled, spec.port

    assert progress("unanswered") == (True, DEFAULT_PROGRESS_PORT)
    assert progress("off")[0] is False
    assert progress("answered") == (True, SIM_PORT)
    assert set(PROGRESS_MODES) == {"unanswered", "off", "answered"}


def test_event_list_seconds_are_read_from_the_api_servers_histogram() -> None:
    """`apiserver_request_duration_seconds` as kube-apiserver v1.35 prints it (its labels:
    component, dry_run, group, resource, scope, subresource, verb, version)."""

    def line(part: str, resource: str, scope: str, verb: str, value: float) -> str:
        return (f'apiserver_request_duration_seconds_{part}{{component="apiserver",dry_run="",'
                f'group="",resource="{resource}",scope="{scope}",subresource="",verb="{verb}",'
                f'version="v1"}} {value}')  # fmt: skip

    text = "\n".join([
        line("sum", "events", "namespace", "LIST", 2.5),
        line("count", "events", "namespace", "LIST", 10),
        line("sum", "events", "cluster", "LIST", 0.5),
        line("count", "events", "cluster", "LIST", 2),
        line("sum", "pods", "namespace", "LIST", 9),
        line("sum", "events", "namespace", "POST", 7),
    ])  # fmt: skip
    assert list_seconds(text, "events") == (3.0, 12)
