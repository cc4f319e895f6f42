"""operator_proc.metric_value: reading one sample of the operator's /metrics by its exact label
set, and failing loudly (not reading 0) when the asked label names fit none of its series."""

from __future__ import annotations

import pytest

from e2e.operator_proc import UnknownLabels, metric_value

PAGE = """\
# HELP rtj_restarts_total Restarts, by failure class and scope.
# TYPE rtj_restarts_total counter
rtj_restarts_total{class="GPUFault",name="llm",namespace="ml",scope="world"} 2.0
rtj_restarts_total{class="GPUFault",name="llm",namespace="ml",scope="in_place"} 3.0
rtj_restarts_created{class="GPUFault",name="llm",namespace="ml",scope="world"} 1.7e+09
# HELP rtj_jobs ResilientTrainingJobs by phase.
# TYPE rtj_jobs gauge
rtj_jobs{phase="Running"} 1.0
rtj_operator_leader 1.0
rtj_operator_build_info{python="3.11.9",version="1.0, \\"rc\\""} 1.0
# HELP rtj_failures_total Classified attempt failures, by failure class.
# TYPE rtj_failures_total counter
"""
GPU = {"namespace": "ml", "name": "llm", "class": "GPUFault"}


def test_a_sample_is_read_by_its_exact_label_set_in_any_order() -> None:
    assert metric_value(PAGE, "rtj_restarts_total", {**GPU, "scope": "world"}) == 2
    assert metric_value(PAGE, "rtj_restarts_total", {"scope": "in_place", **GPU}) == 3
    assert metric_value(PAGE, "rtj_jobs", {"phase": "Running"}) == 1
    assert metric_value(PAGE, "rtj_operator_leader", {}) == 1
    build = {"python": "3.11.9", "version": '1.0, "rc"'}  # a comma and quotes in a value
    assert metric_value(PAGE, "rtj_operator_build_info", build) == 1


def test_a_series_not_there_yet_reads_zero() -> None:
    # the label names fit the metric's series; these values have none (no restart yet)
    assert metric_value(PAGE, "rtj_restarts_total", {**GPU, "class": "NodeLost",
                                                     "scope": "world"}) == 0  # fmt: skip
    assert metric_value(PAGE, "rtj_jobs", {"phase": "Failed"}) == 0
    # a family with no series at all: nothing to compare the label names with
    assert metric_value(PAGE, "rtj_failures_total", GPU) == 0
    assert metric_value(PAGE, "rtj_lost_steps_total", {"namespace": "ml", "name": "llm"}) == 0


def test_label_names_that_fit_no_series_fail_loudly_instead_of_reading_zero() -> None:
    with pytest.raises(UnknownLabels, match=r"rtj_restarts_total.*scope"):
        metric_value(PAGE, "rtj_restarts_total", GPU)  # written before the scope label
    with pytest.raises(UnknownLabels, match="rtj_jobs"):
        metric_value(PAGE, "rtj_jobs", {"phase": "Running", "namespace": "ml"})
