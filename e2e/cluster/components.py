"""The local cluster's components as they are started: each one's command line and
configuration, from its ports, files and settings. Pure: nothing here starts a process or
writes a file (`cluster.LocalCluster` does, in this order: etcd, kube-apiserver, then
kube-controller-manager, kube-scheduler and KWOK, then JobSet and Kueue).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .processes import LOOPBACK

KUEUE_NAMESPACE = "kueue-system"
KUEUE_SERVICE = "kueue-webhook-service"
KUEUE_SECRET = "kueue-webhook-server-cert"
SERVICE_CIDR = "10.96.0.0/16"
PORT_NAMES = (
    "etcd",
    "etcd_peer",
    "api",
    "kcm",
    "sched",
    "jobset_wh",
    "jobset_metrics",
    "jobset_health",
    "kueue_wh",
    "kueue_metrics",
    "kueue_health",
)
"""The loopback ports the cluster listens on, one free port each."""

Ports = dict[str, int]


def etcd_command(binary: Path, data_dir: Path, ports: Ports) -> list[str]:
    client = f"http://{LOOPBACK}:{ports['etcd']}"
    peer = f"http://{LOOPBACK}:{ports['etcd_peer']}"
    return [
        str(binary),
        "--name",
        "e2e",
        "--data-dir",
        str(data_dir),
        "--listen-client-urls",
        client,
        "--advertise-client-urls",
        client,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        f"e2e={peer}",
        "--unsafe-no-fsync",
        "--log-level",
        "warn",
        "--quota-backend-bytes",
        str(4 << 30),
    ]


def apiserver_command(
    binary: Path,
    ports: Ports,
    *,
    serving_cert: Path,
    serving_key: Path,
    client_ca: Path,
    service_account_cert: Path,
    service_account_key: Path,
    cert_dir: Path,
) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers=http://{LOOPBACK}:{ports['etcd']}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports['api']}",
        f"--advertise-address={LOOPBACK}",
        f"--tls-cert-file={serving_cert}",
        f"--tls-private-key-file={serving_key}",
        f"--client-ca-file={client_ca}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={service_account_cert}",
        f"--service-account-signing-key-file={service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        "--event-ttl=1h",
        f"--cert-dir={cert_dir}",
    ]


def controller_manager_command(
    binary: Path,
    kubeconfig: Path,
    ports: Ports,
    *,
    service_account_key: Path,
    root_ca: Path,
    cluster_name: str,
    node_monitor_grace: str,
) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports['kcm']}",
        f"--service-account-private-key-file={service_account_key}",
        f"--root-ca-file={root_ca}",
        "--use-service-account-credentials=true",
        "--leader-elect=false",
        f"--cluster-name={cluster_name}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--node-monitor-period=2s",
        f"--node-monitor-grace-period={node_monitor_grace}",
        "--profiling=false",
    ]


def scheduler_command(binary: Path, kubeconfig: Path, ports: Ports) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports['sched']}",
        "--leader-elect=false",
        "--profiling=false",
    ]


def kwok_command(
    binary: Path, kubeconfig: Path, config: Path, *, node_selector: str, lease_seconds: int
) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        f"--manage-nodes-with-label-selector={node_selector}",
        f"--node-lease-duration-seconds={lease_seconds}",
    ]


def jobset_config(ports: Ports, cert_dir: Path) -> dict[str, Any]:
    """JobSet's controller configuration: webhooks on loopback with our own certificate."""
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": ports["jobset_wh"], "host": LOOPBACK, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"{LOOPBACK}:{ports['jobset_metrics']}"},
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{ports['jobset_health']}"},
    }


def jobset_command(binary: Path, config: Path, kubeconfig: Path) -> list[str]:
    return [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}", "--zap-log-level=info"]


def kueue_config(ports: Ports, cert_dir: Path, pods_ready_timeout: str) -> dict[str, Any]:
    """Kueue's controller configuration (the kind cluster uses it too, minus the ports)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{ports['kueue_health']}"},
        "metrics": {"bindAddress": f"{LOOPBACK}:{ports['kueue_metrics']}"},
        "webhook": {"port": ports["kueue_wh"], "host": LOOPBACK, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        # Kueue's rotator keeps the pre-created secret: its certificate is valid for the
        # service name it checks and for 127.0.0.1, where the webhooks are served.
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": KUEUE_SERVICE,
            "webhookSecretName": KUEUE_SECRET,
        },
        # gang admission: a workload counts as running only when all its pods are Ready,
        # and nothing else is admitted meanwhile
        "waitForPodsReady": {
            "timeout": pods_ready_timeout,
            "blockAdmission": True,
            "requeuingStrategy": {
                "timestamp": "Eviction",
                "backoffBaseSeconds": 5,
                "backoffMaxSeconds": 60,
            },
        },
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["jobset.x-k8s.io/jobset", "batch/job"]},
        "clientConnection": {"qps": 100, "burst": 200},
    }


def kueue_command(binary: Path, config: Path, kubeconfig: Path) -> list[str]:
    return [
        str(binary),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        # the on-demand visibility API server writes its certificates to the absolute path
        # /visibility and needs an APIService; not used here
        "--feature-gates=VisibilityOnDemand=false",
        "--zap-log-level=info",
    ]
