"""Shared builders for the operator unit tests (a uniquely named module, not a conftest)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rtj_operator.api import ResilientTrainingJob

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
