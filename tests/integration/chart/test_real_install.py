"""The real install: the README's install section, command for command (the README is the
script: `make images`, `ctr images import`, `helm install`, `kubectl rollout status`), on the
harness's real node (kubelet + containerd, e2e/cluster/real_node.py), in its `rtj-system`
namespace made to enforce restricted Pod Security. Both replicas run in real containers under
the chart's ServiceAccount, reach the API server at the `kubernetes` Service as any in-cluster
client, pass the kubelet's probes (/healthz, /readyz), and one leads; when the leader's pod is
killed (SIGKILL, no release of the Lease), another replica takes the Lease over.

Then jobs through that installed operator, in real containers of a root image (the resolver
image's layers under a config with `User: 0`, as NGC and Hugging Face images run; the operator
adds no runAsNonRoot): Kueue admits them into a flavor of the real node; a worker killed
mid-run resumes on attempt 2 from the newest step our resolver image verified and ends with the
fault-free result; a worker over its memory limit is OOM-killed by its cgroup and the job's
failure is OutOfMemory."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from rtj_chart import REPO, helm, tool

from e2e.cluster.kube import KUEUE_GROUP, KUEUE_VERSION
from e2e.cluster.real_node import LABEL, TAINT, RealNode, record
from e2e.operator_proc import client, rtj_body, rtj_status, wait_for
from e2e.scenarios.scenario_support import failed_record
from rtj_operator.api import keys

pytestmark = [pytest.mark.cluster, pytest.mark.local_only, pytest.mark.timeout(420)]

Obj = dict[str, Any]
RELEASE = "rtj"
FULLNAME = "rtj-resilient-training-operator"


# --- the README's install section, run as written --------------------------------------------

README = REPO / "README.md"
NAMESPACE = "rtj-system"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
REGISTRY_PATH = "skopeo copy"
"""Marks the README's block for installing from a registry: not run (the test machine has
no registry); the block without one, importing into the node's containerd, is."""
HELM_INSTALL = (
    f"helm install {RELEASE} charts/resilient-training-operator -n {NAMESPACE} --create-namespace"
)
"""Substitution 1 of 1, PIN_TO_THE_REAL_NODE: this README line gains ``-f <values>`` that
place the replicas on the harness's real node (its label and taint; the cluster's other
nodes are KWOK's, which run no container). Nothing else of a README line is changed."""
IMPORTS = [f"ctr -n k8s.io images import dist/images/{image}.oci.tar"
           for image in ("rtj-operator", "rtj-resolver")]  # fmt: skip
"""Run as written; ``CONTAINERD_ADDRESS`` (ctr's own variable) points them at the real
node's containerd, which has a socket of its own."""
# What else differs on the test machine is environment, not text (readme_env): KUBECONFIG
# (the harness's cluster), CONTAINERD_ADDRESS (the real node's containerd), PATH (the pinned
# helm and kubectl first, as `make cluster-build` builds them).


def install_commands(text: str) -> list[str]:
    """The commands of the README's install section, in order: its fenced bash blocks but the
    registry one, continuation lines joined, comments and blank lines dropped."""
    section = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for lang, block in FENCE.findall(section):
        if lang != "bash" or REGISTRY_PATH in block:
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(" ".join(line.split()))
    return commands


def substituted(commands: list[str], values: Path) -> list[str]:
    """The README's commands with PIN_TO_THE_REAL_NODE applied; each substitution (and each
    line run for its effect on this machine) must match exactly one README line."""
    for line in (HELM_INSTALL, *IMPORTS):
        assert commands.count(line) == 1, f"the README's install section lost {line!r}"
    return [f"{c} -f {values}" if c == HELM_INSTALL else c for c in commands]


def run_readme(command: str, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
    assert done.returncode == 0, f"README: {command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def readme_env(node: RealNode, kubeconfig: str, tmp: Path) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name in ("helm", "kubectl"):
        (bin_dir / name).symlink_to(tool(name))
    return {**os.environ, "KUBECONFIG": kubeconfig, "CONTAINERD_ADDRESS": str(node.socket),
            "PATH": f"{bin_dir}:{os.environ['PATH']}"}  # fmt: skip


@pytest.fixture(scope="module")
def release(
    rtj_real_node: RealNode, rtj_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The README's install section, command for command, on the real node. The namespace
    is made first, enforcing restricted Pod Security (``--create-namespace`` then finds it):
    the chart's pods must pass it."""
    tmp = tmp_path_factory.mktemp("real-install")
    core, ns = rtj_cluster.kube.core, NAMESPACE
    if _exists(rtj_cluster.kube, ns):  # left by another install of the session: start clean
        core.delete_namespace(ns)
        wait_for(f"namespace {ns} gone", lambda: not _exists(rtj_cluster.kube, ns), 120)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(
        name=ns,
        labels={"pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest"},
    )))  # fmt: skip
    values = tmp / "real-node.yaml"
    pin = {"nodeSelector": {LABEL: "true"}, "tolerations": [{**TAINT, "operator": "Equal"}]}
    values.write_text(yaml.safe_dump(pin))
    env = readme_env(rtj_real_node, rtj_cluster.kubeconfig, tmp)
    commands = substituted(install_commands(README.read_text(encoding="utf-8")), values)
    try:
        for command in commands:
            run_readme(command, env)
        yield ns
    finally:
        helm("uninstall", RELEASE, "--namespace", ns, "--kubeconfig", rtj_cluster.kubeconfig,
             "--wait", "--timeout", "60s", check=False, timeout=90)  # fmt: skip
        core.delete_namespace(ns)
        wait_for(f"namespace {ns} gone", lambda: not _exists(rtj_cluster.kube, ns), 120)


def test_the_readme_install_section_is_what_ran() -> None:
    """What the fixture runs: every command of the section but the registry block's."""
    commands = install_commands(README.read_text(encoding="utf-8"))
    assert commands[0] == "make images" and HELM_INSTALL in commands
    assert f"kubectl -n {NAMESPACE} rollout status deploy/{FULLNAME}" in commands


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


ROOT_IMAGE = "rtj.local/trainer-root:py"


def root_archive(resolver: Path, out: Path) -> Path:
    """An OCI archive of a root image: the resolver image's layers and config (python3 and
    rtj-shim on its PATH) with ``User`` 0, named ROOT_IMAGE. No download: the layers are the
    ones containerd already holds."""
    with tarfile.open(resolver) as tar:
        files = [(m.name, tar.extractfile(m)) for m in tar.getmembers() if m.isfile()]
        blobs = {name: f.read() for name, f in files if f is not None}

    def blob(digest: str) -> bytes:
        return blobs["blobs/sha256/" + digest.removeprefix("sha256:")]

    index = json.loads(blobs["index.json"])
    manifest = json.loads(blob(index["manifests"][0]["digest"]))
    config = copy.deepcopy(json.loads(blob(manifest["config"]["digest"])))
    config["config"]["User"] = "0:0"

    def put(data: bytes) -> tuple[str, int]:
        digest = hashlib.sha256(data).hexdigest()
        blobs[f"blobs/sha256/{digest}"] = data
        return f"sha256:{digest}", len(data)

    digest, size = put(json.dumps(config, sort_keys=True).encode())
    manifest = {**manifest, "config": {**manifest["config"], "digest": digest, "size": size}}
    manifest.pop("annotations", None)
    digest, size = put(json.dumps(manifest, sort_keys=True).encode())
    blobs["index.json"] = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": digest, "size": size,
                       "annotations": {"io.containerd.image.name": ROOT_IMAGE,
                                       "org.opencontainers.image.ref.name": "py"}}],
    }).encode()  # fmt: skip
    with tarfile.open(out, "w") as tar:
        for name, data in sorted(blobs.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


@pytest.fixture(scope="module")
def root_image(rtj_real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = root_archive(rtj_real_node.archives["rtj-resolver"],
                       tmp_path_factory.mktemp("root-image") / "root.oci.tar")  # fmt: skip
    done = rtj_real_node.ctr("images", "import", "--snapshotter", "overlayfs", str(out))
    assert done.returncode == 0, done.stderr
    return ROOT_IMAGE


def _job(image: str, ns: str, name: str, store: Path, command: list[str]) -> Obj:
    """Nothing about identity in the template: the root image runs as root."""
    body = rtj_body(name, ns, "file:///ckpt", replicas=1)
    body["spec"]["template"]["spec"] = {
        "containers": [{
            "name": "trainer", "image": image, "imagePullPolicy": "Never",
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
    """Writable by root only (0755): only a trainer running as root can save into it; the
    operator's resume container (uid 65532) reads what umask 022 left readable."""
    store = tmp_path / "ckpt"
    store.mkdir()
    store.chmod(0o755)
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
    release: str,
    rtj_real_node: RealNode,
    rtj_cluster: Any,
    job_ns: str,
    root_image: str,
    tmp_path: Path,
) -> None:
    node, ns = rtj_real_node, job_ns
    store = _store(tmp_path)
    api = client(rtj_cluster.kubeconfig)
    train = ["/usr/bin/python3", "/opt/train/train.py"]
    api.create_rtj(ns, _job(root_image, ns, "chain", store, train))

    def running_after_a_save() -> Obj | None:
        pod = _pod_of(rtj_cluster, ns, "chain", 1)
        saved = [p for p in (store / "steps").glob("*") if (p / "COMMITTED").exists()]
        return pod if pod and saved and pod["status"].get("phase") == "Running" else None

    try:
        pod = wait_for("attempt 1 running with a committed step", running_after_a_save, 180)
    except TimeoutError as exc:
        now = _pod_of(rtj_cluster, ns, "chain", 1)
        logs = {c: node.container_log(ns, now["metadata"]["name"], c)[-2000:]
                for c in (keys.RESUME_INIT_CONTAINER, "trainer")} if now else {}  # fmt: skip
        status = rtj_status(api, ns, "chain")
        raise AssertionError(f"{exc}; pod {now and now['status']}; logs {logs}; {status}") from exc
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
    saved = [p for p in (store / "steps").rglob("*") if p.is_file()]
    assert saved and {p.stat().st_uid for p in saved} == {0}, "the root image saved as root"


def test_a_worker_over_its_memory_limit_fails_the_job_as_out_of_memory(
    release: str, rtj_cluster: Any, job_ns: str, root_image: str, tmp_path: Path
) -> None:
    ns = job_ns
    hog = "chunks = []\nwhile True: chunks.append(bytearray(16 << 20))"
    api = client(rtj_cluster.kubeconfig)
    api.create_rtj(
        ns, _job(root_image, ns, "hog", _store(tmp_path), ["/usr/bin/python3", "-c", hog])
    )
    first = failed_record(api, ns, "hog", 1)
    assert first["failureClass"] == "OutOfMemory", first
