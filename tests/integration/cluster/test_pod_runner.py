"""The local pod runner against the real API server and scheduler: pods bound to its nodes
run as local processes, and their lifecycle reaches the API server as a kubelet reports it.

Its nodes are tainted here (the session cluster is shared with tests whose pods must land
on KWOK nodes) and removed at the end; the test pods tolerate the taint.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster.kube import Kube
from e2e.podrunner.runner import NODE_LABEL, PodRunner

pytestmark = [pytest.mark.cluster, pytest.mark.local_only]
TAINT = {"key": "e2e.resilient.dev/pod-runner-test", "value": "only", "effect": "NoSchedule"}
Obj = dict[str, Any]


@pytest.fixture
def runner(rtj_cluster: Any, rtj_ns: Any, tmp_path: Path) -> Iterator[PodRunner]:
    """Set up after the test's namespace, so torn down after it is deleted: the runner is
    the kubelet that finalizes the namespace's pods."""
    prefix = f"runner-{uuid.uuid4().hex[:4]}-"
    r = PodRunner(
        rtj_cluster.kubeconfig, tmp_path / "runner", nodes=1, prefix=prefix, taints=[TAINT]
    )
    stop = threading.Event()
    thread = threading.Thread(target=r.run, args=(stop,), daemon=True)
    thread.start()
    _until("the runner's node", lambda: _node_ready(rtj_cluster.kube, f"{prefix}0"))
    yield r
    stop.set()
    r.shutdown()
    r.deregister_nodes()


def _until(what: str, fn: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


def _node_ready(kube: Kube, name: str) -> bool:
    try:
        node = kube.core.read_node(name)
    except Exception:
        return False
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    return ready and (node.metadata.labels or {}).get(NODE_LABEL) == "local"


def _pod(name: str, node: str, containers: list[Obj], init: list[Obj] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 3,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{**TAINT, "operator": "Equal"}],
            "volumes": [{"name": "shared", "emptyDir": {}}],
            "initContainers": init or [],
            "containers": containers,
        },
    }


def _sh(name: str, script: str, **extra: Any) -> Obj:
    return {
        "name": name,
        "image": "local",
        "command": ["sh", "-c", script],
        "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
        **extra,
    }


def _status(kube: Kube, ns: str, name: str) -> Obj:
    pod = kube.core.read_namespaced_pod(name, ns)
    return kube.api.sanitize_for_serialization(pod.status)  # type: ignore[no-any-return]


def _terminal(kube: Kube, ns: str, name: str) -> Obj | None:
    status = _status(kube, ns, name)
    return status if status.get("phase") in ("Succeeded", "Failed") else None


def test_init_then_containers_run_and_report_real_exits(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner
) -> None:
    kube, ns = rtj_cluster.kube, rtj_ns.name
    node = runner.node_names[0]
    init = _sh("init", "echo ready > /shared/flag; echo 'step 100 verified' > /dev/termination-log")
    main = _sh(
        "main",
        'cat /shared/flag; echo "index $IDX on $NODE"; exit 3',
        env=[
            {"name": "IDX", "value": "7"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        terminationMessagePolicy="FallbackToLogsOnError",
    )
    kube.core.create_namespaced_pod(ns, _pod("p", node, [main], [init]))
    status = _until("the pod to end", lambda: _terminal(kube, ns, "p"))
    assert status["phase"] == "Failed"
    (i,) = status["initContainerStatuses"]
    assert i["state"]["terminated"]["exitCode"] == 0
    assert i["state"]["terminated"]["message"] == "step 100 verified\n"
    (c,) = status["containerStatuses"]
    term = c["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"
    assert term["message"] == f"ready\nindex 7 on {node}", "FallbackToLogsOnError: the log's tail"
    assert term["finishedAt"] >= term["startedAt"]
    assert status["podIP"] == "127.0.0.1"


def test_a_failing_init_container_fails_the_pod_and_the_container_never_starts(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner, tmp_path: Path
) -> None:
    kube, ns = rtj_cluster.kube, rtj_ns.name
    marker = tmp_path / "started"
    init = _sh("init", "echo 'no verified step' > /dev/termination-log; exit 2")
    main = _sh("main", f"touch {marker}")
    kube.core.create_namespaced_pod(ns, _pod("p", runner.node_names[0], [main], [init]))
    status = _until("the pod to end", lambda: _terminal(kube, ns, "p"))
    assert status["phase"] == "Failed"
    term = status["initContainerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["message"]) == (2, "no verified step\n")
    assert "waiting" in status["containerStatuses"][0]["state"]
    assert not marker.exists()


def test_deleting_a_pod_terminates_its_process_tree_then_finalizes_it(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner, tmp_path: Path
) -> None:
    kube, ns = rtj_cluster.kube, rtj_ns.name
    pids = tmp_path / "pids"
    # the entrypoint ignores SIGTERM and starts a worker in a session of its own (as torchrun
    # does): both must be gone once the grace period has passed
    script = (
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "w = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{w.pid}}')\n"
        "time.sleep(300)\n"
    )
    main = {"name": "main", "image": "local", "command": ["python", "-c", script]}
    kube.core.create_namespaced_pod(ns, _pod("p", runner.node_names[0], [main]))
    _until("the pod to run", lambda: _status(kube, ns, "p").get("phase") == "Running")
    _until("the processes", lambda: pids.exists() and pids.read_text())
    entry, worker = (int(x) for x in pids.read_text().split())
    t0 = time.monotonic()
    kube.core.delete_namespaced_pod("p", ns)

    def gone() -> bool:
        try:
            kube.core.read_namespaced_pod("p", ns)
            return False
        except Exception:
            return True

    _until("the pod to be finalized", gone, 30)
    assert time.monotonic() - t0 >= 2.5, "the grace period (3 s) was honored"
    for pid in (entry, worker):
        assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid), f"pid {pid} survived"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_a_command_that_does_not_exist_exits_127_like_a_runtime_reports_it(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner
) -> None:
    kube, ns = rtj_cluster.kube, rtj_ns.name
    init = {"name": "init", "image": "local", "command": ["no-such-program-rtj"]}
    main = _sh("main", "exit 0")
    kube.core.create_namespaced_pod(ns, _pod("p", runner.node_names[0], [main], [init]))
    status = _until("the pod to end", lambda: _terminal(kube, ns, "p"))
    assert status["phase"] == "Failed"
    assert status["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 127
