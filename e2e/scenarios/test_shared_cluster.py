"""Drills: a shared production cluster (issue 13). A tenant's job cannot hurt anyone else's
nodes, jobs sharing a node keep their quarantine claims apart, a failed job holds nothing,
a job re-created under the same name starts clean, an admitted attempt that cannot be
scheduled says so, and a crash of the resume init container is not a corrupt checkpoint.

The operator runs as its own process against the real control plane; faults are written
the way the kubelet and the node agents write them (e2e.cluster.faults).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from scenario_kubelet import kubelet_reports_init_failure
from scenario_support import (
    NCCL_TIMEOUT,
    WAIT,
    by_rank,
    condition_true,
    failed_record,
    start_job,
    taints,
    terminate_ranks,
    wait_phase,
)

from e2e.cluster import faults
from e2e.operator_proc import jobsets_of, pods_of, rtj_body, rtj_status, running_pods, wait_for
from rtj_operator.api import keys
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import NotFound

pytestmark = [pytest.mark.cluster, pytest.mark.operator, pytest.mark.local_only]

URI = "file:///mnt/ckpt/shared"
CUDA_CRASH = (
    "Traceback (most recent call last):\n"
    '  File "/workspace/train.py", line 212, in <module>\n'
    "    loss.backward()\n"
    "RuntimeError: CUDA error: unspecified launch failure"
)
XID_TEXT = (
    "[rank0]: RuntimeError: CUDA error: unspecified launch failure\n"
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."
)
"""What a rank prints about a GPU: words anyone can write, never proof on their own."""
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/workspace/train.py", line 40, in <module>\n'
    "    cfg = load(args.config)\n"
    "KeyError: 'optimizer'"
)


def _our_taints(kube: Kube, node: str) -> list[dict[str, Any]]:
    return [t for t in taints(kube, node) if t.get("key") == keys.DEFAULT_TAINT_KEY]


def _claims(kube: Kube, node: str) -> dict[str, Any]:
    annotations = kube.get_node(node)["metadata"].get("annotations") or {}
    raw = annotations.get(keys.QUARANTINE_OWNERS_ANNOTATION)
    return json.loads(raw) if raw else {}


def _claim_uids(kube: Kube, node: str) -> set[str]:
    slot = f"{keys.DEFAULT_TAINT_KEY}:NoSchedule"
    return {o["uid"] for o in (_claims(kube, node).get(slot) or {}).get("owners", [])}


def _gone(kube: Kube, ns: str, name: str) -> bool:
    try:
        kube.get_rtj(ns, name)
    except NotFound:
        return True
    return False


def test_a_spoofed_pod_cannot_get_another_teams_node_tainted(
    rtj_api: Kube, hkube: Any, rtj_cluster: Any, rtj_ns: Any, run_operator: Any
) -> None:
    """A tenant creates bare pods with its job's labels on another team's healthy node and
    lets them die saying "Xid 79 ... fallen off the bus". One copies a worker's labels but
    the Job's selector label: no Job owns it, it is no evidence. One copies them all: the
    Job controller adopts it (to Kubernetes it is then that Job's pod), so it may fail the
    tenant's own job, but a node is tainted only on node-level evidence: never that node."""
    ns = rtj_ns.name
    run_operator()
    pods = by_rank(start_job(rtj_api, ns, "llm", URI, replicas=2))
    mine = {p["spec"]["nodeName"] for p in pods.values()}
    other = next(n for n in rtj_cluster.node_names if n not in mine)  # another team's node
    labels = copy.deepcopy(pods[0]["metadata"]["labels"])
    unadopted = {k: v for k, v in labels.items() if not k.startswith("batch.kubernetes.io/")}

    def spoof(name: str, copied: dict[str, str]) -> bool:
        """Create a pod with these labels on the other node and let it die saying the XID;
        False when it was deleted first (the Job controller removes an adopted pod that
        duplicates a running index, and that may win the race with the test)."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": copied},
            "spec": {"nodeName": other, "restartPolicy": "Never",
                     "containers": [{"name": "trainer", "image": "registry.example/trainer:dev"}]},
        }  # fmt: skip
        hkube.core.create_namespaced_pod(ns, body)
        try:
            wait_for(f"{name} to run", lambda: (
                hkube.core.read_namespaced_pod(name, ns).status.phase == "Running"
            ), WAIT)  # fmt: skip
            faults.terminate_container(hkube, ns, name, exit_code=1, message=XID_TEXT)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False
        return True

    assert spoof("llm-a1-worker-0-7-bare", unadopted)
    # the adopted copy: a few tries, so that at least one dies saying the XID
    assert any(spoof(f"llm-a1-worker-0-8-copy-{n}", labels) for n in range(3)), (
        "every adopted copy was deleted before it could die saying the XID"
    )
    time.sleep(8)  # past the settle window of a user-category verdict
    assert not _our_taints(rtj_api, other) and not _claims(rtj_api, other)
    assert not rtj_status(rtj_api, ns, "llm").get("quarantinedNodes")

    # the same words from the job's own rank, with its node's agent reporting the XID, do
    # quarantine that node (the operator was watching all along)
    def settled() -> list[dict[str, Any]] | None:
        # the adopted copy may have failed the job: while it converges before its next
        # attempt, status.attempt is still the old one and the old pods may still run
        status = rtj_status(rtj_api, ns, "llm")
        if status.get("phase") != "Running":
            return None
        return running_pods(rtj_api, ns, "llm", status["attempt"], 2)

    current = wait_for("the current attempt running", settled, WAIT)
    # a later attempt may have been scheduled onto the other node, free again once the
    # spoofed pods are gone: the fault strikes one of the job's pods elsewhere
    victim = next(p for p in current if p["spec"]["nodeName"] != other)
    faults.gpu_xid(hkube, victim["spec"]["nodeName"], 79)
    faults.terminate_container(hkube, ns, victim["metadata"]["name"], exit_code=1,
                               message=XID_TEXT)  # fmt: skip
    wait_for("the job's own node quarantined",
             lambda: _our_taints(rtj_api, victim["spec"]["nodeName"]), WAIT)  # fmt: skip
    assert not _our_taints(rtj_api, other), "the other team's node is still untouched"


@pytest.mark.gpu_quota(32)
def test_jobs_sharing_a_quarantined_node_keep_their_claims_and_a_stalled_attempt_says_why(
    rtj_api: Kube, hkube: Any, rtj_cluster: Any, rtj_ns: Any, run_operator: Any
) -> None:
    """Two jobs of 2 workers x 4 GPUs, both pinned to the same two nodes (one worker of
    each per node). An XID on one node fails a worker of each: both quarantine it (one
    taint, two claims). Their next attempts cannot be scheduled on one node (a worker per
    node): the one Kueue admits is Stalled, PodsUnschedulable. Deleting one job lifts only
    its claim."""
    ns = rtj_ns.name
    shared, spare = rtj_cluster.node_names[:2]
    run_operator()
    pinned = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                                                     "operator": "In",
                                                     "values": [shared, spare]}]}]}}}  # fmt: skip
    jobs = {}
    for name in ("alpha", "beta"):
        body = rtj_body(name, ns, URI, replicas=2)
        spec = body["spec"]["template"]["spec"]
        spec["affinity"] = pinned
        spec["containers"][0]["resources"] = {
            "requests": {"nvidia.com/gpu": "4", "cpu": "1", "memory": "1Gi"},
            "limits": {"nvidia.com/gpu": "4"},
        }
        rtj_api.create_rtj(ns, body)
        jobs[name] = wait_for(
            f"{name} running", lambda n=name: running_pods(rtj_api, ns, n, 1, 2), WAIT
        )
    uids = {name: rtj_api.get_rtj(ns, name)["metadata"]["uid"] for name in jobs}

    faults.gpu_xid(hkube, shared, 79)
    for pods in jobs.values():
        on_shared = next(p for p in pods if p["spec"]["nodeName"] == shared)
        faults.terminate_container(hkube, ns, on_shared["metadata"]["name"], exit_code=1,
                                   message=CUDA_CRASH)  # fmt: skip
        others = [p for p in pods if p is not on_shared]
        terminate_ranks(hkube, ns, others, lambda r: NCCL_TIMEOUT.format(rank=r))
    for name in jobs:
        assert failed_record(rtj_api, ns, name, 1)["failureClass"] == "GPUFault"
    wait_for(
        "both claims on the shared node",
        lambda: _claim_uids(rtj_api, shared) == set(uids.values()),
        WAIT,
    )
    assert len(_our_taints(rtj_api, shared)) == 1, "one taint per key and effect"

    # attempt 2 of each: one worker per node and one node left. Kueue admits one of them
    # first (either: both queue within the same instant); its waitForPodsReady with
    # blockAdmission (e2e/cluster/cluster.py) then holds the other until the first's pods
    # are ready, which they never are here. The admitted one says why it cannot start.
    def _stalled() -> Any:
        for name in jobs:
            found = condition_true(rtj_status(rtj_api, ns, name), "Stalled")
            if found:
                return found
        return None

    stalled = wait_for("one of the jobs Stalled", _stalled, WAIT)
    assert stalled["reason"] == "PodsUnschedulable"
    assert "untolerated taint" in stalled["message"]

    rtj_api.delete_rtj(ns, "beta")
    wait_for("beta gone (its claim released first)", lambda: _gone(rtj_api, ns, "beta"), WAIT)
    assert _claim_uids(rtj_api, shared) == {uids["alpha"]}
    assert len(_our_taints(rtj_api, shared)) == 1, "alpha still holds the node"
    rtj_api.delete_rtj(ns, "alpha")
    wait_for("alpha gone", lambda: _gone(rtj_api, ns, "alpha"), WAIT)
    assert not _our_taints(rtj_api, shared) and not _claims(rtj_api, shared)


def _config_error(hkube: Any, ns: str, pod: str) -> None:
    """The kubelet's report of a worker whose Secret does not exist, scheduled 3 min ago:
    `CreateContainerConfigError` with the message kubelet_pods.go writes."""
    faults.ignore_in_kwok(hkube, pod=(ns, pod))
    long_ago = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=3)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    raw = hkube.api.sanitize_for_serialization(hkube.core.read_namespaced_pod(pod, ns))
    trainer = raw["spec"]["containers"][0]
    status = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": long_ago}],
        "containerStatuses": [{
            "name": trainer["name"], "image": trainer["image"], "ready": False,
            "restartCount": 0, "started": False,
            "state": {"waiting": {"reason": "CreateContainerConfigError",
                                  "message": 'secret "wandb-key" not found'},
                      "running": None, "terminated": None},
        }],
    }  # fmt: skip
    hkube.core.patch_namespaced_pod_status(pod, ns, {"status": status})


def test_a_failed_job_holds_nothing_and_one_recreated_under_its_name_starts_clean(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any
) -> None:
    ns = rtj_ns.name
    run_operator()
    pods = by_rank(start_job(rtj_api, ns, "llm", URI, replicas=2))
    for pod in pods.values():
        _config_error(hkube, ns, pod["metadata"]["name"])
    status = wait_phase(rtj_api, ns, "llm", "Failed")
    assert status["attempts"][0]["failureClass"] == "ConfigError", status
    # no JobSet, so no Workload holding quota and no pod holding GPUs
    wait_for("the failed job's JobSet gone", lambda: not jobsets_of(rtj_api, ns, "llm"), WAIT)
    wait_for("its pods gone", lambda: not pods_of(rtj_api, ns, "llm"), WAIT)
    wait_for("no quota in use", lambda: not hkube.kueue_list("workloads", ns), WAIT)

    # the runbook: fix, delete, apply again under the same name
    rtj_api.delete_rtj(ns, "llm")
    wait_for("the old job gone", lambda: _gone(rtj_api, ns, "llm"), WAIT)
    fresh = start_job(rtj_api, ns, "llm", URI, replicas=2)
    assert len(fresh) == 2
    time.sleep(6)  # past the settle window: nothing of the old job fails the new one
    status = rtj_status(rtj_api, ns, "llm")
    assert (status["phase"], status["attempt"]) == ("Running", 1), status
    assert not any(r.get("failureClass") for r in status.get("attempts") or [])


@pytest.mark.s3
def test_a_crash_of_the_resume_init_container_never_marks_a_step_bad(
    rtj_api: Kube, hkube: Any, rtj_ns: Any, run_operator: Any, s3_root: str, tmp_path: Any
) -> None:
    from e2e.operator_proc import publish_steps

    ns = rtj_ns.name
    publish_steps(s3_root, [100], tmp_path, run_id=f"{ns}.llm")
    run_operator()
    pods = by_rank(start_job(rtj_api, ns, "llm", s3_root, replicas=2))
    # an image with rtj-shim but without boto3: Python's traceback, no JSON verdict
    crash = (
        "Traceback (most recent call last):\n"
        '  File "/usr/local/bin/rtj-shim", line 5, in <module>\n'
        "    from rtj_shim.cli import main\n"
        "ModuleNotFoundError: No module named 'boto3'"
    )
    kubelet_reports_init_failure(hkube, ns, pods[0]["metadata"]["name"], exit_code=1, message=crash)
    terminate_ranks(hkube, ns, [pods[1]], lambda r: NCCL_TIMEOUT.format(rank=r))
    record = failed_record(rtj_api, ns, "llm", 1)
    assert record["failureClass"] != "CheckpointCorrupt", record
    status = rtj_status(rtj_api, ns, "llm")
    assert not status.get("badSteps"), status


class BlackHole:
    """A loopback endpoint that accepts connections and never answers (a black-holed S3
    endpoint: the TCP handshake completes, the HTTP response never comes)."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[Any] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True, name="black-hole").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)  # never read, never answered

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.s3
def test_a_black_holed_store_of_one_job_does_not_delay_another_jobs_start(
    rtj_api: Kube, rtj_ns: Any, run_operator: Any, s3_root: str, s3_server: Any, tmp_path: Any
) -> None:
    import base64

    from e2e.operator_proc import publish_steps

    ns = rtj_ns.name
    hole = BlackHole()
    try:
        secret = {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hole", "namespace": ns},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in {
                "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                "AWS_ENDPOINT_URL_S3": hole.url, "AWS_DEFAULT_REGION": "us-east-1"}.items()},
        }  # fmt: skip
        rtj_api.request("create secret", "POST", f"/api/v1/namespaces/{ns}/secrets", secret)
        run_operator("--store-read-timeout", "20")
        stuck_uri = "s3://somewhere-unreachable/team-a/stuck"
        for i in range(3):  # more jobs on the black hole than reads it may hold at once
            rtj_api.create_rtj(ns, rtj_body(f"stuck-{i}", ns, stuck_uri, checkpoint={
                "uri": stuck_uri, "credentialsSecretRef": {"name": "hole"}}))  # fmt: skip
        time.sleep(1)  # their first reads are in flight, waiting on the black hole
        publish_steps(s3_root, [100], tmp_path, run_id=f"{ns}.ok")
        ok = start_job(rtj_api, ns, "ok", s3_root, replicas=2)  # reads its own store
        assert len(ok) == 2
        for i in range(3):  # still waiting for their store: the other job was not held up
            assert rtj_status(rtj_api, ns, f"stuck-{i}").get("attempt", 0) == 0

        def unreadable() -> dict[str, Any] | None:
            return condition_true(rtj_status(rtj_api, ns, "stuck-0"), "CheckpointUnreadable")

        cond = wait_for("the black-holed job's condition", unreadable, WAIT)
        assert "no answer" in cond["message"], cond
    finally:
        hole.close()
