"""Drills: node liveness from Leases (issue 12). A node that goes silent is judged lost
from its Lease well before the node lifecycle controller marks it, its pods are fenced and
the group restarts elsewhere, and nobody deletes the Node object. A short Ready flicker
causes nothing. Every node losing contact at once is a partition: the job holds and goes
on afterwards.

KWOK renews each node's Lease (20 s, renewed every 5 s) like a kubelet; `faults.node_lost`
stops that for one node, as a dead kubelet would. The harness's node controller declares a
node Unknown 20 s after its last renewal (`--node-monitor-grace-period`).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from scenario_support import (
    WAIT,
    by_rank,
    condition,
    condition_true,
    failed_record,
    start_job,
    taints,
    wait_running,
)

from e2e.cluster import faults, kwok
from e2e.operator_proc import rtj_status, wait_for
from rtj_operator.api import keys
from rtj_operator.kube import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.operator, pytest.mark.local_only]

URI = "file:///mnt/ckpt/liveness"


def _ready_since(hkube: Any, node: str, status: str) -> str | None:
    """When the node's Ready condition took `status` (None: it has another status)."""
    n = hkube.core.read_node(node)
    ready = next((c for c in n.status.conditions or [] if c.type == "Ready"), None)
    if ready is None or ready.status != status:
        return None
    return ready.last_transition_time.isoformat().replace("+00:00", "Z")


def _back(hkube: Any, node: str) -> None:
    """The kubelet is back: KWOK manages the node again (renews its Lease, posts Ready)."""
    hkube.core.patch_node(
        node,
        {"metadata": {"labels": {kwok.MANAGED_LABEL: kwok.MANAGED_VALUE},
                      "annotations": {kwok.IGNORE_ANNOTATION: None}}},
    )  # fmt: skip


def test_a_silent_node_is_judged_lost_from_its_lease_before_the_node_controller(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    run_operator()
    pods = by_rank(start_job(rtj_api, ns, "llm", URI, replicas=2))
    node = pods[1]["spec"]["nodeName"]
    faults.node_lost(hkube, node, wait=False)  # the kernel panics: no more renewals
    lost_at = time.monotonic()

    record = failed_record(rtj_api, ns, "llm", 1)
    took = time.monotonic() - lost_at
    assert record["failureClass"] == "NodeLost", record
    assert record["firstFailed"]["node"] == node
    assert any("NodeLeaseExpired" in line for line in record["evidence"]), record
    print(f"silent node {node}: judged lost {took:.1f} s after its kubelet stopped renewing")
    # the node lifecycle controller says so only later (or not yet)
    unknown = wait_for(f"{node} Ready=Unknown", lambda: _ready_since(hkube, node, "Unknown"), WAIT)
    assert record["endedAt"] < unknown, (record["endedAt"], unknown)

    new = wait_running(rtj_api, ns, "llm", 2, 2)
    assert all(p["spec"]["nodeName"] != node for p in new)
    status = rtj_status(rtj_api, ns, "llm")
    assert [q["node"] for q in status["quarantinedNodes"]] == [node]
    assert hkube.core.read_node(node).metadata.name == node, "nobody deleted the Node"


def test_a_short_ready_flicker_causes_no_restart_and_no_taint(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    run_operator()
    pods = by_rank(start_job(rtj_api, ns, "llm", URI, replicas=2))
    node = pods[0]["spec"]["nodeName"]
    faults.node_not_ready(hkube, node)  # the kubelet posts Ready=False (its Lease renewed)
    time.sleep(3)
    _back(hkube, node)
    wait_for(f"{node} Ready again", lambda: _ready_since(hkube, node, "True"), WAIT)
    time.sleep(10)  # past the flicker window: nothing was decided in it
    status = rtj_status(rtj_api, ns, "llm")
    assert (status["phase"], status["attempt"]) == ("Running", 1), status
    assert not any(t.get("key") == keys.DEFAULT_TAINT_KEY for t in taints(rtj_api, node))


@pytest.mark.gpu_quota(16)
def test_every_node_losing_contact_at_once_is_a_partition_the_job_rides_out(
    rtj_api: Kube, hkube: Any, rtj_cluster: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    run_operator()
    pods = by_rank(start_job(rtj_api, ns, "llm", URI, replicas=2))
    nodes = rtj_cluster.node_names
    for node in nodes:  # contact with every kubelet is lost at once
        faults.node_lost(hkube, node, wait=False)

    held = wait_for("the NodesUnreachable condition",
                    lambda: condition_true(rtj_status(rtj_api, ns, "llm"), "NodesUnreachable"),
                    WAIT)  # fmt: skip
    assert "holding" in held["message"]
    time.sleep(10)  # well past the silence allowance of every node: still no verdict
    status = rtj_status(rtj_api, ns, "llm")
    assert (status["phase"], status["attempt"]) == ("Running", 1), status
    assert not status.get("quarantinedNodes")
    for node in nodes:
        _back(hkube, node)
    cleared = wait_for(
        "contact restored",
        lambda: (
            (c := condition(rtj_status(rtj_api, ns, "llm"), "NodesUnreachable"))
            and c["status"] == "False"
        ),
        WAIT,
    )
    assert cleared
    status = rtj_status(rtj_api, ns, "llm")
    assert (status["phase"], status["attempt"]) == ("Running", 1), status
    running = {p["metadata"]["name"] for p in pods.values()}
    assert all(not any(t.get("key") == keys.DEFAULT_TAINT_KEY for t in taints(rtj_api, n))
               for n in nodes), running  # fmt: skip
