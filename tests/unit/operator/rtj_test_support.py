"""Shared builders for the operator unit tests (a uniquely named module, not a conftest)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rtj_operator.api import ResilientTrainingJob
from rtj_shim.wire.supervisor_report import SupervisorReport

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
NOW = datetime(2025, 3, 14, 12, 0, 0, tzinfo=timezone.utc)


def job_body(**spec: Any) -> dict[str, Any]:
    """A minimal valid ResilientTrainingJob as `kubectl apply` would send it."""
    base: dict[str, Any] = {
        "replicas": 4,
        "queueName": "team-a",
        "template": {
            "metadata": {"labels": {"app": "llm"}},
            "spec": {
                "containers": [
                    {
                        "name": "trainer",
                        "image": "registry.example/llm@sha256:" + "a" * 64,
                        "command": ["torchrun", "--nproc-per-node=8", "train.py"],
                        "resources": {"limits": {"nvidia.com/gpu": "8"}},
                    }
                ]
            },
        },
        "checkpoint": {"uri": "s3://ckpt/team-a/llm"},
    }
    base.update(spec)
    return {
        "apiVersion": "training.resilient.dev/v1alpha1",
        "kind": "ResilientTrainingJob",
        "metadata": {"name": "llm", "namespace": "team-a", "uid": "6f1c-uid", "generation": 1},
        "spec": base,
    }


def make_job(**spec: Any) -> ResilientTrainingJob:
    return ResilientTrainingJob.from_object(job_body(**spec))


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def supervisor_reports(body: Mapping[str, Mapping[str, Any]]) -> dict[str, SupervisorReport]:
    """Per pod, a supervisor's report as the operator holds it: parsed where it arrives
    (`rtj_shim.wire.supervisor_report`), from the JSON a supervisor writes."""
    return {pod: SupervisorReport.parse(report) for pod, report in body.items()}
