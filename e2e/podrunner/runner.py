"""The runner's I/O: its nodes and their heartbeat, the pod watch, the pod workers.

Each pod bound to one of the runner's nodes gets a ``pod.PodWorker`` (its lifecycle, with
native sidecars) and an address of its own from ``podip.PodIPs``.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from e2e.cluster import kwok

from .pod import MAX_GRACE_SECONDS, PodWorker, descendants, kill_tree, now
from .podip import PodIPs
from .spec import PodDirs, Sources

__all__ = ["NODE_LABEL", "PodRunner", "PodWorker", "descendants", "kill_tree"]

Obj = dict[str, Any]
NODE_LABEL = "e2e.resilient.dev/pod-runner"
NODE_LABEL_VALUE = "local"
NODE_PREFIX = "local-gpu-"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
HEARTBEAT_SECONDS = 3.0


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
        self.api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
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
        self.pod_ips = PodIPs()
        self._cut: set[str] = set()
        """Nodes out of contact with the API server (see cut_off_file)."""
        self._frozen: set[str] = set()
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
                self.core.create_node(body)  # type: ignore[arg-type]  # a dict is a body too
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
            self.coord.create_namespaced_lease(LEASE_NAMESPACE, body)  # type: ignore[arg-type]

    def power_off_file(self, node: str) -> Path:
        """Creating this file powers `node` off (a test's silent node loss): see _power_off."""
        return self.root / "power-off" / node

    def _power_off(self, name: str) -> None:
        """The machine lost power: its processes die and nothing more is heard from it. No
        Lease renewal, no status, no pod finalized (its pods stay Terminating once deleted,
        as with a dead kubelet); the Node object stays. Only its Lease going stale tells."""
        self._machine_gone(name, "powered off: its pods' processes killed, nothing reported")

    def slow_link_file(self, node: str) -> Path:
        """While this file exists (holding bytes per second) `node`'s link is slow: a pod
        planned on it then runs its `rtj-shim preflight` ring transfer at that rate (the
        preflight's hidden ``--throttle-bytes-per-second``; the runner shares loopback, so
        only that transfer is slowed, the trainer's traffic is not). See `slowed`."""
        return self.root / "slow-link" / node

    def slow_link(self, node: str) -> float | None:
        """The bytes per second of `node`'s slow link; None: a healthy one."""
        try:
            return float(self.slow_link_file(node).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def cut_off_file(self, node: str) -> Path:
        """While this file exists `node` is out of contact with the API server (a partition,
        a hung kubelet): no Lease renewal, no status, no pod event seen, its processes run
        on. Containing ``freeze``, its processes are stopped too (SIGSTOP: a machine that
        hangs, a VM paused), and continued when the word goes: a zombie. Removing the file
        restores contact: the node catches up with what happened to its pods meanwhile."""
        return self.root / "cut-off" / node

    def cut_off(self, node: str) -> bool:
        return node in self._cut

    def _contact(self, name: str) -> bool:
        """Apply the node's cut-off file; whether it is in contact with the API server."""
        try:
            freeze = self.cut_off_file(name).read_text().strip() == "freeze"
        except FileNotFoundError:
            if name in self._cut:
                self._restore(name)
            return True
        if name not in self._cut:
            self._cut.add(name)
            self.say(f"node {name} lost contact with the API server")
        if freeze != (name in self._frozen):
            (self._frozen.add if freeze else self._frozen.discard)(name)
            self._signal_node(name, signal.SIGSTOP if freeze else signal.SIGCONT)
        return False

    def _signal_node(self, name: str, sig: int) -> None:
        pids = [proc.pid for w in list(self.workers.values()) if w.node == name
                for proc in list(w.live.values())]  # fmt: skip
        for pid in pids:
            kill_tree(pid, sig)
        self.say(f"node {name}: {signal.Signals(sig).name} to {len(pids)} container processes")

    def _restore(self, name: str) -> None:
        """Contact is back: continue frozen processes, then do what the pods' fate (seen by
        the API server meanwhile) asks, as a kubelet resyncing would."""
        if name in self._frozen:
            self._frozen.discard(name)
            self._signal_node(name, signal.SIGCONT)
        self._cut.discard(name)
        listed = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}")
        pods = {p.metadata.uid: self.api.sanitize_for_serialization(p) for p in listed.items}
        for w in list(self.workers.values()):
            if w.node == name and w.uid not in pods and w.uid not in self.deleted:
                self.deleted.add(w.uid)
                threading.Thread(target=w.stop, args=(0.0,), daemon=True).start()
        for pod in pods.values():
            self._on_pod("MODIFIED", pod)
            worker = self.workers.get(pod["metadata"]["uid"])
            if worker is not None and pod["metadata"]["uid"] not in self.deleted:
                worker.report_now()
        self.say(f"node {name} is in contact again ({len(pods)} pods bound to it)")

    def _heartbeat(self, stop: threading.Event) -> None:
        beats = 0
        while not stop.wait(HEARTBEAT_SECONDS):
            beats += 1
            for name in list(self.node_names):
                if self.power_off_file(name).exists():
                    self._power_off(name)
                    continue
                try:
                    if not self._contact(name):
                        continue
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
        self._machine_gone(name, "was deleted: killing its pods' processes")

    def _machine_gone(self, name: str, why: str) -> None:
        """Stop serving `name`: no more heartbeats; its pods' processes killed, their workers
        reporting nothing more (a gone machine confirms nothing)."""
        if name not in self.node_names:
            return
        self.node_names.remove(name)
        self.say(f"node {name} {why}")
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
                    rv = (listed.metadata.resource_version if listed.metadata else None) or ""
                    for p in listed.items:
                        self._on_pod("ADDED", self.api.sanitize_for_serialization(p))
                w = watch.Watch()  # type: ignore[no-untyped-call]
                for ev in w.stream(  # type: ignore[no-untyped-call]
                    self.core.list_pod_for_all_namespaces,
                    resource_version=rv,
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                ):
                    if stop.is_set():
                        w.stop()  # type: ignore[no-untyped-call]
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
        if spec.get("nodeName") in self._cut:
            return  # out of contact: it learns what happened when contact returns
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
        """Stop the processes within the grace period, report the terminal status, then let
        the pod object go (as the kubelet's syncTerminatedPod does)."""
        if worker is not None:
            worker.stop(grace)
            worker.report_final()
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
