"""The demo's platform, phases 1-4 of the story: control plane, S3 store, pod runner and
operator, every process recorded in the demo's state as it starts; ``down`` stops them all."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException

from e2e.cluster import build
from e2e.cluster.cluster import LocalCluster
from e2e.cluster.cluster_state import ClusterState
from e2e.cluster.kube import Kube as HarnessKube
from e2e.cluster.processes import pid_alive
from e2e.cluster.versions import CLUSTER_PROGRAMS, load_versions
from e2e.operator_proc import REPO, OperatorProcess, client, install_crd, wait_for
from e2e.podrunner.runner import descendants
from e2e.s3server import S3Server, aws_env

from .options import (
    BUCKET,
    BUILD_MINUTES,
    NAMESPACE,
    QUEUE,
    SECRET,
    DemoError,
    Display,
    Options,
)

# --- state (what `down` must undo) -----------------------------------------------------------


def _save_state(opts: Options, data: dict[str, Any]) -> None:
    opts.state.mkdir(parents=True, exist_ok=True)
    (opts.state / "state.json").write_text(json.dumps(data, indent=2) + "\n")


def load_state(opts: Options) -> dict[str, Any]:
    try:
        data = json.loads((opts.state / "state.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _stop_pid(pid: int, grace: float = 15.0) -> None:
    if not pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        for p in [pid, *descendants(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def down(opts: Options, display: Display | None = None) -> list[str]:
    """Stop the operator, the runner (and every training process), the S3 server and the
    cluster the demo started; return what is still left (empty when clean)."""
    d = display or Display()
    state = load_state(opts)
    pids: dict[str, int] = state.get("pids", {})
    for name in ("operator", "runner", "s3"):  # the operator first: nothing reacts to teardown
        if name in pids:
            d.line(f"stopping the {name} (pid {pids[name]})")
            _stop_pid(int(pids[name]))
    left = [f"{n} (pid {p})" for n, p in pids.items() if pid_alive(int(p))]
    for pid_file in (opts.state / "runner").glob("pods/*/*/containers/*/pid"):
        pid = int(pid_file.read_text() or 0)
        if pid and pid_alive(pid) and _is_ours(pid, opts.state):
            left.append(f"training process {pid} ({pid_file.parent.name})")
    if state.get("cluster"):
        d.line(f"stopping the local cluster {state['cluster']!r}")
        left += LocalCluster(state["cluster"]).down(check=False)
    (opts.state / "state.json").unlink(missing_ok=True)
    return left


def _is_ours(pid: int, state: Path) -> bool:
    try:
        return str(state) in Path(f"/proc/{pid}/environ").read_text(errors="replace")
    except OSError:
        return False


# --- phases ----------------------------------------------------------------------------------


def _build(d: Display, names: list[str]) -> None:
    """Build what is missing, one program at a time, with a heartbeat line every 15 s."""
    missing = build.missing(names)
    if not missing:
        d.line("every program is cached in ~/.cache/rtj/bin: nothing to build")
        return
    total = sum(BUILD_MINUTES.get(n, 2) for n in missing)
    d.line(f"first run: building {', '.join(missing)} from their Go modules (~{total} min on "
           "2 cores; cached afterwards)")  # fmt: skip
    for i, name in enumerate(missing, 1):
        done = threading.Event()
        errors: list[BaseException] = []

        def work(
            n: str = name, done: threading.Event = done, errors: list[BaseException] = errors
        ) -> None:
            try:
                build.build([n], quiet=True)
            except BaseException as exc:  # reported on the main thread
                errors.append(exc)
            finally:
                done.set()

        t0 = time.monotonic()
        threading.Thread(target=work, daemon=True).start()
        d.line(f"[{i}/{len(missing)}] building {name} (~{BUILD_MINUTES.get(name, 2)} min)")
        while not done.wait(15):
            d.detail(f"... {name}: {time.monotonic() - t0:.0f}s")
        if errors:
            raise DemoError(str(errors[0]))
        d.detail(f"built {name} in {time.monotonic() - t0:.0f}s")


def _cluster(opts: Options, d: Display) -> tuple[Path, str | None]:
    """The kubeconfig to use, and the name of the local cluster started (None: external)."""
    if opts.kubeconfig is not None:
        d.line(f"using the cluster of {opts.kubeconfig} (no local control plane)")
        return opts.kubeconfig, None
    existing = ClusterState.load(opts.cluster_name)
    if existing and all(p.alive() for p in existing.procs):
        d.line(f"reusing the running local cluster {opts.cluster_name!r}")
        return existing.kubeconfig, opts.cluster_name
    d.line("etcd, kube-apiserver, controller-manager, scheduler, JobSet and Kueue (loopback)")
    kubeconfig = LocalCluster(opts.cluster_name, nodes=0).up()
    return kubeconfig, opts.cluster_name


def kubectl_path() -> Path:
    return build.binary_path("kubectl", load_versions())


def kubectl(kubeconfig: Path, *args: str, check: bool = True) -> str:
    out = build.kubectl(kubeconfig, *args)
    if check and out.returncode != 0:
        raise DemoError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout + out.stderr


def _require_crds(kube: HarnessKube) -> None:
    names = {c.metadata.name for c in kube.ext.list_custom_resource_definition().items}
    need = {"jobsets.jobset.x-k8s.io", "clusterqueues.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io"}
    if need - names:
        raise DemoError(f"the cluster lacks {sorted(need - names)}: install JobSet and Kueue first")


def _queues(kube: HarnessKube, gpus: int) -> None:
    from e2e.cluster.testenv import TestNamespace

    kube.core.create_namespace({"metadata": {"name": NAMESPACE}})
    tn = TestNamespace(kube=kube, name=NAMESPACE, cluster_queue=NAMESPACE, local_queue=QUEUE)
    try:
        kube.kueue_create("clusterqueues", tn.cluster_queue_body(gpus))
    except ApiException as exc:
        if exc.status != 409:  # kept from an earlier run (cluster-scoped)
            raise
    kube.kueue_create(
        "localqueues",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": QUEUE, "namespace": NAMESPACE},
         "spec": {"clusterQueue": NAMESPACE}},
        namespace=NAMESPACE,
    )  # fmt: skip

    def service_account() -> bool:  # pods cannot be created before it exists
        try:
            kube.core.read_namespaced_service_account("default", NAMESPACE)
            return True
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False

    wait_for("the default ServiceAccount", service_account, 30)


def _fresh_namespace(kube: HarnessKube, d: Display) -> None:
    try:
        kube.core.delete_namespace(NAMESPACE)
    except Exception:
        return
    d.line(f"deleting namespace {NAMESPACE} from an earlier run")

    def gone() -> bool:
        try:
            kube.core.read_namespace(NAMESPACE)
            return False
        except Exception:
            return True

    wait_for(f"namespace {NAMESPACE} to go", gone, 120, every=0.5)


def _secret(kube: HarnessKube, s3: S3Server) -> None:
    env = aws_env(s3.url, s3.allowed)
    kube.core.create_namespaced_secret(
        NAMESPACE,
        {
            "metadata": {"name": SECRET},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in env.items()},
        },
    )


def start_platform(
    opts: Options,
    d: Display,
    state: dict[str, Any],
    operator_args: tuple[str, ...] = (),
) -> tuple[Path, HarnessKube, Any]:
    """Phases 1-4: control plane, S3 store, pod runner, operator; every process started is
    recorded in ``state`` (state.json) at once, so ``down`` stops it whatever fails next."""
    d.phase("1/7 Control plane")
    if opts.kubeconfig is None:
        _build(d, [*CLUSTER_PROGRAMS, "kubectl"])
    kubeconfig, cluster = _cluster(opts, d)
    state["cluster"] = cluster
    state["kubeconfig"] = str(kubeconfig)
    _save_state(opts, state)
    kube = HarnessKube(kubeconfig)
    api = client(str(kubeconfig))
    _require_crds(kube)
    install_crd(api)
    d.line("CRD resilienttrainingjobs.training.resilient.dev installed")
    _fresh_namespace(kube, d)
    _queues(kube, gpus=8 * opts.nodes)
    d.line(f"namespace {NAMESPACE}, Kueue LocalQueue {QUEUE!r} -> ClusterQueue {NAMESPACE!r}")

    d.phase("2/7 Checkpoint store: an S3 API server on loopback")
    s3 = S3Server(opts.state / "logs").start()
    state["pids"]["s3"] = s3.pid
    _save_state(opts, state)
    s3.client().create_bucket(Bucket=BUCKET)
    _secret(kube, s3)
    d.line(f"{s3.url}, bucket {BUCKET!r}, credentials in Secret {SECRET!r}")

    if cluster is not None:
        d.phase("3/7 Local pod runner: nodes whose pods run as local processes")
        runner = _start_runner(opts, kubeconfig)
        state["pids"]["runner"] = runner.pid
        _save_state(opts, state)
        wait_for("the runner's nodes", lambda: _ready_nodes(kube) >= opts.nodes, 60, every=0.3)
        d.line(f"{opts.nodes} nodes of 8 simulated GPUs, each pod's containers run here "
               f"(logs: {opts.state / 'logs' / 'pod-runner.log'})")  # fmt: skip

    d.phase("4/7 The operator")
    op = OperatorProcess(
        str(kubeconfig),
        NAMESPACE,
        opts.state / "logs",
        lease_name="rtj-demo-operator",
        extra=operator_args,
    )
    op.start()
    assert op.proc is not None
    state["pids"]["operator"] = op.proc.pid
    state["operator_metrics"] = op.port
    _save_state(opts, state)
    d.line(f"python -m rtj_operator run (pid {op.proc.pid}, metrics :{op.port}, "
           f"log {op.log_path})")  # fmt: skip
    return kubeconfig, kube, api


def _start_runner(opts: Options, kubeconfig: Path) -> subprocess.Popen[bytes]:
    log = (opts.state / "logs" / "pod-runner.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "e2e.podrunner", "--kubeconfig", str(kubeconfig),
         "--root", str(opts.state / "runner"), "--nodes", str(opts.nodes),
         "--workdir", str(REPO)],
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
    )  # fmt: skip


def _ready_nodes(kube: HarnessKube) -> int:
    nodes = kube.core.list_node(label_selector="e2e.resilient.dev/pod-runner=local").items
    return sum(
        1
        for n in nodes
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        and not any(t.key.startswith("node.kubernetes.io/") for t in n.spec.taints or [])
    )
