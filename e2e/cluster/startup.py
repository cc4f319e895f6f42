"""Starting a local cluster's processes, stage by stage: certificates and kubeconfigs, etcd,
kube-apiserver, the controller manager, scheduler and KWOK, JobSet's and Kueue's CRDs and
webhooks, their controllers, the simulated GPU nodes, and the checks that each answers
(`LocalCluster.up`)."""

from __future__ import annotations

import base64
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from .pki import CA, CertPair, service_account_keys
from .probes import crd_established, http_ok, insecure, node_ready, wait_webhooks_effective
from .processes import LOOPBACK, Proc, StartupError

if TYPE_CHECKING:
    from .cluster import LocalCluster

JOBSET_NAMESPACE = "jobset-system"
RESOURCE_FLAVOR = "gpu-h100"

CLIENTS: tuple[tuple[str, str, str | None], ...] = (
    ("kube-controller-manager", "system:kube-controller-manager", None),
    ("kube-scheduler", "system:kube-scheduler", None),
    ("kwok", "kwok-controller", "system:masters"),
    ("jobset", "jobset-controller", "system:masters"),
    ("kueue", "kueue-controller", "system:masters"),
)
"""Each controller's kubeconfig: its user name, certificate CN and organization."""


@dataclass(frozen=True)
class Certificates:
    """What the PKI stage issued."""

    ca: CA
    service_account: CertPair
    apiserver: CertPair
    admin: CertPair
    kubeconfigs: dict[str, Path]
    """Per controller (`CLIENTS`), its kubeconfig."""
    jobset_webhook: Path
    """The directory of JobSet's webhook serving certificate (our own CA's)."""
    kueue_ca: CA
    """A CA Kueue's cert rotator accepts."""
    kueue_webhook: Path
    kueue_pair: CertPair


class Startup:
    """One start of a cluster's processes, each recorded in its state as it starts."""

    def __init__(self, cluster: LocalCluster, bins: dict[str, Path]) -> None:
        self.cluster = cluster
        self.bins = bins
        self.d = cluster.dir
        self.logs = cluster.dir / "logs"
        self.timings = cluster.state.timings
        self.ports = dict(zip(PORT_NAMES, processes.free_ports(len(PORT_NAMES)), strict=True))
        self.server = f"https://{LOOPBACK}:{self.ports['api']}"

    def run(self) -> None:
        t = time.monotonic()
        certs = self._certificates()
        self.timings["pki"] = round(time.monotonic() - t, 2)
        t = time.monotonic()
        self._start_etcd()
        self.timings["etcd"] = round(time.monotonic() - t, 2)
        t = time.monotonic()
        self._start_apiserver(certs)
        self.timings["kube-apiserver"] = round(time.monotonic() - t, 2)
        # controller-manager, scheduler, KWOK: no ordering between them
        t = time.monotonic()
        kcm, sched, kwok_proc = self._start_node_controllers(certs)
        kube = Kube(self.cluster.kubeconfig)
        try:
            self._install_crds_and_webhooks(kube, certs)
            self.timings["crds"] = round(time.monotonic() - t, 2)
            t = time.monotonic()
            jobset, kueue = self._start_jobset_and_kueue(certs)
            self._create_nodes(kube, kwok_proc)
            self.timings["nodes"] = round(time.monotonic() - t, 2)
            self._wait_controllers(kube, kcm, sched, jobset, kueue)
            self.timings["controllers"] = round(time.monotonic() - t, 2)
        finally:
            kube.close()

    # --- certificates and kubeconfigs ----------------------------------------------------
    def _certificates(self) -> Certificates:
        pki = self.d / "pki"
        ca = CA(pki)
        sa = service_account_keys(pki)
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
        self.cluster.state.api_port = self.ports["api"]
        admin_pair = ca.issue("admin", "rtj-e2e-admin", org="system:masters", client=True)
        write_kubeconfig(
            self.cluster.kubeconfig,
            server=self.server,
            ca_file=ca.cert_path,
            cert_file=admin_pair.cert,
            key_file=admin_pair.key,
        )
        kubeconfigs = {
            user: self._client_kubeconfig(ca, user, cn, org) for user, cn, org in CLIENTS
        }
        jobset_certs, kueue_ca, kueue_certs, kueue_pair = self._webhook_certificates(ca)
        return Certificates(
            ca, sa, api_cert, admin_pair, kubeconfigs, jobset_certs, kueue_ca, kueue_certs,
            kueue_pair,
        )  # fmt: skip

    def _client_kubeconfig(self, ca: CA, user: str, cn: str, org: str | None) -> Path:
        pair = ca.issue(user, cn, org=org, client=True)
        return write_kubeconfig(
            self.d / f"{user}.kubeconfig",
            server=self.server,
            ca_file=ca.cert_path,
            cert_file=pair.cert,
            key_file=pair.key,
            user=user,
        )

    def _webhook_certificates(self, ca: CA) -> tuple[Path, CA, Path, CertPair]:
        """Webhook serving certificates (JobSet: our own; Kueue: a CA its cert rotator
        accepts)."""
        jobset_certs = self.d / "jobset-certs"
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
            self.d / "kueue-ca", name="kueue-ca", org="kueue", rsa_key=True, dns_san=("kueue-ca",)
        )
        kueue_certs = self.d / "kueue-certs"
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
        return jobset_certs, kueue_ca, kueue_certs, kueue_pair

    # --- the control plane ---------------------------------------------------------------
    def _start_etcd(self) -> None:
        ports = self.ports
        etcd = self.start(
            "etcd",
            etcd_command(self.bins["etcd"], self.d / "etcd-data", ports),
            [ports["etcd"], ports["etcd_peer"]],
        )
        processes.wait_for(
            "etcd health",
            lambda: http_ok(f"http://{LOOPBACK}:{ports['etcd']}/health"),
            30,
            proc=etcd,
        )

    def _start_apiserver(self, certs: Certificates) -> None:
        apiserver = self.start(
            "kube-apiserver",
            apiserver_command(
                self.bins["kube-apiserver"],
                self.ports,
                serving_cert=certs.apiserver.cert,
                serving_key=certs.apiserver.key,
                client_ca=certs.ca.cert_path,
                service_account_cert=certs.service_account.cert,
                service_account_key=certs.service_account.key,
                cert_dir=self.d / "apiserver-certs",
            ),
            [self.ports["api"]],
        )
        ssl_ctx = ssl.create_default_context(cafile=str(certs.ca.cert_path))
        ssl_ctx.load_cert_chain(str(certs.admin.cert), str(certs.admin.key))
        processes.wait_for(
            "kube-apiserver /readyz",
            lambda: http_ok(f"{self.server}/readyz", ssl_ctx),
            90,
            proc=apiserver,
        )

    def _start_node_controllers(self, certs: Certificates) -> tuple[Proc, Proc, Proc]:
        """The controller manager, the scheduler and KWOK (the simulated nodes' kubelets)."""
        cluster, kubeconfigs = self.cluster, certs.kubeconfigs
        kcm = self.start(
            "kube-controller-manager",
            controller_manager_command(
                self.bins["kube-controller-manager"],
                kubeconfigs["kube-controller-manager"],
                self.ports,
                service_account_key=certs.service_account.key,
                root_ca=certs.ca.cert_path,
                cluster_name=cluster.name,
                node_monitor_grace=cluster.monitor_grace(),
            ),
            [self.ports["kcm"]],
        )
        sched = self.start(
            "kube-scheduler",
            scheduler_command(
                self.bins["kube-scheduler"], kubeconfigs["kube-scheduler"], self.ports
            ),
            [self.ports["sched"]],
        )
        kwok_cfg = self.d / "kwok.yaml"
        kwok_cfg.write_text(kwok.kwok_config_yaml(cluster.terminal_phase_on_delete))
        kwok_proc = self.start(
            "kwok",
            kwok_command(
                self.bins["kwok"],
                kubeconfigs["kwok"],
                kwok_cfg,
                node_selector=f"{kwok.MANAGED_LABEL}={kwok.MANAGED_VALUE}",
                lease_seconds=cluster.node_lease_seconds,
            ),
            [],
        )
        return kcm, sched, kwok_proc

    # --- JobSet and Kueue ----------------------------------------------------------------
    def _install_crds_and_webhooks(self, kube: Kube, certs: Certificates) -> None:
        """CRDs and webhook configurations from the modules' own manifests."""
        versions = self.cluster.versions
        jobset_dir = build.module_dir("sigs.k8s.io/jobset", versions["JOBSET"])
        kueue_dir = build.module_dir("sigs.k8s.io/kueue", versions["KUEUE"])
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
                    crd, port=self.ports["kueue_wh"], ca_pem=certs.kueue_ca.pem
                )
            kube.apply(crd)
            crd_names.append(crd["metadata"]["name"])
        for obj in manifests.point_at_loopback(
            manifests.webhook_configurations(jobset_dir),
            port=self.ports["jobset_wh"],
            ca_pem=certs.ca.pem,
            name_prefix="jobset",
        ):
            kube.apply(obj)
        for obj in manifests.point_at_loopback(
            manifests.webhook_configurations(kueue_dir),
            port=self.ports["kueue_wh"],
            ca_pem=certs.kueue_ca.pem,
            name_prefix="kueue",
        ):
            kube.apply(obj)
        kube.apply(_kueue_secret(certs))
        eventually("CRDs established", lambda: all(crd_established(kube, n) for n in crd_names), 60)

    def _start_jobset_and_kueue(self, certs: Certificates) -> tuple[Proc, Proc]:
        ports, kubeconfigs = self.ports, certs.kubeconfigs
        jobset_cfg = self.d / "jobset-config.yaml"
        jobset_cfg.write_text(yaml.safe_dump(jobset_config(ports, certs.jobset_webhook)))
        jobset = self.start(
            "jobset",
            jobset_command(self.bins["jobset"], jobset_cfg, kubeconfigs["jobset"]),
            [ports["jobset_wh"], ports["jobset_metrics"], ports["jobset_health"]],
        )
        kueue_cfg = self.d / "kueue-config.yaml"
        kueue_cfg.write_text(
            yaml.safe_dump(
                kueue_config(ports, certs.kueue_webhook, self.cluster.pods_ready_timeout)
            )
        )
        kueue = self.start(
            "kueue",
            kueue_command(self.bins["kueue"], kueue_cfg, kubeconfigs["kueue"]),
            [ports["kueue_wh"], ports["kueue_metrics"], ports["kueue_health"]],
        )
        return jobset, kueue

    # --- the simulated GPU nodes, and every controller answering -------------------------
    def _create_nodes(self, kube: Kube, kwok_proc: Proc) -> None:
        cluster = self.cluster
        for i in range(cluster.n_nodes):
            cidr = kwok.loopback_pod_cidr(i) if cluster.loopback_pods else None
            kube.apply(kwok.node_manifest(i, cluster.n_nodes, cluster.shape, cidr))
        cluster.state.nodes = cluster.n_nodes
        cluster.state.save()

        def ready_nodes() -> bool:
            nodes = kube.core.list_node(
                label_selector=f"{kwok.MANAGED_LABEL}={kwok.MANAGED_VALUE}"
            ).items
            return len(nodes) == cluster.n_nodes and all(node_ready(n) for n in nodes)

        processes.wait_for("all KWOK nodes Ready", ready_nodes, 60, proc=kwok_proc)

    def _wait_controllers(
        self, kube: Kube, kcm: Proc, sched: Proc, jobset: Proc, kueue: Proc
    ) -> None:
        ports = self.ports
        for proc, port in ((kcm, ports["kcm"]), (sched, ports["sched"])):
            processes.wait_for(
                f"{proc.name} /healthz",
                lambda port=port: http_ok(f"https://{LOOPBACK}:{port}/healthz", insecure()),
                60,
                proc=proc,
            )
        jobset = self._wait_controller_ready(jobset, ports["jobset_health"])
        kueue = self._wait_controller_ready(kueue, ports["kueue_health"])
        processes.wait_for(
            "JobSet and Kueue webhooks answering",
            lambda: (
                processes.port_open(ports["jobset_wh"]) and processes.port_open(ports["kueue_wh"])
            ),
            60,
            proc=kueue,
        )
        wait_webhooks_effective(kube)
        create_resource_flavor(kube)
        eventually(
            "default ServiceAccount",
            lambda: kube.core.read_namespaced_service_account("default", "default"),
            60,
        )

    # --- processes -----------------------------------------------------------------------
    def start(
        self, name: str, argv: list[str], ports: list[int], env: dict[str, str] | None = None
    ) -> Proc:
        """Start one component, recorded in the cluster's state at once."""
        state = self.cluster.state
        proc = processes.start(name, argv, self.logs, ports, env=env, cwd=self.d)
        state.procs.append(proc)
        state.save()
        return proc

    def _wait_controller_ready(self, proc: Proc, health_port: int) -> Proc:
        """Wait for a controller's /readyz; a controller that exits first (controller-runtime
        ends the process when an informer does not sync in time, as JobSet did once on a
        loaded CI machine: "Timeout: failed waiting for *v1alpha2.JobSet Informer to sync")
        is started once more with the same command, and a second exit fails naming it."""
        url = f"http://{LOOPBACK}:{health_port}/readyz"
        try:
            processes.wait_for(f"{proc.name} /readyz", lambda: http_ok(url), 90, proc=proc)
            return proc
        except StartupError:
            if proc.alive():
                raise
        print(f"--- {proc.name} exited before ready; starting it once more. Its log's tail:")
        print(processes.tail(proc.log, 5))
        self.cluster.state.procs.remove(proc)
        again = self.start(proc.name, list(proc.argv), list(proc.ports))
        processes.wait_for(f"{again.name} /readyz", lambda: http_ok(url), 90, proc=again)
        return again


def _kueue_secret(certs: Certificates) -> dict[str, Any]:
    """Kueue's webhook Secret: its CA (for its cert rotator) and serving certificate."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": KUEUE_SECRET, "namespace": KUEUE_NAMESPACE},
        "data": {
            "ca.crt": _b64(certs.kueue_ca.pem),
            "ca.key": _b64(certs.kueue_ca.key_pem),
            "tls.crt": _b64(certs.kueue_pair.cert.read_bytes()),
            "tls.key": _b64(certs.kueue_pair.key.read_bytes()),
        },
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def create_resource_flavor(kube: Kube) -> None:
    """The ResourceFlavor of the simulated GPU nodes (the ClusterQueues' flavor)."""
    body = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": RESOURCE_FLAVOR},
        "spec": {"nodeLabels": {kwok.GPU_PRODUCT_LABEL: kwok.GPU_PRODUCT}},
    }
    eventually("ResourceFlavor created", lambda: kube.kueue_create("resourceflavors", body), 30)
