"""What says a local cluster's component is up: its health endpoint answering, a CRD
established, a node Ready, the webhooks reached through the API server."""

from __future__ import annotations

import ssl
import urllib.request
from typing import Any

from .kube import Kube, eventually


def wait_webhooks_effective(kube: Kube) -> None:
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


def insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def crd_established(kube: Kube, name: str) -> bool:
    crd = kube.ext.read_custom_resource_definition(name)
    return any(
        c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])
    )


def node_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
