"""The runner's I/O: its nodes and their heartbeat, the pod watch, the processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from e2e.cluster import kwok

from .spec import LocalProcess, PodDirs, PodNotRunnable, Sources, plan_pod
from .status import PodRun, render_status, signal_name, termination

Obj = dict[str, Any]
NODE_LABEL = "e2e.resilient.dev/pod-runner"
NODE_LABEL_VALUE = "local"
NODE_PREFIX = "local-gpu-"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
HEARTBEAT_SECONDS = 3.0
MAX_GRACE_SECONDS = 30.0


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def node_manifest(name: str, gpus: int, taints: list[Obj] | None = None) -> Obj:
    """A node like the KWOK ones (GPU capacity and labels, so Kueue's flavor selects it),
    without KWOK's label: KWOK leaves it and its pods to this runner."""
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", kwok.GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {NODE_LABEL: NODE_LABEL_VALUE, **kwok.gpu_node_labels(name, gpus)},
        },
        "spec": {"taints": taints} if taints else {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def ready_condition() -> Obj:
    t = now()
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "e2e pod runner is posting ready status",
        "lastHeartbeatTime": t,
        "lastTransitionTime": t,
    }


class PodWorker(threading.Thread):
    """One pod: run its init containers, then its containers; report as a kubelet would."""

    def __init__(self, runner: PodRunner, pod: Obj) -> None:
        super().__init__(daemon=True, name=f"pod-{pod['metadata']['name']}")
        self.runner = runner
        self.pod = pod
        meta = pod["metadata"]
        self.key = (meta["namespace"], meta["name"])
        self.uid = meta["uid"]
        self.node = pod["spec"]["nodeName"]
        self.run_state = PodRun.of(pod, now())
        self.stopping = threading.Event()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.dirs = runner.dirs_for(pod)

    # --- lifecycle ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # a runner bug must not look like a training failure
            self.runner.say(f"{self._who()}: runner error: {type(exc).__name__}: {exc}")
        finally:
            self.done.set()

    def _run(self) -> None:
        try:
            plan_ = plan_pod(
                self.pod,
                self.dirs,
                self.runner.sources(self.key[0]),
                workdir=self.runner.workdir,
                base_env=self.runner.base_env,
            )
        except (PodNotRunnable, KeyError, ApiException) as exc:
            self.run_state.config_error = str(exc)
            self.runner.say(f"{self._who()}: cannot run: {exc}")
            self._report()
            return
        for d in plan_.directories:
            d.mkdir(parents=True, exist_ok=True)
        for path, data in plan_.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        plans = plan_.processes
        self._report()
        for plan in (p for p in plans if p.init):
            if self.stopping.is_set() or self._run_to_end(plan) != 0:
                return
        mains = [p for p in plans if not p.init]
        running = [p for p in mains if not self.stopping.is_set() and self._start(p)]
        self._report()
        while running:  # report each exit as it happens (sidecars may outlive the trainer)
            for plan in [p for p in running if self.procs[p.container].poll() is not None]:
                running.remove(plan)
                self._wait(plan)
            time.sleep(0.05)

    def _run_to_end(self, plan: LocalProcess) -> int:
        if self._start(plan) is None:  # could not start: its exit (127) is already recorded
            self._report()
            term = self.run_state.get(plan.container).terminated
            return int(term["exitCode"]) if term else 1
        self._report()
        return self._wait(plan)

    def _start(self, plan: LocalProcess) -> subprocess.Popen[bytes] | None:
        for d in (plan.log.parent, Path(plan.env["HOME"])):
            d.mkdir(parents=True, exist_ok=True)
        plan.termination_log.write_bytes(b"")
        with self.lock:
            if self.stopping.is_set():
                return None
            with plan.log.open("ab") as log:
                try:
                    proc = subprocess.Popen(
                        plan.argv,
                        env=plan.env,
                        cwd=plan.cwd,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # its own process group, like a container
                    )
                except OSError as exc:
                    log.write(f"runner: cannot start {plan.argv[0]}: {exc}\n".encode())
                    self.run_state.finish(plan.container, self._exit(plan, 127, now()))
                    return None
            self.procs[plan.container] = proc
        (plan.log.parent / "pid").write_text(str(proc.pid))
        self.run_state.start(plan.container, now())
        kind = "init container" if plan.init else "container"
        self.runner.say(f"{self._who()}: {kind} {plan.container} started (pid {proc.pid})")
        return proc

    def _wait(self, plan: LocalProcess) -> int:
        proc = self.procs.get(plan.container)
        if proc is None:
            return 1
        rc = proc.wait()
        finished = now()
        term = self._exit(plan, rc, finished)
        self.run_state.finish(plan.container, term)
        how = f"signal {signal_name(rc)}" if rc < 0 else f"code {rc}"
        self.runner.say(f"{self._who()}: {plan.container} exited with {how}")
        self._report()
        return int(term["exitCode"])

    def _exit(self, plan: LocalProcess, rc: int, finished: str) -> Obj:
        started = (self.run_state.get(plan.container).state.get("running") or {}).get(
            "startedAt", finished
        )
        pid = self.procs[plan.container].pid if plan.container in self.procs else 0
        return termination(
            returncode=rc,
            started_at=started,
            finished_at=finished,
            message_file=_read(plan.termination_log),
            log=_read(plan.log)[-65536:],
            policy=plan.message_policy,
            container_id=f"local://{self.node}/{pid}",
        )

    def stop(self, grace: float) -> None:
        """SIGTERM every process group, SIGKILL after ``grace`` seconds."""
        with self.lock:
            self.stopping.set()
            procs = [p for p in self.procs.values() if p.poll() is None]
        for p in procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        orphans: list[int] = []
        for p in procs:
            orphans += descendants(p.pid)
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
        for pid in orphans:  # workers whose parent exited first (reparented to init)
            kill_tree(pid, signal.SIGKILL)

    def _report(self) -> None:
        if self.stopping.is_set() and self.runner.gone(self.uid):
            return
        status = render_status(self.run_state, self.pod, now())
        ns, name = self.key
        try:
            self.runner.core.patch_namespaced_pod_status(name, ns, {"status": status})
        except ApiException as exc:
            if exc.status != 404:
                self.runner.say(f"{self._who()}: status update failed: {exc.status} {exc.reason}")

    def _who(self) -> str:
        return f"{self.key[0]}/{self.key[1]} on {self.node}"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its workers in sessions of their own, so
    a container's processes are its tree, not its process group)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int, sig: int) -> None:
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """SIGTERM goes to the group (the entrypoint forwards it, as in a container); SIGKILL to
    the whole tree, as a container runtime's cgroup kill would."""
    if sig == signal.SIGKILL:
        kill_tree(proc.pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class PodRunner:
    """Registers ``nodes`` nodes and runs the pods bound to them until ``stop`` is set."""

    def __init__(
        self,
        kubeconfig: str | Path,
        root: Path,
        *,
        nodes: int = 3,
        gpus: int = 8,
        workdir: Path | None = None,
        prefix: str = NODE_PREFIX,
        taints: list[Obj] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.root = root
        self.node_names = [f"{prefix}{i}" for i in range(nodes)]
        self.gpus = gpus
        self.taints = taints
        self.workdir = workdir or Path.cwd()
        self._say = say or (lambda line: print(line, flush=True))
        self.workers: dict[str, PodWorker] = {}
        self.deleted: set[str] = set()
        self.ports: dict[str, int] = {}
        self._lock = threading.Lock()
        venv_bin = str(Path(sys.executable).parent)
        self.base_env = {
            "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    def say(self, line: str) -> None:
        self._say(f"[pod-runner {datetime.now():%H:%M:%S}] {line}")

    # --- inputs the pods reference ----------------------------------------------------------
    def sources(self, namespace: str) -> Sources:
        import base64

        def secret(name: str) -> dict[str, str]:
            s = self.core.read_namespaced_secret(name, namespace)
            return {k: base64.b64decode(v).decode() for k, v in (s.data or {}).items()}

        def config_map(name: str) -> dict[str, str]:
            return dict(self.core.read_namespaced_config_map(name, namespace).data or {})

        return Sources(secrets=secret, config_maps=config_map, master_port=self.master_port)

    def master_port(self, subdomain: str) -> int:
        with self._lock:
            if subdomain not in self.ports:
                self.ports[subdomain] = free_port()
            return self.ports[subdomain]

    def dirs_for(self, pod: Obj) -> PodDirs:
        meta = pod["metadata"]
        return PodDirs(
            pod=self.root / "pods" / meta["namespace"] / f"{meta['name']}-{meta['uid'][:8]}",
            node=self.root / "nodes" / pod["spec"]["nodeName"],
            claims=self.root / "claims",
        )

    def gone(self, uid: str) -> bool:
        return uid in self.deleted

    # --- nodes ---------------------------------------------------------------------------------
    def register_nodes(self) -> None:
        for name in self.node_names:
            body = node_manifest(name, self.gpus, self.taints)
            try:
                self.core.create_node(body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            self._post_ready(name)
            self._renew_lease(name)
        self.say(f"registered nodes {', '.join(self.node_names)}")

    def _post_ready(self, name: str) -> None:
        status = {
            "conditions": [ready_condition()],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
        }
        # strategic merge: conditions merge by type, so a GPU agent's condition survives
        self.core.patch_node_status(name, {"status": status})

    def _renew_lease(self, name: str) -> None:
        body = {
            "metadata": {"name": name, "namespace": LEASE_NAMESPACE},
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": _micro_now(),
            },
        }
        try:
            self.coord.patch_namespaced_lease(name, LEASE_NAMESPACE, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.coord.create_namespaced_lease(LEASE_NAMESPACE, body)

    def _heartbeat(self, stop: threading.Event) -> None:
        beats = 0
        while not stop.wait(HEARTBEAT_SECONDS):
            beats += 1
            for name in list(self.node_names):
                try:
                    self._renew_lease(name)
                    if beats % 3 == 0:
                        self._post_ready(name)
                except ApiException as exc:
                    if exc.status == 404:
                        self._node_gone(name)
                except Exception as exc:  # keep beating through API hiccups
                    self.say(f"heartbeat of {name}: {type(exc).__name__}: {exc}")

    def _node_gone(self, name: str) -> None:
        """The Node object was deleted: the machine is gone, and its processes with it."""
        if name not in self.node_names:
            return
        self.node_names.remove(name)
        self.say(f"node {name} was deleted: killing its pods' processes")
        for w in list(self.workers.values()):
            if w.node == name:
                self.deleted.add(w.uid)
                threading.Thread(target=w.stop, args=(0.0,), daemon=True).start()

    # --- pods ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self.register_nodes()
        threading.Thread(target=self._heartbeat, args=(stop,), daemon=True).start()
        rv = ""
        while not stop.is_set():
            try:
                if not rv:
                    listed = self.core.list_pod_for_all_namespaces()
                    rv = listed.metadata.resource_version
                    for p in listed.items:
                        self._on_pod("ADDED", self.api.sanitize_for_serialization(p))
                w = watch.Watch()
                for ev in w.stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=rv,
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                ):
                    if stop.is_set():
                        w.stop()
                        break
                    obj = ev["object"]
                    raw = self.api.sanitize_for_serialization(obj)
                    rv = raw["metadata"].get("resourceVersion", rv)
                    if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._on_pod(ev["type"], raw)
            except ApiException as exc:
                if exc.status == 410:
                    rv = ""  # expired: list again
                else:
                    self.say(f"pod watch: {exc.status} {exc.reason}")
                    time.sleep(1)
            except Exception as exc:
                self.say(f"pod watch: {type(exc).__name__}: {exc}")
                time.sleep(1)
        self.shutdown()

    def _on_pod(self, kind: str, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = meta["uid"]
        if spec.get("nodeName") not in self.node_names and uid not in self.workers:
            return
        worker = self.workers.get(uid)
        if kind == "DELETED":
            self.deleted.add(uid)
            if worker is not None:
                threading.Thread(target=worker.stop, args=(0.0,), daemon=True).start()
            return
        if meta.get("deletionTimestamp"):
            if uid not in self.deleted:
                self.deleted.add(uid)
                grace = min(float(meta.get("deletionGracePeriodSeconds") or 0), MAX_GRACE_SECONDS)
                threading.Thread(
                    target=self._finalize, args=(worker, pod, grace), daemon=True
                ).start()
            return
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if worker is None and phase == "Pending" and uid not in self.deleted:
            worker = PodWorker(self, pod)
            self.workers[uid] = worker
            worker.start()

    def _finalize(self, worker: PodWorker | None, pod: Obj, grace: float) -> None:
        """Stop the processes within the grace period, then let the pod object go."""
        if worker is not None:
            worker.stop(grace)
        meta = pod["metadata"]
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)
        except ApiException as exc:
            if exc.status not in (404, 409):
                self.say(f"finalizing {meta['name']}: {exc.status} {exc.reason}")

    def deregister_nodes(self) -> None:
        """Delete the runner's nodes (tests sharing a cluster; a kubelet would not)."""
        for name in list(self.node_names):
            try:
                self.core.delete_node(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def shutdown(self) -> None:
        """Stop every process (the runner leaves nothing behind)."""
        workers = list(self.workers.values())
        threads = [threading.Thread(target=w.stop, args=(5.0,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
