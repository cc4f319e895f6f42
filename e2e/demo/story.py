"""The demo's story, phase by phase: control plane, store, runner, operator, job, fault,
recovery, summary. Each phase says what it does; ``down`` undoes all of it."""

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.rest import ApiException

from e2e.cluster import build, faults
from e2e.cluster.cluster import ClusterState, LocalCluster
from e2e.cluster.kube import Kube as HarnessKube
from e2e.cluster.processes import pid_alive
from e2e.cluster.versions import CLUSTER_PROGRAMS, load_versions
from e2e.operator_proc import REPO, OperatorProcess, client, install_crd, wait_for
from e2e.podrunner.runner import descendants
from e2e.s3server import S3Server, aws_env

from . import report

NAMESPACE = "rtj-demo"
QUEUE = "demo"
BUCKET = "rtj-demo"
SECRET = "rtj-demo-s3"
CLUSTER_NAME = "rtj-demo"
EXAMPLE = REPO / "examples" / "resilient-training-job.yaml"
XID = 79  # GPU has fallen off the bus
FAULT_RANK = 1
# Cold-build minutes on a 2-core machine, for the progress display (measured, rounded up).
BUILD_MINUTES = {"kube-apiserver": 5, "kube-controller-manager": 1, "kueue": 6, "jobset": 3,
                 "kwok": 2, "etcd": 1, "kube-scheduler": 1, "kubectl": 1}  # fmt: skip


class DemoError(RuntimeError):
    pass


def state_dir() -> Path:
    return build.cache_dir() / "demo"


@dataclass
class Options:
    out: Path = REPO / "demo-output"
    state: Path = field(default_factory=state_dir)
    kubeconfig: Path | None = None
    cluster_name: str = CLUSTER_NAME
    nodes: int = 3
    fault_step: int = 100
    timeout: float = 300.0
    example: Path = EXAMPLE


class Display:
    """Phase headers and timestamped lines; the long waits say what they wait for."""

    def __init__(self, write: Callable[[str], None] | None = None) -> None:
        self.t0 = time.monotonic()
        self._write = write or (lambda s: print(s, flush=True))

    def line(self, text: str) -> None:
        self._write(f"[{time.monotonic() - self.t0:6.1f}s] {text}")

    def phase(self, text: str) -> None:
        self._write("")
        self.line(f"==> {text}")

    def detail(self, text: str) -> None:
        for part in text.rstrip().splitlines():
            self._write(f"          {part}")


# --- state (what `down` must undo) -----------------------------------------------------------


def _save_state(opts: Options, data: dict[str, Any]) -> None:
    opts.state.mkdir(parents=True, exist_ok=True)
    (opts.state / "state.json").write_text(json.dumps(data, indent=2) + "\n")


def _load_state(opts: Options) -> dict[str, Any]:
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
    state = _load_state(opts)
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


def _kubectl() -> Path:
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


@dataclass
class Run:
    """What the demo observed while the job ran (the display's memory)."""

    name: str
    events_seen: set[str] = field(default_factory=set)
    progress: dict[int, int] = field(default_factory=dict)  # attempt -> last step shown
    fault_at: float | None = None
    fault_node: str | None = None
    fault_pod: str | None = None
    new_pods_running_at: float | None = None
    tainted: set[str] = field(default_factory=set)
    old_world_gone: bool = False
    init_reported: set[str] = field(default_factory=set)


def _pod_dir(opts: Options, pod: dict[str, Any]) -> Path:
    meta = pod["metadata"]
    return opts.state / "runner" / "pods" / meta["namespace"] / f"{meta['name']}-{meta['uid'][:8]}"


def _rank_logs(opts: Options, pods: list[dict[str, Any]], attempt: int) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for p in pods:
        if p["metadata"]["labels"].get("training.resilient.dev/attempt") != str(attempt):
            continue
        for f in (_pod_dir(opts, p) / "volumes" / "train-logs").glob("rank-*.jsonl"):
            out[int(f.stem.split("-")[1])] = f
    return out


def _attempt_lines(opts: Options, attempt: int) -> dict[int, list[str]]:
    """Each rank's JSON lines for one attempt, from the runner's per-pod directories (the
    pods of every attempt, gone or not)."""
    root = opts.state / "runner" / "pods" / NAMESPACE
    return {
        int(f.stem.split("-")[1]): f.read_text().splitlines()
        for f in sorted(root.glob(f"*-a{attempt}-*/volumes/train-logs/rank-*.jsonl"))
    }


def all_rank_losses(opts: Options, attempt: int) -> dict[int, list[tuple[int, float]]]:
    return {r: report.parse_losses(lines) for r, lines in _attempt_lines(opts, attempt).items()}


def collect_losses(opts: Options, attempts: int) -> tuple[report.Losses, dict[int, int | None]]:
    """Rank 0's losses per attempt, and the step each attempt restored."""
    losses: report.Losses = {}
    restored: dict[int, int | None] = {}
    for attempt in range(1, attempts + 1):
        lines = _attempt_lines(opts, attempt).get(0)
        if lines is not None:
            losses[attempt] = report.parse_losses(lines)
            restored[attempt] = report.restore_step(lines)
    return losses, restored


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


def up(opts: Options, display: Display | None = None) -> report.Summary:
    """The whole story. Leaves the cluster, operator and runner running for a look around
    (``make demo-down`` stops them)."""
    d = display or Display()
    if _load_state(opts):
        d.phase("Stopping what an earlier demo left running")
        down(opts, d)
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.state / "logs").mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"pids": {}}

    kubeconfig, kube, api = start_platform(opts, d, state)

    d.phase(f"5/7 kubectl apply -f {opts.example.relative_to(REPO)}")
    body = yaml.safe_load(opts.example.read_text())
    name = body["metadata"]["name"]
    d.detail(kubectl(kubeconfig, "apply", "-f", str(opts.example)))
    run = Run(name)
    watch = _Watcher(opts, kube, api, d, run)
    watch.until("attempt 1 is training", lambda: run.progress.get(1, 0) >= 1, opts.timeout)

    d.phase(f"6/7 Fault: GPU XID {XID} on rank {FAULT_RANK}'s node once it passes step "
            f"{opts.fault_step}")  # fmt: skip
    watch.until(
        f"step {opts.fault_step}", lambda: run.progress.get(1, 0) >= opts.fault_step, opts.timeout
    )
    _inject_fault(opts, kube, d, run)
    watch.until("the job to finish", lambda: watch.phase in ("Succeeded", "Failed"), opts.timeout)

    d.phase("7/7 Summary")
    status = api.get_rtj(NAMESPACE, name).get("status") or {}
    losses, restored = collect_losses(opts, int(status.get("attempt") or 1))
    new_pods = (
        run.new_pods_running_at - run.fault_at
        if run.new_pods_running_at is not None and run.fault_at is not None
        else None
    )
    summary = report.summarize(
        name, status, losses, restored_step=restored.get(2), new_pods_running_seconds=new_pods
    )
    text = report.format_summary(
        summary, losses, kubectl(kubeconfig, "get", "rtj", "-n", NAMESPACE)
    )
    d.detail(text)
    svg = report.loss_svg(
        losses,
        fault_step=summary.last_step_before_fault,
        resume_step=summary.resumed_from_step,
        title=f"{name}: loss vs step (GPU fault, resumed from a verified checkpoint)",
    )
    (opts.out / "loss.svg").write_text(svg)
    (opts.out / "summary.txt").write_text(text + "\n")
    (opts.out / "summary.json").write_text(json.dumps(summary.as_json(), indent=2) + "\n")
    (opts.out / "status.json").write_text(json.dumps(status, indent=2) + "\n")
    d.line(f"wrote {opts.out / 'loss.svg'}, summary.txt, summary.json")
    d.line(f"look around: export KUBECONFIG={kubeconfig}; {_kubectl()} get rtj,jobsets,pods,"
           f"nodes -n {NAMESPACE}; stop everything with `make demo-down`")  # fmt: skip
    if summary.phase != "Succeeded":
        raise DemoError(f"the job ended {summary.phase}; see {opts.out / 'status.json'}")
    return summary


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


def _inject_fault(opts: Options, kube: HarnessKube, d: Display, run: Run) -> None:
    """The node's GPU agent reports XID 79 and the rank's CUDA process dies with it."""
    pods = kube.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"training.resilient.dev/job={run.name}"
    ).items
    raw = [kube.api.sanitize_for_serialization(p) for p in pods]
    victim = next(
        p for p in raw
        if p["metadata"]["labels"].get("training.resilient.dev/attempt") == "1"
        and p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index")
        == str(FAULT_RANK)
    )  # fmt: skip
    node = victim["spec"]["nodeName"]
    pid_file = _pod_dir(opts, victim) / "containers" / "trainer" / "pid"
    pid = int(pid_file.read_text())
    workers = descendants(pid)
    faults.gpu_xid(kube, node, XID)
    run.fault_at = time.monotonic()
    for w in workers:  # the training process dies; torchrun (the entrypoint) reports it
        with contextlib.suppress(ProcessLookupError):
            os.kill(w, signal.SIGKILL)
    run.fault_node, run.fault_pod = node, victim["metadata"]["name"]
    d.line(f"node {node}: the GPU health agent reports XID {XID} (condition "
           f"{faults.XID_CONDITION_TYPE}: GPU has fallen off the bus)")  # fmt: skip
    d.line(f"pod {run.fault_pod} (rank {FAULT_RANK}): training process killed "
           f"(pids {workers}) at step {run.progress.get(1)}")  # fmt: skip


class _Watcher:
    """Polls the job, its events, nodes, pods and the trainers' logs, and tells the story."""

    def __init__(self, opts: Options, kube: HarnessKube, api: Any, d: Display, run: Run) -> None:
        self.opts, self.kube, self.api, self.d, self.run = opts, kube, api, d, run
        self.phase = ""
        self.attempt = 0

    def until(self, what: str, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if done():
                return
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.25)

    def poll(self) -> None:
        rtj = self.api.get_rtj(NAMESPACE, self.run.name)
        status = rtj.get("status") or {}
        if status.get("phase") and (status["phase"], status.get("attempt")) != (
            self.phase,
            self.attempt,
        ):
            self.phase, self.attempt = status["phase"], status.get("attempt", 0)
            self.d.line(f"job {self.run.name}: phase {self.phase}, attempt {self.attempt}")
        self._events()
        self._nodes()
        pods = [
            self.kube.api.sanitize_for_serialization(p)
            for p in self.kube.core.list_namespaced_pod(
                NAMESPACE, label_selector=f"training.resilient.dev/job={self.run.name}"
            ).items
        ]
        self._pods(pods)
        self._progress(pods)

    def _events(self) -> None:
        events = self.kube.core.list_namespaced_event(NAMESPACE).items
        for e in sorted(
            events, key=lambda e: (e.last_timestamp or e.event_time or 0, e.metadata.name)
        ):
            if e.involved_object.kind != "ResilientTrainingJob":
                continue
            key = f"{e.metadata.uid}/{e.count}"
            if key in self.run.events_seen:
                continue
            self.run.events_seen.add(key)
            self.d.line(f"event {e.reason}: {e.message}")

    def _nodes(self) -> None:
        for n in self.kube.core.list_node().items:
            for t in n.spec.taints or []:
                if t.key.startswith("node.kubernetes.io/") or n.metadata.name in self.run.tainted:
                    continue
                self.run.tainted.add(n.metadata.name)
                self.d.line(f"node {n.metadata.name} tainted {t.key}={t.value}:{t.effect}")

    def _pods(self, pods: list[dict[str, Any]]) -> None:
        attempts = {p["metadata"]["labels"].get("training.resilient.dev/attempt") for p in pods}
        if self.run.fault_at is not None and not self.run.old_world_gone and "1" not in attempts:
            self.run.old_world_gone = True
            self.d.line("old world stopped: every pod of attempt 1 is gone")
        for p in pods:
            for s in (p.get("status") or {}).get("initContainerStatuses") or []:
                term = (s.get("state") or {}).get("terminated")
                key = p["metadata"]["uid"]
                if term and key not in self.run.init_reported:
                    self.run.init_reported.add(key)
                    msg = term.get("message", "").strip().replace("\n", " ")
                    self.d.line(f"pod {p['metadata']['name']}: init container {s['name']} exited "
                                f"{term['exitCode']}: {msg[:160]}")  # fmt: skip
        if self.run.fault_at is not None and self.run.new_pods_running_at is None:
            new = [
                p for p in pods
                if p["metadata"]["labels"].get("training.resilient.dev/attempt") == "2"
                and (p.get("status") or {}).get("phase") == "Running"
            ]  # fmt: skip
            if len(new) == 2:
                self.run.new_pods_running_at = time.monotonic()
                nodes = sorted(p["spec"]["nodeName"] for p in new)
                self.d.line(f"attempt 2: every pod Running, on {', '.join(nodes)}")

    def _progress(self, pods: list[dict[str, Any]]) -> None:
        for attempt in sorted({int(a) for p in pods if (a := p["metadata"]["labels"].get(
                "training.resilient.dev/attempt"))}):  # fmt: skip
            logs = _rank_logs(self.opts, pods, attempt)
            if 0 not in logs:
                continue
            lines = logs[0].read_text().splitlines()
            losses = report.parse_losses(lines)
            shown = self.run.progress.get(attempt)
            if shown is None:
                restored = report.restore_step(lines)
                if restored is None:
                    continue
                self.d.line(f"attempt {attempt}: trainer restored step {restored}")
                self.run.progress[attempt] = restored
                shown = restored
            if not losses:
                continue
            step, loss = losses[-1]
            if step // 20 > shown // 20 or (attempt > 1 and shown == self._restored(lines)):
                self.d.line(f"attempt {attempt}: step {step}, loss {loss:.5f}")
            self.run.progress[attempt] = max(step, shown)

    @staticmethod
    def _restored(lines: list[str]) -> int | None:
        return report.restore_step(lines)
