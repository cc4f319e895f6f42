"""The real install: `helm install` of the chart with the operator image `make images` built,
on the harness's real node (kubelet + containerd, e2e/cluster/real_node.py), in a namespace
enforcing restricted Pod Security. Both replicas run in real containers under the chart's
ServiceAccount, reach the API server at the `kubernetes` Service as any in-cluster client,
pass the kubelet's probes (/healthz, /readyz), and one leads; when the leader's pod is
killed (SIGKILL, no release of the Lease), another replica takes the Lease over.

Then jobs through that installed operator, in real containers: Kueue admits them into a
flavor of the real node; a worker killed mid-run resumes on attempt 2 from the newest step
our resolver image verified and ends with the fault-free result; a worker over its memory
limit is OOM-killed by its cgroup and the job's failure is OutOfMemory."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from rtj_chart import CHART, helm, set_args

from e2e.cluster.kube import KUEUE_GROUP, KUEUE_VERSION
from e2e.cluster.real_node import LABEL, TAINT, RealNode, record
from e2e.operator_proc import client, rtj_body, rtj_status, wait_for
from e2e.scenarios.scenario_support import failed_record
from rtj_operator.api import keys

pytestmark = [pytest.mark.cluster, pytest.mark.local_only, pytest.mark.timeout(420)]

Obj = dict[str, Any]
RELEASE = "rtj"
FULLNAME = "rtj-resilient-training-operator"


@pytest.fixture(scope="module")
def release(
    rtj_real_node: RealNode, rtj_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    tmp_path = tmp_path_factory.mktemp("real-install")
    core = rtj_cluster.kube.core
    ns = f"rtj-real-{uuid.uuid4().hex[:6]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(
        name=ns,
        labels={"pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest"},
    )))  # fmt: skip
    values = {
        "image": {"pullPolicy": "Never"},  # imported into the node's containerd, no registry
        "nodeSelector": {LABEL: "true"},
        "tolerations": [{**TAINT, "operator": "Equal"}],
    }
    kubeconfig = rtj_cluster.kubeconfig
    try:
        helm("install", RELEASE, str(CHART), "--namespace", ns, "--kubeconfig", kubeconfig,
             *set_args(values, tmp_path), "--wait", "--timeout", "180s", timeout=240)  # fmt: skip
        yield ns
    finally:
        helm("uninstall", RELEASE, "--namespace", ns, "--kubeconfig", kubeconfig, "--wait",
             "--timeout", "60s", check=False, timeout=90)  # fmt: skip
        core.delete_namespace(ns)


def _holder(rtj_cluster: Any, ns: str) -> str | None:
    try:
        lease = rtj_cluster.kube.coord.read_namespaced_lease(FULLNAME, ns)
    except k8s.ApiException:
        return None
    return lease.spec.holder_identity  # type: ignore[no-any-return]


def test_the_chart_runs_our_operator_image_on_a_real_node_and_the_standby_takes_over(
    release: str, rtj_real_node: RealNode, rtj_cluster: Any
) -> None:
    core, ns = rtj_cluster.kube.core, release
    pods = core.list_namespaced_pod(ns, label_selector=f"app.kubernetes.io/instance={RELEASE}")
    assert len(pods.items) == 2
    for pod in pods.items:
        assert pod.spec.node_name == rtj_real_node.name
        status = pod.status.container_statuses[0]
        assert status.ready and status.image == rtj_real_node.refs["rtj-operator"], status
        assert status.restart_count == 0, f"{pod.metadata.name} restarted: {status}"
    names = {p.metadata.name for p in pods.items}
    try:
        leader = wait_for("a leader", lambda: _holder(rtj_cluster, ns), 60)
    except TimeoutError as exc:
        logs = {n: rtj_real_node.container_log(ns, n, "operator")[-3000:] for n in names}
        raise AssertionError(f"{exc}; the operators' logs: {logs}") from exc
    assert leader in names

    core.delete_namespaced_pod(leader, ns, grace_period_seconds=0)  # SIGKILL: no release
    # the Lease expires after leaseDurationSeconds (15) unrenewed; the standby retries every
    # 2 s, and so does the pod the Deployment starts in the killed one's place: either may win
    try:
        successor = wait_for(
            "another replica to lead",
            lambda: (h := _holder(rtj_cluster, ns)) is not None and h != leader and h,
            90,
        )
    except TimeoutError as exc:
        now = core.list_namespaced_pod(ns).items
        logs = {p.metadata.name: rtj_real_node.container_log(ns, p.metadata.name, "operator")
                [-2000:] for p in now}  # fmt: skip
        raise AssertionError(f"{exc}; holder {_holder(rtj_cluster, ns)}; logs {logs}") from exc
    assert isinstance(successor, str)

    def ready_leader() -> bool:
        pod = core.read_namespaced_pod(successor, ns)
        return bool(pod.status.container_statuses and pod.status.container_statuses[0].ready)

    # its /readyz says "leading; caches synced" once it has listed everything
    wait_for(f"{successor} ready as the leader", ready_leader, 60)


# --- jobs through the installed operator, in real containers ------------------------------

STEPS, EVERY = 40, 5
TRAIN = f'''\
"""A deterministic trainer without a framework: a hash chain, one link per step, saved every
{EVERY} steps with `rtj-shim commit` and resumed from what the resume init container
verified (resume.json), the way docs/shim.md describes it for any framework."""
import hashlib, json, os, pathlib, subprocess, sys, tempfile, time
from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.storage import open_store

uri = os.environ["RTJ_CHECKPOINT_URI"]
resume = json.loads(pathlib.Path(os.environ["RTJ_RESUME_FILE"]).read_text())
step, state = 0, hashlib.sha256(b"seed").hexdigest()
if resume["step"] is not None:
    step = resume["step"]
    state = open_store(uri).read(step_key(step) + "/state.txt").decode()
print(f"attempt {{os.environ['RTJ_ATTEMPT']}} starts at step {{step}}", flush=True)
while step < {STEPS}:
    step += 1
    state = hashlib.sha256(f"{{state}}/{{step}}".encode()).hexdigest()
    time.sleep(0.25)
    if step % {EVERY} == 0:
        with tempfile.TemporaryDirectory() as d:
            pathlib.Path(d, "state.txt").write_text(state)
            subprocess.run(["rtj-shim", "commit", "--root", uri, "--step", str(step),
                            "--from", d], check=True, stdout=subprocess.DEVNULL)
        print(f"step {{step}} saved", flush=True)
pathlib.Path("/dev/termination-log").write_text(json.dumps({{"step": step, "state": state}}))
'''


def _expected_state() -> str:
    state = hashlib.sha256(b"seed").hexdigest()
    for step in range(1, STEPS + 1):
        state = hashlib.sha256(f"{state}/{step}".encode()).hexdigest()
    return state


@pytest.fixture
def job_ns(rtj_real_node: RealNode, rtj_cluster: Any) -> Iterator[str]:
    """A namespace whose LocalQueue admits into the real node's flavor (Kueue adds its node
    label and toleration to the pods); the checkpoint store is a hostPath on the node."""
    kube = rtj_cluster.kube
    ns = f"rtj-jobs-{uuid.uuid4().hex[:6]}"
    kube.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
    flavor, cq = f"real-node-{ns}", f"cq-{ns}"
    kube.kueue_create("resourceflavors", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ResourceFlavor",
        "metadata": {"name": flavor},
        "spec": {"nodeLabels": {LABEL: "true"},
                 "tolerations": [{**TAINT, "operator": "Equal"}]},
    })  # fmt: skip
    kube.kueue_create("clusterqueues", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ClusterQueue",
        "metadata": {"name": cq},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                "name": flavor, "resources": [{"name": "cpu", "nominalQuota": "8"},
                                              {"name": "memory", "nominalQuota": "8Gi"}]}]}],
        },
    })  # fmt: skip
    kube.kueue_create("localqueues", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "LocalQueue",
        "metadata": {"name": "team-a", "namespace": ns}, "spec": {"clusterQueue": cq},
    }, namespace=ns)  # fmt: skip
    kube.core.create_namespaced_config_map(
        ns, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="train"), data={"train.py": TRAIN})
    )
    try:
        yield ns
    finally:
        kube.core.delete_namespace(ns)
        wait_for(f"namespace {ns} gone", lambda: not _exists(kube, ns), 120)
        for plural, name in (("clusterqueues", cq), ("resourceflavors", flavor)):
            kube.custom.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)


def _exists(kube: Any, ns: str) -> bool:
    try:
        kube.core.read_namespace(ns)
    except k8s.ApiException:
        return False
    return True


def _job(node: RealNode, ns: str, name: str, store: Path, command: list[str]) -> Obj:
    body = rtj_body(name, ns, "file:///ckpt", replicas=1)
    body["spec"]["template"]["spec"] = {
        "containers": [{
            "name": "trainer", "image": node.refs["rtj-resolver"], "imagePullPolicy": "Never",
            "command": command,
            "resources": {"requests": {"cpu": "200m", "memory": "64Mi"},
                          "limits": {"cpu": "1", "memory": "128Mi"}},
            "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"},
                             {"name": "train", "mountPath": "/opt/train", "readOnly": True}],
        }],
        "volumes": [
            {"name": "ckpt", "hostPath": {"path": str(store), "type": "Directory"}},
            {"name": "train", "configMap": {"name": "train"}},
        ],
    }  # fmt: skip
    return body


def _store(tmp_path: Path) -> Path:
    store = tmp_path / "ckpt"
    store.mkdir()
    store.chmod(0o777)  # the trainer runs as the image's non-root user
    tmp_path.chmod(0o755)
    return store


def _pod_of(rtj_cluster: Any, ns: str, name: str, attempt: int) -> Obj | None:
    pods = rtj_cluster.kube.core.list_namespaced_pod(
        ns, label_selector=f"{keys.JOB_LABEL}={name},{keys.ATTEMPT_LABEL}={attempt}"
    ).items
    body = rtj_cluster.kube.api.sanitize_for_serialization(pods[0]) if pods else None
    return body  # type: ignore[no-any-return]


def _failed_pod(rtj_cluster: Any, ns: str, name: str) -> Obj | None:
    """Attempt 1's worker once its trainer has terminated (before the operator deletes it)."""
    pod = _pod_of(rtj_cluster, ns, name, 1)
    return pod if _terminated(pod, "trainer") else None


def _terminated(pod: Obj | None, container: str, field: str = "containerStatuses") -> Obj | None:
    for status in ((pod or {}).get("status") or {}).get(field) or []:
        if status["name"] == container:
            return (status.get("state") or {}).get("terminated")  # type: ignore[no-any-return]
    return None


def test_a_killed_worker_in_a_real_container_resumes_a_verified_step_to_the_same_result(
    release: str, rtj_real_node: RealNode, rtj_cluster: Any, job_ns: str, tmp_path: Path
) -> None:
    node, ns = rtj_real_node, job_ns
    store = _store(tmp_path)
    api = client(rtj_cluster.kubeconfig)
    api.create_rtj(ns, _job(node, ns, "chain", store, ["/usr/bin/python3", "/opt/train/train.py"]))

    def running_after_a_save() -> Obj | None:
        pod = _pod_of(rtj_cluster, ns, "chain", 1)
        saved = [p for p in (store / "steps").glob("*") if (p / "COMMITTED").exists()]
        return pod if pod and saved and pod["status"].get("phase") == "Running" else None

    pod = wait_for("attempt 1 running with a committed step", running_after_a_save, 180)
    trainer = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "trainer")
    killed = node.ctr("tasks", "kill", "-s", "SIGKILL", trainer["containerID"].split("//")[-1])
    assert killed.returncode == 0, killed.stderr

    deadline = time.monotonic() + 10  # best effort, for the recorded corpus (RTJ_RECORD_DIR):
    while time.monotonic() < deadline:  # the operator deletes the old world within a second
        if failed := _failed_pod(rtj_cluster, ns, "chain"):
            record(failed, "sigkill_no_cause")
            break
        time.sleep(0.05)
    first = failed_record(api, ns, "chain", 1)
    # a SIGKILL with nothing in the message: no node is blamed, the whole world restarts
    assert first["failureClass"] == "Unknown" and not first["quarantinedNodes"], first
    final = wait_for(
        "attempt 2's trainer finished",
        lambda: _terminated(_pod_of(rtj_cluster, ns, "chain", 2), "trainer"),
        180,
    )
    resolved = _terminated(
        _pod_of(rtj_cluster, ns, "chain", 2), keys.RESUME_INIT_CONTAINER, "initContainerStatuses"
    )
    assert resolved is not None and json.loads(resolved["message"])["step"] >= EVERY, resolved
    assert final["exitCode"] == 0, final
    assert json.loads(final["message"]) == {"step": STEPS, "state": _expected_state()}
    wait_for("the job Succeeded", lambda: rtj_status(api, ns, "chain").get("phase") == "Succeeded",
             60)  # fmt: skip


def test_a_worker_over_its_memory_limit_fails_the_job_as_out_of_memory(
    release: str, rtj_real_node: RealNode, rtj_cluster: Any, job_ns: str, tmp_path: Path
) -> None:
    node, ns = rtj_real_node, job_ns
    hog = "chunks = []\nwhile True: chunks.append(bytearray(16 << 20))"
    api = client(rtj_cluster.kubeconfig)
    api.create_rtj(ns, _job(node, ns, "hog", _store(tmp_path), ["/usr/bin/python3", "-c", hog]))
    first = failed_record(api, ns, "hog", 1)
    assert first["failureClass"] == "OutOfMemory", first
