"""The worker Jobs an attempt's JobSet makes, as the real API server validates them (a
server-side dry run of each replicated Job, with its pod template exactly as rendered): an
attempt that avoids several nodes (quarantined, or the suspects of silent data corruption)
must be a valid Job, or the Job controller creates no pod at all. A list of two node names
in one ``metadata.name NotIn`` requirement was refused ("must be only one value when
`operator` is 'In' or 'NotIn' for node field selector") and stalled the SDC drill's third
attempt; the pure render tests had not seen it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.build import kubectl
from e2e.operator_proc import rtj_body
from rtj_operator.api import ResilientTrainingJob
from rtj_operator.policy.render import render_jobset

pytestmark = [pytest.mark.cluster]


def _dry_run(rtj_cluster: Any, tmp_path: Path, job: dict[str, Any]) -> Any:
    path = tmp_path / f"{job['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return kubectl(rtj_cluster.kubeconfig, "create", "--dry-run=server", "-f", str(path))


def test_an_attempt_avoiding_several_nodes_renders_jobs_the_api_server_accepts(
    rtj_cluster: Any, rtj_ns: Any, tmp_path: Path
) -> None:
    body = rtj_body("avoids", rtj_ns.name, "s3://bucket/avoids", replicas=3)
    body["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100"]}]},
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h200"]}]},
        ]}}
    }  # fmt: skip
    since = "2026-12-06T02:00:00Z"
    body["status"] = {
        "attempt": 3,
        "quarantinedNodes": [
            {"node": f"gpu-node-{i}", "failureClass": "GPUFault", "attempt": i, "since": since}
            for i in (1, 2, 3)
        ],
    }
    jobset = render_jobset(ResilientTrainingJob.from_object(body), 4, None)
    replicated = jobset["spec"]["replicatedJobs"]
    assert replicated
    for rj in replicated:
        template = rj["template"]
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"avoids-{rj['name']}", "namespace": rtj_ns.name},
            "spec": template["spec"],
        }
        terms = template["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        done = _dry_run(rtj_cluster, tmp_path, job)
        assert done.returncode == 0, done.stderr
        assert all(len(t["matchFields"]) == 3 for t in terms), terms  # each node, one each
