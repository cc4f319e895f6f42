"""Drills: a GPU fault and a lost node, each survived by a whole-group restart elsewhere.

Faults are written the way the node's agents and the kubelet report them (e2e.cluster.faults):
an XID node condition from the GPU health agent, container exits from the kubelet, a Node
object deleted when the machine is gone. Everything after that is the real control plane
and the operator process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from scenario_support import (
    NCCL_TIMEOUT,
    by_rank,
    failed_record,
    pinned_step,
    quarantine_taint,
    start_job,
    taints,
    terminate_ranks,
    wait_events,
    wait_running,
)

from e2e.cluster import faults
from e2e.cluster.kube import eventually
from e2e.operator_proc import jobsets_of, pods_of, publish_steps, rtj_status
from rtj_operator.api import keys
from rtj_operator.kube import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.operator, pytest.mark.local_only]

JOB = "llm"
CUDA_CRASH = (
    "Traceback (most recent call last):\n"
    '  File "/workspace/train.py", line 212, in <module>\n'
    "    loss.backward()\n"
    "RuntimeError: CUDA error: unspecified launch failure\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect."
)
"""What the rank on a GPU that fell off the bus prints: on its own, a Python traceback."""


@pytest.mark.s3
def test_gpu_fault_on_rank_2_quarantines_its_node_and_restarts_from_the_newest_step(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any, s3_root: str, tmp_path: Path,
    timeline: Any,
) -> None:  # fmt: skip
    ns = rtj_ns.name
    publish_steps(s3_root, [100], tmp_path, run_id=f"{ns}.{JOB}")
    op = run_operator()
    tl = timeline(JOB)
    pods = by_rank(start_job(rtj_api, ns, JOB, s3_root, replicas=4))
    publish_steps(s3_root, [200, 300], tmp_path, run_id=f"{ns}.{JOB}")  # the trainer went on
    gpu_restarts = {"namespace": ns, "name": JOB, "class": "GPUFault", "scope": "world"}
    before = op.metric("rtj_restarts_total", **gpu_restarts)

    victim = pods[2]
    node = victim["spec"]["nodeName"]
    faults.gpu_xid(hkube, node, 79)  # the GPU health agent reports XID 79 on rank 2's node
    faults.terminate_container(hkube, ns, victim["metadata"]["name"], exit_code=1,
                               message=CUDA_CRASH)  # fmt: skip
    followers = [pods[r] for r in (0, 1, 3)]
    terminate_ranks(hkube, ns, followers, lambda r: NCCL_TIMEOUT.format(rank=r))

    record = failed_record(rtj_api, ns, JOB, 1)
    assert record["failureClass"] == "GPUFault", record
    first = record["firstFailed"]
    assert (first["rank"], first["pod"], first["node"]) == (2, victim["metadata"]["name"], node)
    assert any("SysLogsXIDError" in line and "79" in line for line in record["evidence"]), record
    # recorded with the restart in one plan (the intent), tainted right after its status
    # patch: the taint holds long before the next attempt (after teardown and backoff)
    eventually(
        f"the quarantine taint on {node}",
        lambda: quarantine_taint(JOB) in taints(rtj_api, node),
        timeout=15,
    )

    new_pods = wait_running(rtj_api, ns, JOB, 2, 4)

    # the old world was gone before the new one existed (etcd order, from watches)
    created = tl.first("JobSet", "ADDED", f"{JOB}-a2")
    assert created is not None
    old_pods = tl.names("Pod", 1)
    assert len(old_pods) == 4
    for name in [*sorted(old_pods), f"{JOB}-a1"]:
        kind = "JobSet" if name == f"{JOB}-a1" else "Pod"
        gone = tl.first(kind, "DELETED", name)
        # etcd's order (resourceVersions), the only one that holds across watches: the pod
        # and JobSet watches are separate streams, so when each event *arrives* here says
        # nothing about which happened first (a flake: a DELETED arrived 50 ms after an
        # ADDED that came later in etcd)
        assert gone is not None and gone.rv < created.rv, f"{kind} {name} outlived attempt 1"
    assert [j["metadata"]["name"] for j in jobsets_of(rtj_api, ns, JOB)] == [f"{JOB}-a2"]
    assert {p["metadata"]["labels"][keys.ATTEMPT_LABEL] for p in pods_of(rtj_api, ns, JOB)} == {"2"}

    # the new world avoids the node and resumes from the newest verified step
    (js,) = jobsets_of(rtj_api, ns, JOB)
    assert js["metadata"]["annotations"][keys.RESUME_STEP_ANNOTATION] == "300"
    for p in new_pods:
        assert p["spec"]["nodeName"] != node
        assert pinned_step(p) == 300
    status = rtj_status(rtj_api, ns, JOB)
    assert status["attempts"][0]["firstFailed"]["rank"] == 2, "not a rank that timed out after"
    assert status["restarts"]["infrastructure"] == 1
    assert status["attempts"][1]["resumedFromStep"] == 300
    assert status["attempts"][0]["recoverySeconds"] > 0
    assert [q["node"] for q in status["quarantinedNodes"]] == [node]
    wait_events(rtj_api, ns, JOB, "NodesQuarantined", "RestartScheduled")
    assert op.metric("rtj_restarts_total", **gpu_restarts) == before + 1
    assert op.metric("rtj_quarantined_nodes", namespace=ns, name=JOB) == 1


def test_a_node_that_disappears_mid_run_restarts_the_group_elsewhere(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any, timeline: Any
) -> None:
    ns = rtj_ns.name
    op = run_operator()
    tl = timeline(JOB)
    pods = by_rank(start_job(rtj_api, ns, JOB, "file:///mnt/ckpt/llm", replicas=2))
    victim = pods[1]
    node = victim["spec"]["nodeName"]

    faults.delete_node(hkube, node)  # the machine is gone, and with it its Node object

    record = failed_record(rtj_api, ns, JOB, 1)
    assert record["failureClass"] == "NodeLost", record
    assert record["firstFailed"]["node"] == node
    assert any(node in line and "no longer exists" in line for line in record["evidence"])
    new_pods = wait_running(rtj_api, ns, JOB, 2, 2)
    assert all(p["spec"]["nodeName"] != node for p in new_pods)
    created = tl.first("JobSet", "ADDED", f"{JOB}-a2")
    assert created is not None
    for name in tl.names("Pod", 1):
        gone = tl.first("Pod", "DELETED", name)
        assert gone is not None and gone.rv < created.rv, f"pod {name} outlived attempt 1"
    status = rtj_status(rtj_api, ns, JOB)
    assert status["restarts"]["infrastructure"] == 1
    assert status["phase"] == "Running"
    assert op.metric("rtj_restarts_total", namespace=ns, name=JOB,
                     **{"class": "NodeLost", "scope": "world"}) == 1  # fmt: skip
