"""Start and stop one local cluster: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK, JobSet and Kueue, each a process on loopback.

State (certificates, kubeconfigs, logs, etcd data, ``state.json`` with PIDs and ports) lives in
``<cache>/cluster/<name>/`` so ``down``/``status`` work from another process.
The processes start stage by stage in `startup`; the state file is `cluster_state`'s.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import build, kwok, processes
from .cluster_state import DEFAULT_NAME, ClusterState, state_root
from .kube import Kube
from .processes import Proc, StartupError
from .startup import Startup
from .versions import CLUSTER_PROGRAMS, load_versions

# Node lifecycle timings: KWOK renews each node's Lease every LEASE/4 seconds; the node
# lifecycle controller calls a node unreachable after GRACE seconds without a renewal.
NODE_LEASE_SECONDS = 20
NODE_MONITOR_GRACE = "20s"
PODS_READY_TIMEOUT = "120s"


class LocalCluster:
    """One local cluster. ``up()`` returns the admin kubeconfig path; ``down()`` verifies
    that no process and no listening port is left behind."""

    def __init__(
        self,
        name: str = DEFAULT_NAME,
        nodes: int = 8,
        gpus_per_node: int = 8,
        state_dir: Path | None = None,
        *,
        node_lease_seconds: int = NODE_LEASE_SECONDS,
        loopback_pods: bool = False,
        terminal_phase_on_delete: bool = False,
        pods_ready_timeout: str = PODS_READY_TIMEOUT,
    ) -> None:
        """``node_lease_seconds``: KWOK's node Lease duration (renewed at a quarter of it; the
        node controller's grace grows with it); longer spares a small machine's CPU at
        1,000+ nodes. ``loopback_pods``: pods get 127.x addresses (`kwok.loopback_pod_cidr`).
        ``terminal_phase_on_delete``: a deleted running pod turns Failed before it goes, as a
        kubelet writes it (`kwok.kwok_config_yaml`). ``pods_ready_timeout``: Kueue's
        `waitForPodsReady.timeout` (1,250 pods take longer than 120 s to start on 2 CPUs)."""
        self.name = name
        self.pods_ready_timeout = pods_ready_timeout
        self.n_nodes = nodes
        self.node_lease_seconds = node_lease_seconds
        self.loopback_pods = loopback_pods
        self.terminal_phase_on_delete = terminal_phase_on_delete
        self.shape = kwok.NodeShape(gpus=gpus_per_node)
        self.dir = state_dir or state_root() / name
        self.versions = load_versions()
        self.state = ClusterState(name=name, dir=self.dir, kubeconfig=self.dir / "kubeconfig")
        self._bins: dict[str, Path] = {}

    def monitor_grace(self) -> str:
        """The node controller's grace: the harness's at the default Lease, else 1.25x the
        Lease (it must outlast a renewal, a quarter of the Lease, with room for a late one)."""
        if self.node_lease_seconds == NODE_LEASE_SECONDS:
            return NODE_MONITOR_GRACE
        return f"{int(self.node_lease_seconds * 1.25)}s"

    # --- public --------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.state.kubeconfig

    def up(self, *, build_missing: bool = True) -> Path:
        existing = ClusterState.load(self.name)
        if existing and any(p.alive() for p in existing.procs):
            raise StartupError(
                f"cluster {self.name!r} is already running (state {existing.state_file}); "
                f"run `python -m e2e.cluster down --name {self.name}` first"
            )
        if existing:
            processes.stop(existing.procs)
        t0 = time.monotonic()
        if build_missing:
            build.build(CLUSTER_PROGRAMS)
        else:
            gone = build.missing(CLUSTER_PROGRAMS)
            if gone:
                raise StartupError(f"programs not built: {gone}; run `make cluster-build`")
        self._bins = {n: build.binary_path(n, self.versions) for n in CLUSTER_PROGRAMS}
        t_build = time.monotonic()
        if self.dir.exists():
            shutil.rmtree(self.dir)
        (self.dir / "logs").mkdir(parents=True)
        self.state.started_at = time.time()
        try:
            Startup(self, self._bins).run()
        except BaseException:
            self._dump_failure()
            self.down(check=False)
            raise
        self.state.timings["build_check"] = round(t_build - t0, 2)
        self.state.startup_seconds = round(time.monotonic() - t_build, 2)
        self.state.save()
        return self.kubeconfig

    def restart(self, component: str, while_stopped: Callable[[], None] | None = None) -> None:
        """Stop one component and start it again with the same command line, log and ports
        (a fresh KWOK mends lease handling that its caches broke; see node_health);
        ``while_stopped`` runs between the two."""
        state = ClusterState.load(self.name) or self.state
        old = next((p for p in state.procs if p.name == component), None)
        if old is None:
            raise KeyError(f"cluster {self.name!r} runs no {component!r}")
        processes.stop([old])
        if while_stopped is not None:
            while_stopped()
        new = processes.start(component, old.argv, Path(old.log).parent, old.ports, cwd=state.dir)
        state.procs = [new if p is old else p for p in state.procs]
        state.save()
        if state is not self.state:
            self.state.procs = state.procs

    def proc(self, component: str) -> Proc:
        """The running process of one component."""
        state = ClusterState.load(self.name) or self.state
        found = next((p for p in state.procs if p.name == component), None)
        if found is None:
            raise KeyError(f"cluster {self.name!r} runs no {component!r}")
        return found

    def down(self, *, check: bool = True) -> list[str]:
        """Stop every process group; returns (and with ``check`` raises on) leftovers."""
        state = ClusterState.load(self.name) or self.state
        procs = state.procs or self.state.procs
        # controllers first (they would log errors while the API server goes away), etcd last
        order = {
            "kueue": 0,
            "jobset": 0,
            "kwok": 0,
            "kube-scheduler": 1,
            "kube-controller-manager": 1,
            "kube-apiserver": 2,
            "etcd": 3,
        }
        for rank in sorted(set(order.values())):
            processes.stop([p for p in procs if order.get(p.name, 0) == rank])
        problems = processes.leftovers(procs)
        if not problems:
            with_data = state.dir / "etcd-data"
            shutil.rmtree(with_data, ignore_errors=True)
            state_file = state.dir / "state.json"
            if state_file.exists():
                state_file.rename(state.dir / "state.down.json")
        if problems and check:
            raise RuntimeError("teardown left things behind: " + "; ".join(problems))
        return problems

    def status(self) -> dict[str, Any]:
        state = ClusterState.load(self.name)
        if state is None:
            return {"name": self.name, "running": False}
        procs = {
            p.name: {"pid": p.pid, "alive": p.alive(), "ports": p.ports, "log": p.log}
            for p in state.procs
        }
        out: dict[str, Any] = {
            "name": self.name,
            "running": all(v["alive"] for v in procs.values()),
            "kubeconfig": str(state.kubeconfig),
            "processes": procs,
            "startup_seconds": state.startup_seconds,
            "timings": state.timings,
        }
        if out["running"]:
            try:
                kube = Kube(state.kubeconfig)
                nodes = kube.core.list_node().items
                out["nodes"] = {
                    n.metadata.name: next(
                        (c.status for c in n.status.conditions or [] if c.type == "Ready"), "?"
                    )
                    for n in nodes
                }
                kube.close()
            except Exception as exc:
                out["api_error"] = repr(exc)
        return out

    def _dump_failure(self) -> None:
        for p in self.state.procs:
            if not p.alive():
                print(f"--- {p.name} exited; last log lines ({p.log}):\n{processes.tail(p.log)}")


def env_kubeconfig() -> Path | None:
    v = os.environ.get("RTJ_E2E_KUBECONFIG")
    return Path(v) if v else None


__all__ = ["DEFAULT_NAME", "ClusterState", "LocalCluster", "StartupError", "env_kubeconfig"]
