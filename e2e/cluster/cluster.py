"""Start and stop one local cluster: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK, JobSet and Kueue, each a process on loopback.

State (certificates, kubeconfigs, logs, etcd data, ``state.json`` with PIDs and ports) lives in
``<cache>/cluster/<name>/`` so ``down``/``status`` work from another process.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import build, kwok, manifests, processes
from .components import (
    KUEUE_NAMESPACE,
    KUEUE_SECRET,
    KUEUE_SERVICE,
    PORT_NAMES,
    apiserver_command,
    controller_manager_command,
    etcd_command,
    jobset_command,
    jobset_config,
    kueue_command,
    kueue_config,
    kwok_command,
    scheduler_command,
)
from .kube import Kube, eventually
from .kubeconfig import write_kubeconfig
from .pki import CA, service_account_keys
from .processes import LOOPBACK, Proc, StartupError
from .versions import CLUSTER_PROGRAMS, load_versions

DEFAULT_NAME = "rtj-e2e"
JOBSET_NAMESPACE = "jobset-system"
RESOURCE_FLAVOR = "gpu-h100"

# Node lifecycle timings: KWOK renews each node's Lease every LEASE/4 seconds; the node
# lifecycle controller calls a node unreachable after GRACE seconds without a renewal.
NODE_LEASE_SECONDS = 20
NODE_MONITOR_GRACE = "20s"
PODS_READY_TIMEOUT = "120s"


def state_root() -> Path:
    return build.cache_dir() / "cluster"


@dataclass
class ClusterState:
    name: str
    dir: Path
    kubeconfig: Path
    api_port: int = 0
    procs: list[Proc] = field(default_factory=list)
    nodes: int = 0
    started_at: float = 0.0
    startup_seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def save(self) -> None:
        self.state_file.write_text(
            json.dumps(
                {
                    "name": self.name,
                    "kubeconfig": str(self.kubeconfig),
                    "api_port": self.api_port,
                    "procs": [p.to_dict() for p in self.procs],
                    "nodes": self.nodes,
                    "started_at": self.started_at,
                    "startup_seconds": self.startup_seconds,
                    "timings": self.timings,
                },
                indent=2,
            )
            + "\n"
        )

    @classmethod
    def load(cls, name: str = DEFAULT_NAME) -> ClusterState | None:
        d = state_root() / name
        try:
            raw = json.loads((d / "state.json").read_text())
        except (OSError, ValueError):
            return None
        return cls(
            name=raw["name"],
            dir=d,
            kubeconfig=Path(raw["kubeconfig"]),
            api_port=int(raw.get("api_port", 0)),
            procs=[Proc.from_dict(p) for p in raw.get("procs", [])],
            nodes=int(raw.get("nodes", 0)),
            started_at=float(raw.get("started_at", 0)),
            startup_seconds=float(raw.get("startup_seconds", 0)),
            timings=dict(raw.get("timings", {})),
        )


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

    def _monitor_grace(self) -> str:
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
            self._start_all()
        except BaseException:
            self._dump_failure()
            self.down(check=False)
            raise
        self.state.timings["build_check"] = round(t_build - t0, 2)
        self.state.startup_seconds = round(time.monotonic() - t_build, 2)
        self.state.save()
        return self.kubeconfig

    def restart(self, component: str) -> None:
        """Stop one component and start it again with the same command line, log and ports
        (a fresh KWOK mends lease handling that its caches broke; see node_health)."""
        state = ClusterState.load(self.name) or self.state
        old = next((p for p in state.procs if p.name == component), None)
        if old is None:
            raise KeyError(f"cluster {self.name!r} runs no {component!r}")
        processes.stop([old])
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

    # --- start-up ------------------------------------------------------------------------
    def _start_all(self) -> None:
        d = self.dir
        logs = d / "logs"
        timings = self.state.timings
        t = time.monotonic()
        pki = d / "pki"
        ca = CA(pki)
        sa = service_account_keys(pki)
        ports = dict(zip(PORT_NAMES, processes.free_ports(len(PORT_NAMES)), strict=True))
        api_cert = ca.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=(LOOPBACK, "10.96.0.1"),
        )
        server = f"https://{LOOPBACK}:{ports['api']}"
        self.state.api_port = ports["api"]

        def client_kubeconfig(user: str, cn: str, org: str | None) -> Path:
            pair = ca.issue(user, cn, org=org, client=True)
            return write_kubeconfig(
                d / f"{user}.kubeconfig",
                server=server,
                ca_file=ca.cert_path,
                cert_file=pair.cert,
                key_file=pair.key,
                user=user,
            )

        admin_pair = ca.issue("admin", "rtj-e2e-admin", org="system:masters", client=True)
        write_kubeconfig(
            self.kubeconfig,
            server=server,
            ca_file=ca.cert_path,
            cert_file=admin_pair.cert,
            key_file=admin_pair.key,
        )
        kcm_kc = client_kubeconfig(
            "kube-controller-manager", "system:kube-controller-manager", None
        )
        sched_kc = client_kubeconfig("kube-scheduler", "system:kube-scheduler", None)
        kwok_kc = client_kubeconfig("kwok", "kwok-controller", "system:masters")
        jobset_kc = client_kubeconfig("jobset", "jobset-controller", "system:masters")
        kueue_kc = client_kubeconfig("kueue", "kueue-controller", "system:masters")
        # webhook serving certificates (JobSet: our own; Kueue: a CA its cert rotator accepts)
        jobset_certs = d / "jobset-certs"
        ca.issue(
            "jobset-webhook",
            "jobset-webhook-service.jobset-system.svc",
            server=True,
            dns=("jobset-webhook-service.jobset-system.svc", "localhost"),
            ips=(LOOPBACK,),
            directory=jobset_certs,
            cert_name="tls.crt",
            key_name="tls.key",
        )
        kueue_ca = CA(
            d / "kueue-ca", name="kueue-ca", org="kueue", rsa_key=True, dns_san=("kueue-ca",)
        )
        kueue_certs = d / "kueue-certs"
        kueue_dns = f"{KUEUE_SERVICE}.{KUEUE_NAMESPACE}.svc"
        kueue_pair = kueue_ca.issue(
            "kueue-webhook",
            kueue_dns,
            server=True,
            dns=(kueue_dns, "localhost"),
            ips=(LOOPBACK,),
            directory=kueue_certs,
            cert_name="tls.crt",
            key_name="tls.key",
        )
        timings["pki"] = round(time.monotonic() - t, 2)

        # etcd
        t = time.monotonic()
        etcd = self._start(
            "etcd",
            etcd_command(self._bins["etcd"], d / "etcd-data", ports),
            [ports["etcd"], ports["etcd_peer"]],
            logs,
        )
        processes.wait_for(
            "etcd health",
            lambda: _http_ok(f"http://{LOOPBACK}:{ports['etcd']}/health"),
            30,
            proc=etcd,
        )
        timings["etcd"] = round(time.monotonic() - t, 2)

        # kube-apiserver
        t = time.monotonic()
        apiserver = self._start(
            "kube-apiserver",
            apiserver_command(
                self._bins["kube-apiserver"],
                ports,
                serving_cert=api_cert.cert,
                serving_key=api_cert.key,
                client_ca=ca.cert_path,
                service_account_cert=sa.cert,
                service_account_key=sa.key,
                cert_dir=d / "apiserver-certs",
            ),
            [ports["api"]],
            logs,
        )
        ssl_ctx = ssl.create_default_context(cafile=str(ca.cert_path))
        ssl_ctx.load_cert_chain(str(admin_pair.cert), str(admin_pair.key))
        processes.wait_for(
            "kube-apiserver /readyz",
            lambda: _http_ok(f"{server}/readyz", ssl_ctx),
            90,
            proc=apiserver,
        )
        timings["kube-apiserver"] = round(time.monotonic() - t, 2)

        # controller-manager, scheduler, KWOK: no ordering between them
        t = time.monotonic()
        kcm = self._start(
            "kube-controller-manager",
            controller_manager_command(
                self._bins["kube-controller-manager"],
                kcm_kc,
                ports,
                service_account_key=sa.key,
                root_ca=ca.cert_path,
                cluster_name=self.name,
                node_monitor_grace=self._monitor_grace(),
            ),
            [ports["kcm"]],
            logs,
        )
        sched = self._start(
            "kube-scheduler",
            scheduler_command(self._bins["kube-scheduler"], sched_kc, ports),
            [ports["sched"]],
            logs,
        )
        kwok_cfg = d / "kwok.yaml"
        kwok_cfg.write_text(kwok.kwok_config_yaml(self.terminal_phase_on_delete))
        kwok_proc = self._start(
            "kwok",
            kwok_command(
                self._bins["kwok"],
                kwok_kc,
                kwok_cfg,
                node_selector=f"{kwok.MANAGED_LABEL}={kwok.MANAGED_VALUE}",
                lease_seconds=self.node_lease_seconds,
            ),
            [],
            logs,
        )

        kube = Kube(self.kubeconfig)
        try:
            # CRDs and webhook configurations from the modules' own manifests
            jobset_dir = build.module_dir("sigs.k8s.io/jobset", self.versions["JOBSET"])
            kueue_dir = build.module_dir("sigs.k8s.io/kueue", self.versions["KUEUE"])
            for ns in (JOBSET_NAMESPACE, KUEUE_NAMESPACE):
                kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            converted = manifests.conversion_patched_crds(kueue_dir)
            crd_names = []
            for crd in manifests.crds(jobset_dir):
                kube.apply(crd)
                crd_names.append(crd["metadata"]["name"])
            for crd in manifests.crds(kueue_dir):
                if crd["metadata"]["name"] in converted:
                    crd = manifests.conversion_to_loopback(
                        crd, port=ports["kueue_wh"], ca_pem=kueue_ca.pem
                    )
                kube.apply(crd)
                crd_names.append(crd["metadata"]["name"])
            for obj in manifests.point_at_loopback(
                manifests.webhook_configurations(jobset_dir),
                port=ports["jobset_wh"],
                ca_pem=ca.pem,
                name_prefix="jobset",
            ):
                kube.apply(obj)
            for obj in manifests.point_at_loopback(
                manifests.webhook_configurations(kueue_dir),
                port=ports["kueue_wh"],
                ca_pem=kueue_ca.pem,
                name_prefix="kueue",
            ):
                kube.apply(obj)
            kube.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "metadata": {"name": KUEUE_SECRET, "namespace": KUEUE_NAMESPACE},
                    "data": {
                        "ca.crt": _b64(kueue_ca.pem),
                        "ca.key": _b64(kueue_ca.key_pem),
                        "tls.crt": _b64(kueue_pair.cert.read_bytes()),
                        "tls.key": _b64(kueue_pair.key.read_bytes()),
                    },
                }
            )
            eventually(
                "CRDs established", lambda: all(_crd_established(kube, n) for n in crd_names), 60
            )
            timings["crds"] = round(time.monotonic() - t, 2)

            # JobSet and Kueue controllers
            t = time.monotonic()
            jobset_cfg = d / "jobset-config.yaml"
            jobset_cfg.write_text(yaml.safe_dump(jobset_config(ports, jobset_certs)))
            jobset = self._start(
                "jobset",
                jobset_command(self._bins["jobset"], jobset_cfg, jobset_kc),
                [ports["jobset_wh"], ports["jobset_metrics"], ports["jobset_health"]],
                logs,
            )
            kueue_cfg = d / "kueue-config.yaml"
            kueue_cfg.write_text(
                yaml.safe_dump(kueue_config(ports, kueue_certs, self.pods_ready_timeout))
            )
            kueue = self._start(
                "kueue",
                kueue_command(self._bins["kueue"], kueue_cfg, kueue_kc),
                [ports["kueue_wh"], ports["kueue_metrics"], ports["kueue_health"]],
                logs,
            )

            # simulated GPU nodes
            for i in range(self.n_nodes):
                cidr = kwok.loopback_pod_cidr(i) if self.loopback_pods else None
                kube.apply(kwok.node_manifest(i, self.n_nodes, self.shape, cidr))
            self.state.nodes = self.n_nodes
            self.state.save()

            def ready_nodes() -> bool:
                nodes = kube.core.list_node(
                    label_selector=f"{kwok.MANAGED_LABEL}={kwok.MANAGED_VALUE}"
                ).items
                return len(nodes) == self.n_nodes and all(_node_ready(n) for n in nodes)

            processes.wait_for("all KWOK nodes Ready", ready_nodes, 60, proc=kwok_proc)
            timings["nodes"] = round(time.monotonic() - t, 2)
            for proc, port in ((kcm, ports["kcm"]), (sched, ports["sched"])):
                processes.wait_for(
                    f"{proc.name} /healthz",
                    lambda port=port: _http_ok(f"https://{LOOPBACK}:{port}/healthz", _insecure()),
                    60,
                    proc=proc,
                )
            jobset = self._wait_controller_ready(jobset, ports["jobset_health"], logs)
            kueue = self._wait_controller_ready(kueue, ports["kueue_health"], logs)
            processes.wait_for(
                "JobSet and Kueue webhooks answering",
                lambda: (
                    processes.port_open(ports["jobset_wh"])
                    and processes.port_open(ports["kueue_wh"])
                ),
                60,
                proc=kueue,
            )
            self._wait_webhooks_effective(kube)
            self._create_resource_flavor(kube)
            eventually(
                "default ServiceAccount",
                lambda: kube.core.read_namespaced_service_account("default", "default"),
                60,
            )
            timings["controllers"] = round(time.monotonic() - t, 2)
        finally:
            kube.close()

    def _wait_webhooks_effective(self, kube: Kube) -> None:
        """A server-side dry-run create of a queued JobSet must come back suspended: proves
        Kueue's and JobSet's mutating webhooks are reached through the API server."""
        probe = {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {
                "name": "webhook-probe",
                "namespace": "default",
                "labels": {"kueue.x-k8s.io/queue-name": "probe"},
            },
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "w",
                        "replicas": 1,
                        "template": {
                            "spec": {
                                "template": {
                                    "spec": {
                                        "restartPolicy": "Never",
                                        "containers": [{"name": "c", "image": "busybox"}],
                                    }
                                }
                            }
                        },
                    }
                ]
            },
        }

        def suspended() -> bool:
            out = kube.custom.create_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", probe, dry_run="All"
            )
            return bool(out.get("spec", {}).get("suspend"))

        eventually("Kueue's JobSet webhook suspends a queued JobSet (dry run)", suspended, 60)

    def _create_resource_flavor(self, kube: Kube) -> None:
        body = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": RESOURCE_FLAVOR},
            "spec": {"nodeLabels": {kwok.GPU_PRODUCT_LABEL: kwok.GPU_PRODUCT}},
        }
        eventually("ResourceFlavor created", lambda: kube.kueue_create("resourceflavors", body), 30)

    def _start(
        self,
        name: str,
        argv: list[str],
        ports: list[int],
        logs: Path,
        env: dict[str, str] | None = None,
    ) -> Proc:
        proc = processes.start(name, argv, logs, ports, env=env, cwd=self.dir)
        self.state.procs.append(proc)
        self.state.save()
        return proc

    def _wait_controller_ready(self, proc: Proc, health_port: int, logs: Path) -> Proc:
        """Wait for a controller's /readyz; a controller that exits first (controller-runtime
        ends the process when an informer does not sync in time, as JobSet did once on a
        loaded CI machine: "Timeout: failed waiting for *v1alpha2.JobSet Informer to sync")
        is started once more with the same command, and a second exit fails naming it."""
        url = f"http://{LOOPBACK}:{health_port}/readyz"
        try:
            processes.wait_for(f"{proc.name} /readyz", lambda: _http_ok(url), 90, proc=proc)
            return proc
        except StartupError:
            if proc.alive():
                raise
        print(f"--- {proc.name} exited before ready; starting it once more. Its log's tail:")
        print(processes.tail(proc.log, 5))
        self.state.procs.remove(proc)
        again = self._start(proc.name, list(proc.argv), list(proc.ports), logs)
        processes.wait_for(f"{again.name} /readyz", lambda: _http_ok(url), 90, proc=again)
        return again

    def _dump_failure(self) -> None:
        for p in self.state.procs:
            if not p.alive():
                print(f"--- {p.name} exited; last log lines ({p.log}):\n{processes.tail(p.log)}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _crd_established(kube: Kube, name: str) -> bool:
    crd = kube.ext.read_custom_resource_definition(name)
    return any(
        c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])
    )


def _node_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


def env_kubeconfig() -> Path | None:
    v = os.environ.get("RTJ_E2E_KUBECONFIG")
    return Path(v) if v else None


__all__ = ["DEFAULT_NAME", "ClusterState", "LocalCluster", "StartupError", "env_kubeconfig"]
