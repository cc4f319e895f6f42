"""The local pod runner against the real API server and scheduler: pods bound to its nodes
run as local processes, and their lifecycle reaches the API server as a kubelet reports it:
init containers, native sidecars (init containers with ``restartPolicy: Always``) and the
main containers, each pod on an IP address of its own.

Its nodes are tainted here (the session cluster is shared with tests whose pods must land
on KWOK nodes) and removed at the end; the test pods tolerate the taint.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
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
    conditions = (node.status.conditions if node.status else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    labels = (node.metadata.labels if node.metadata else None) or {}
    return ready and labels.get(NODE_LABEL) == "local"


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
    return kube.api.sanitize_for_serialization(pod.status)  # type: ignore[no-untyped-call,no-any-return]


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
    _assert_own_pod_ip(status)


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
    _until("the pod to be finalized", lambda: _gone(kube, ns, "p"), 30)
    assert time.monotonic() - t0 >= 2.5, "the grace period (3 s) was honored"
    for pid in (entry, worker):
        assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid), f"pid {pid} survived"


def test_a_deleted_pod_reports_its_terminal_phase_before_its_finalizer_lets_it_go(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner
) -> None:
    """As the kubelet since Kubernetes 1.27 (kubernetes/kubernetes#115331): a deleted pod's
    status turns terminal (every container terminated, phase Failed) once its processes are
    gone, while a finalizer (a Job's tracking finalizer) still keeps the object."""
    kube, ns = rtj_cluster.kube, rtj_ns.name
    main = {"name": "main", "image": "local", "command": ["sleep", "300"]}
    body = _pod("held", runner.node_names[0], [main])
    body["metadata"]["finalizers"] = ["example.com/hold"]
    kube.core.create_namespaced_pod(ns, body)
    _until("the pod to run", lambda: _status(kube, ns, "held").get("phase") == "Running")
    kube.core.delete_namespaced_pod("held", ns)
    _until("the terminal phase", lambda: _status(kube, ns, "held").get("phase") == "Failed", 30)
    status = _status(kube, ns, "held")
    (container,) = status["containerStatuses"]
    assert container["state"]["terminated"]["exitCode"] == 128 + 15, container  # SIGTERM
    kube.core.patch_namespaced_pod("held", ns, {"metadata": {"finalizers": None}})
    _until("the pod to go", lambda: _gone(kube, ns, "held"), 30)


def _gone(kube: Kube, ns: str, name: str) -> bool:
    try:
        kube.core.read_namespaced_pod(name, ns)
        return False
    except Exception:
        return True


# Not stopped: running, sleeping, or in an uninterruptible wait (proc(5) "D"), which a busy
# shell enters for a moment while it forks its next `sleep` on a loaded machine (CI saw it).
_AWAKE = ("R", "S", "D")


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


# --- pod IPs and native sidecars ------------------------------------------------------------


def _assert_own_pod_ip(status: Obj) -> str:
    """A loopback address of the pod's own (never the node's), reported as a kubelet does."""
    ip = status["podIP"]
    assert ipaddress.IPv4Address(ip).is_loopback and ip != "127.0.0.1", ip
    assert status["podIPs"] == [{"ip": ip}]
    assert (status["hostIP"], status["hostIPs"]) == ("127.0.0.1", [{"ip": "127.0.0.1"}])
    return str(ip)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(ip: str, port: int, path: str) -> Any:
    """The JSON answer of ``http://ip:port/path``, or None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}{path}", timeout=2) as r:
            return json.loads(r.read())
    except (OSError, urllib.error.URLError, ValueError):
        return None


POD_IP_ENV = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def _progress_sidecar(port: int) -> Obj:
    """The operator's progress sidecar, as it renders it: a native sidecar on the pod's IP."""
    return {
        "name": "rtj-progress",
        "image": "local",
        "restartPolicy": "Always",
        "command": ["rtj-shim", "progress-server", "--dir", "/var/run/rtj/progress",
                    "--port", str(port), "--host", "$(POD_IP)"],
        "env": POD_IP_ENV,
        "ports": [{"name": "rtj-progress", "containerPort": port}],
        "volumeMounts": [{"name": "shared", "mountPath": "/var/run/rtj", "readOnly": True}],
    }  # fmt: skip


def _sidecar(name: str, script: str) -> Obj:
    return _sh(name, script, restartPolicy="Always")


def _wait_for(go: Path) -> str:
    """A shell loop that ends once the test creates ``go`` (a host path, not a mount)."""
    return f"while [ ! -e {go} ]; do sleep 0.1; done"


# exits with the given code on SIGTERM, never on its own
def _until_term(code: int, before: str = "") -> str:
    return f"trap '{before}exit {code}' TERM; while true; do sleep 0.1; done"


def _conditions(status: Obj) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


def _running(kube: Kube, ns: str, name: str) -> Obj | None:
    status = _status(kube, ns, name)
    inits = status.get("initContainerStatuses") or []
    sidecars_up = all(s.get("started") for s in inits if "running" in s["state"])
    return status if status.get("phase") == "Running" and sidecars_up else None


def _pod_dir(kube: Kube, runner: PodRunner, ns: str, name: str) -> Path:
    pod = kube.core.read_namespaced_pod(name, ns)
    raw: Obj = kube.api.sanitize_for_serialization(pod)  # type: ignore[no-untyped-call]
    return runner.dirs_for(raw).volume("shared")


def test_a_native_sidecar_serves_on_the_pod_ip_and_never_keeps_a_finished_pod_running(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner, tmp_path: Path
) -> None:
    kube, ns = rtj_cluster.kube, rtj_ns.name
    port, go = _free_port(), tmp_path / "go"
    prepare = _sh("rtj-resume", "mkdir -p /shared/progress; echo prepared > /shared/flag")
    main = _sh(
        "main",
        'cat /shared/flag; echo "$POD_IP $POD_IPS $HOST_IP" > /shared/ips; ' + _wait_for(go),
        env=[
            *POD_IP_ENV,
            {"name": "POD_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
            {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        ],
    )
    kube.core.create_namespaced_pod(
        ns, _pod("p", runner.node_names[0], [main], [prepare, _progress_sidecar(port)])
    )
    status = _until("the pod to run", lambda: _running(kube, ns, "p"))
    ip = _assert_own_pod_ip(status)
    done, side = status["initContainerStatuses"]
    assert done["state"]["terminated"]["exitCode"] == 0 and done["ready"] is True
    assert "running" in side["state"], side
    assert (side["started"], side["ready"], side["restartCount"]) == (True, True, 0)
    assert _conditions(status) == {
        "PodReadyToStartContainers": "True", "Initialized": "True", "Ready": "True",
        "ContainersReady": "True", "PodScheduled": "True",
    }  # fmt: skip

    health = _until("the sidecar to answer on the pod IP", lambda: _get(ip, port, "/healthz"))
    assert health is not None
    assert isinstance(_get(ip, port, "/progress"), dict)
    assert _get("127.0.0.1", port, "/healthz") is None, "bound to the pod's IP only"
    shared = _pod_dir(kube, runner, ns, "p")
    ips = _until("the main container's env", lambda: (shared / "ips").exists() and shared)
    assert (ips / "ips").read_text() == f"{ip} {ip} 127.0.0.1\n", "downward API"

    go.touch()  # the main container exits 0; the sidecar never exits on its own
    status = _until("the pod to end", lambda: _terminal(kube, ns, "p"), 30)
    assert status["phase"] == "Succeeded"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    side = status["initContainerStatuses"][1]
    assert side["state"]["terminated"]["exitCode"] == 0, "stopped by SIGTERM, which it handles"
    assert (side["started"], side["ready"], side["restartCount"]) == (False, False, 0)
    assert _get(ip, port, "/healthz") is None, "the sidecar is gone with the pod"
    assert _status(kube, ns, "p")["podIP"] == ip, "the status keeps the pod's IP"


def test_two_pods_sidecars_listen_on_the_same_port_each_on_its_own_ip(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner, tmp_path: Path
) -> None:
    kube, ns = rtj_cluster.kube, rtj_ns.name
    port, go = _free_port(), tmp_path / "go"
    for name in ("a", "b"):
        main = _sh("main", _wait_for(go))
        kube.core.create_namespaced_pod(
            ns, _pod(name, runner.node_names[0], [main], [_progress_sidecar(port)])
        )
    ips = []
    for name in ("a", "b"):
        status = _until(f"{name} to run", lambda n=name: _running(kube, ns, n))
        ips.append(_assert_own_pod_ip(status))
    assert ips[0] != ips[1]
    for ip in ips:  # both listen at the same time
        assert _until(f"the sidecar on {ip}", lambda ip=ip: _get(ip, port, "/healthz")) is not None
    for name in "ab":
        (side,) = _status(kube, ns, name)["initContainerStatuses"]
        assert "running" in side["state"] and side["restartCount"] == 0, side
    go.touch()
    for name in "ab":
        assert _until(f"{name} to end", lambda n=name: _terminal(kube, ns, n), 30)["phase"] == (
            "Succeeded"
        )


def test_a_sidecar_that_crashes_is_restarted_while_the_main_container_runs(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner, tmp_path: Path
) -> None:
    kube, ns = rtj_cluster.kube, rtj_ns.name
    go, runs = tmp_path / "go", tmp_path / "runs"
    flaky = _sidecar(
        "flaky", f"echo run >> {runs}; echo 'gone again' > /dev/termination-log; exit 3"
    )
    kube.core.create_namespaced_pod(
        ns, _pod("p", runner.node_names[0], [_sh("main", _wait_for(go))], [flaky])
    )

    def restarted_twice() -> Obj | None:
        status = _status(kube, ns, "p")
        inits = status.get("initContainerStatuses") or [{}]
        return status if inits[0].get("restartCount", 0) >= 2 else None

    status = _until("two restarts", restarted_twice, 30)
    assert status["phase"] == "Running", "a crashing sidecar does not end the pod"
    assert "running" in status["containerStatuses"][0]["state"]
    (side,) = status["initContainerStatuses"]
    last = side["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"], last["message"]) == (3, "Error", "gone again\n")
    assert len(runs.read_text().split()) >= side["restartCount"], "each restart really ran"
    waiting = side["state"].get("waiting")
    assert waiting is None or waiting["reason"] == "CrashLoopBackOff", side

    go.touch()
    status = _until("the pod to end", lambda: _terminal(kube, ns, "p"), 30)
    assert status["phase"] == "Succeeded", "the sidecar's exits do not fail the pod"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_on_failure_a_failed_container_restarts_in_its_pod_until_it_succeeds(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner, tmp_path: Path
) -> None:
    kube, ns = rtj_cluster.kube, rtj_ns.name
    runs = tmp_path / "runs"
    # the first two runs fail (leaving a child in the container's group), the third succeeds
    script = (f"echo run >> {runs}; sleep 31.7 & "
              f"if [ $(wc -l < {runs}) -lt 3 ]; then exit 5; fi; kill $!; exit 0")  # fmt: skip
    body = _pod("p", runner.node_names[0], [_sh("main", script)])
    body["spec"]["restartPolicy"] = "OnFailure"
    kube.core.create_namespaced_pod(ns, body)
    status = _until("the pod to end", lambda: _terminal(kube, ns, "p"), 60)
    assert status["phase"] == "Succeeded"
    (main,) = status["containerStatuses"]
    assert main["restartCount"] == 2 and main["state"]["terminated"]["exitCode"] == 0
    assert main["lastState"]["terminated"]["exitCode"] == 5
    assert runs.read_text().split() == ["run"] * 3, "each restart ran in the same pod"
    leftovers = subprocess.run(["pgrep", "-f", "^sleep 31.7$"], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", "a failed run's children ended with it"


@pytest.mark.parametrize(
    ("main_code", "sidecar_code", "phase"), [(4, 0, "Failed"), (0, 7, "Succeeded")]
)
def test_the_main_containers_alone_decide_the_phase(
    rtj_cluster: Any,
    rtj_ns: Any,
    runner: PodRunner,
    tmp_path: Path,
    main_code: int,
    sidecar_code: int,
    phase: str,
) -> None:
    kube, ns = rtj_cluster.kube, rtj_ns.name
    side = _sidecar("side", _until_term(sidecar_code))
    main = _sh("main", f"sleep 1; exit {main_code}")
    kube.core.create_namespaced_pod(ns, _pod("p", runner.node_names[0], [main], [side]))
    status = _until("the pod to end", lambda: _terminal(kube, ns, "p"), 30)
    assert status["phase"] == phase
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == main_code
    (s,) = status["initContainerStatuses"]
    assert s["state"]["terminated"]["exitCode"] == sidecar_code, "stopped once the main ended"
    assert _conditions(status)["Initialized"] == "True"


def test_a_failing_init_container_after_a_sidecar_fails_the_pod_and_stops_the_sidecar(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner, tmp_path: Path
) -> None:
    kube, ns = rtj_cluster.kube, rtj_ns.name
    marker = tmp_path / "started"
    side = _sidecar("side", _until_term(0))
    init = _sh("check", "sleep 0.5; exit 2")
    main = _sh("main", f"touch {marker}")
    kube.core.create_namespaced_pod(ns, _pod("p", runner.node_names[0], [main], [side, init]))
    status = _until("the pod to end", lambda: _terminal(kube, ns, "p"), 30)
    assert status["phase"] == "Failed"
    s, i = status["initContainerStatuses"]
    assert s["state"]["terminated"]["exitCode"] == 0, "the sidecar ran, then was stopped"
    assert i["state"]["terminated"]["exitCode"] == 2
    assert "waiting" in status["containerStatuses"][0]["state"] and not marker.exists()


def test_deleting_a_pod_stops_its_sidecars_after_its_main_containers(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner, tmp_path: Path
) -> None:
    kube, ns = rtj_cluster.kube, rtj_ns.name
    order = tmp_path / "order"
    side = _sidecar("side", _until_term(0, f"echo sidecar-term >> {order}; "))
    main = _sh("main", _until_term(0, f"sleep 1; echo main-exit >> {order}; "))
    kube.core.create_namespaced_pod(ns, _pod("p", runner.node_names[0], [main], [side]))
    _until("the pod to run", lambda: _running(kube, ns, "p"))
    kube.core.delete_namespaced_pod("p", ns)
    _until("the pod to be finalized", lambda: _gone(kube, ns, "p"), 30)
    assert order.read_text().split() == ["main-exit", "sidecar-term"]


def _renewed(kube: Kube, node: str) -> str:
    lease = kube.coord.read_namespaced_lease(node, "kube-node-lease")
    return str(lease.spec.renew_time)


def test_a_node_cut_off_from_the_api_server_freezes_wakes_and_catches_up(
    rtj_cluster: Any, rtj_ns: Any, runner: PodRunner, tmp_path: Path
) -> None:
    """The harness's silent node (issue 12 drills): cut off, the node renews nothing and
    sees nothing; frozen, its processes stop; thawed while still cut off, they run on (a
    zombie); contact back, it learns its pod was deleted and kills what is left."""
    kube, ns = rtj_cluster.kube, rtj_ns.name
    node = runner.node_names[0]
    pid_file = tmp_path / "pid"
    # $$$$: the API expands $$ to $, so the shell sees $$ (its pid)
    script = f"echo $$$$ > {pid_file}; while true; do sleep 0.2; done"
    kube.core.create_namespaced_pod(ns, _pod("z", node, [_sh("main", script)]))
    _until("the pod to run", lambda: _status(kube, ns, "z").get("phase") == "Running")
    pid = int(_until("its pid", lambda: pid_file.exists() and pid_file.read_text().strip()))

    cut = runner.cut_off_file(node)
    cut.parent.mkdir(parents=True, exist_ok=True)
    cut.write_text("freeze")
    _until("the process stopped", lambda: _state(pid) == "T", 15)
    before = _renewed(kube, node)
    time.sleep(7)  # two heartbeats: nothing renewed while cut off
    assert _renewed(kube, node) == before
    kube.core.delete_namespaced_pod("z", ns, grace_period_seconds=0)  # the operator's fence
    time.sleep(4)
    assert _state(pid) == "T", "a cut-off node never hears of the delete"

    cut.write_text("")  # thawed, still cut off: a zombie
    _until("the process running again", lambda: _state(pid) in _AWAKE, 15)
    time.sleep(4)
    assert _state(pid) in _AWAKE, "still cut off: nobody stops it"

    cut.unlink()  # contact returns: the pod is gone, so are its processes
    _until("the zombie killed", lambda: _state(pid) == "Z", 20)
    _until("the Lease renewed", lambda: _renewed(kube, node) != before, 15)
