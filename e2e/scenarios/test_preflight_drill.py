"""Drill (issue 43 section 3): a node whose platform check fails is caught by the preflight
before the job's state is loaded, quarantined, and the job trains elsewhere.

Real parts: the control plane, JobSet (no Kueue: the job names no queue), the operator
process, and the pod runner's nodes running every container as a local process, so the
`rtj-preflight` init containers of the four pods really join one another on rank 0's
rendezvous and run the platform's node command. The platform (`--platform-config`) names
the preflight's image and a node command that fails on one node, as `dcgmi diag` would on a
GPU that fails its memory test. One of the five nodes is cordoned for attempt 1, so its four
pods are certain to include the bad node; it is uncordoned once that node is quarantined.
Separately, a node whose link is slow (the runner runs its pod's ring transfer throttled,
`PodRunner.slow_link_file`) fails its pod's collective check: the job's next attempt keeps
off it, and nothing is quarantined (the tenant runs the pods that ring is measured with).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from scenario_runner import runner_nodes
from scenario_support import WAIT, condition_true

from e2e.operator_proc import pods_of, rtj_status, wait_for
from e2e.podrunner.runner import NODE_LABEL, NODE_LABEL_VALUE, PodRunner
from rtj_operator.api import keys
from rtj_operator.kube import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.operator, pytest.mark.local_only,
              pytest.mark.timeout(300)]  # fmt: skip

JOB = "drill"
IMAGE = "registry.example/rtj-preflight:e2e"
TAINT = {"key": "e2e.resilient.dev/preflight-drill", "value": "runner", "effect": "NoSchedule"}
DCGM_FAILURE = "dcgmi diag: GPU 0 failed the memory test (errors detected)"


@pytest.fixture
def runner(rtj_cluster: Any, rtj_ns: Any, tmp_path: Path) -> Iterator[PodRunner]:
    """Five tainted nodes of the pod runner (the session's KWOK nodes stay for the others);
    set up after the namespace, so torn down after it (the runner finalizes its pods)."""
    prefix = f"preflight-{uuid.uuid4().hex[:4]}-"
    with runner_nodes(rtj_cluster, tmp_path / "runner", nodes=5, prefix=prefix,
                      taint=TAINT) as r:  # fmt: skip
        yield r


def _cordon(rtj_cluster: Any, node: str, on: bool) -> None:
    rtj_cluster.kube.core.patch_node(node, {"spec": {"unschedulable": on}})


def _platform(tmp: Path, bad: str | None) -> Path:
    """The platform's configuration: its preflight image, and a node command that fails on
    `bad` as `dcgmi diag -r 1` does on a GPU with memory errors (exit 226, its report)."""
    script = (f'if [ "$RTJ_NODE_NAME" = "{bad}" ]; then echo "{DCGM_FAILURE}" >&2; exit 226; '
              "fi") if bad else "true"  # fmt: skip
    path = tmp / "platform.yaml"
    preflight = {"image": IMAGE, "nodeCommand": ["sh", "-c", script]}
    path.write_text(yaml.safe_dump({"preflight": preflight}))
    return path


def _job(ns: str, root: Path, bandwidth_factor: float = 1000) -> dict[str, Any]:
    return {
        "apiVersion": f"{keys.GROUP}/{keys.VERSION}", "kind": keys.KIND,
        "metadata": {"name": JOB, "namespace": ns},
        "spec": {
            "replicas": 4,
            "checkpoint": {"uri": f"file://{root}"},
            "failurePolicy": {"maxRestarts": 1, "backoff": {"initialSeconds": 1, "maxSeconds": 2}},
            # by default a factor no loopback hiccup reaches: the node check's drill
            "preflight": {"timeoutSeconds": 60, "bandwidthFactor": bandwidth_factor},
            "template": {"spec": {
                "nodeSelector": {NODE_LABEL: NODE_LABEL_VALUE},
                "tolerations": [{**TAINT, "operator": "Equal"}],
                "containers": [{
                    "name": "trainer", "image": "registry.example/trainer:1",
                    "command": ["python3", "-c", "import time; time.sleep(1); print('trained')"],
                }],
            }},
        },
    }  # fmt: skip


def _first_failure(rtj_api: Kube, ns: str) -> dict[str, Any]:
    """Attempt 1's record once it names its failure."""

    def failed() -> dict[str, Any] | None:
        attempts = rtj_status(rtj_api, ns, JOB).get("attempts") or []
        return attempts[0] if attempts and attempts[0].get("failureClass") else None

    found: dict[str, Any] = wait_for("attempt 1's failure record", failed, WAIT)
    return found


def _second_attempt_pods(rtj_api: Kube, ns: str) -> list[dict[str, Any]]:
    """Attempt 2's pods, once the job completed with it."""
    done = wait_for("the job to complete in attempt 2", lambda: (
        (s := rtj_status(rtj_api, ns, JOB)).get("phase") == "Succeeded" and s
    ), WAIT)  # fmt: skip
    assert condition_true(done, "Complete") and done["attempt"] == 2, done
    return [
        p
        for p in pods_of(rtj_api, ns, JOB)
        if p["metadata"]["labels"].get(keys.ATTEMPT_LABEL) == "2"
    ]


def test_a_node_that_fails_the_preflight_is_quarantined_and_the_job_trains_elsewhere(
    rtj_cluster: Any, rtj_api: Kube, rtj_ns: Any, runner: PodRunner, run_operator: Any,
    tmp_path: Path,
) -> None:  # fmt: skip
    ns = rtj_ns.name
    bad, spare = runner.node_names[2], runner.node_names[4]
    run_operator("--platform-config", str(_platform(tmp_path, bad)))
    _cordon(rtj_cluster, spare, True)  # attempt 1's four pods take the other four nodes
    root = tmp_path / "ckpt"
    root.mkdir()
    rtj_api.create_rtj(ns, _job(ns, root))

    record = _first_failure(rtj_api, ns)
    assert record["failureClass"] == "PreflightFailed", record
    assert record["firstFailed"]["node"] == bad, record
    assert any(DCGM_FAILURE in line and "node check" in line for line in record["evidence"]), record
    status = rtj_status(rtj_api, ns, JOB)
    assert [q["node"] for q in status["quarantinedNodes"]] == [bad], status
    assert status["restarts"]["preflight"] == 1 and status["restarts"]["infrastructure"] == 0

    _cordon(rtj_cluster, spare, False)
    second = _second_attempt_pods(rtj_api, ns)
    assert second and all(p["spec"]["nodeName"] != bad for p in second), second
    assert all(p["spec"]["initContainers"][0]["name"] == "rtj-preflight" for p in second)


def test_a_pod_whose_link_is_slow_fails_the_ring_and_the_next_attempt_keeps_off_its_node(
    rtj_cluster: Any, rtj_api: Kube, rtj_ns: Any, runner: PodRunner, run_operator: Any,
    tmp_path: Path,
) -> None:  # fmt: skip
    ns = rtj_ns.name
    slow, spare = runner.node_names[1], runner.node_names[4]
    # 4 MB/s each way: a 16 MiB ring takes seconds, against well over 100 MB/s on loopback
    runner.slow_link_file(slow).parent.mkdir(parents=True, exist_ok=True)
    runner.slow_link_file(slow).write_text("4000000")
    run_operator("--platform-config", str(_platform(tmp_path, None)))
    _cordon(rtj_cluster, spare, True)  # attempt 1's four pods take the other four nodes
    root = tmp_path / "ckpt"
    root.mkdir()
    rtj_api.create_rtj(ns, _job(ns, root, bandwidth_factor=4))

    record = _first_failure(rtj_api, ns)
    assert record["failureClass"] == "PreflightFailed", record
    assert record["firstFailed"]["node"] == slow, record
    assert any("collective check" in line and "avoids the node" in line
               for line in record["evidence"]), record  # fmt: skip
    status = rtj_status(rtj_api, ns, JOB)
    assert not status.get("quarantinedNodes"), status  # the tenant's ring taints nothing
    # a slow link is no proof against the node: the restart is the job's own (maxRestarts)
    assert status["restarts"]["preflight"] == 0, status
    assert status["restarts"]["infrastructure"] == 1, status

    _cordon(rtj_cluster, spare, False)
    second = _second_attempt_pods(rtj_api, ns)
    assert len(second) == 4 and all(p["spec"]["nodeName"] != slow for p in second), second
