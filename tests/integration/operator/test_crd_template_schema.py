"""`spec.template` has Kubernetes' PodTemplateSpec schema, checked with the real kubectl against
the real API server: `kubectl explain` documents it, `kubectl apply` (strict field validation)
refuses a typo or a wrongly typed field naming it, and a pod template using the common
container fields is stored exactly as written."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.build import GOMOD_DIR, kubectl
from e2e.operator_proc import rtj_body, wait_for
from rtj_operator.api import keys, schemas
from rtj_operator.api.schemas import KUBERNETES_VERSION, openapi
from rtj_operator.kube import Kube

pytestmark = [pytest.mark.cluster]

URI = "s3://bucket/prefix"


def _apply(rtj_cluster: Any, tmp_path: Path, body: dict[str, Any]) -> Any:
    manifest = tmp_path / f"{body['metadata']['name']}.yaml"
    manifest.write_text(yaml.safe_dump(body), encoding="utf-8")
    return kubectl(rtj_cluster.kubeconfig, "apply", "-f", str(manifest))


def _explain(rtj_cluster: Any, field: str) -> str:
    """`kubectl explain`, retried while the API server publishes the CRD's OpenAPI."""

    def explained() -> str | None:
        out = kubectl(rtj_cluster.kubeconfig, "explain", field)
        return out.stdout if out.returncode == 0 else None

    return wait_for(f"kubectl explain {field}", explained, 30, every=1.0)


def test_the_vendored_schema_is_what_the_pinned_kubernetes_module_generates() -> None:
    """The module the cluster harness builds from (e2e/cluster/gomod requires it, so `make
    cluster-build` leaves it in the Go module cache; go.sum pins its hash) regenerates the
    vendored file byte for byte."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", "k8s.io/kubernetes"],
        cwd=GOMOD_DIR, env={"GOTOOLCHAIN": "local", **os.environ},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    module = json.loads(out.stdout)
    assert module["Version"] == KUBERNETES_VERSION
    document = Path(module["Dir"]) / schemas.OPENAPI_FILE
    text = openapi.render(openapi.vendored_document(document.read_bytes()))
    assert text == schemas.VENDORED.read_text(encoding="utf-8"), (
        "stale: python -m rtj_operator.api.schemas"
    )


def test_kubectl_explain_documents_the_pod_template(rtj_api: Kube, rtj_cluster: Any) -> None:
    image = _explain(rtj_cluster, "rtj.spec.template.spec.containers.image")
    assert "FIELD: image <string>" in image, image
    assert "Container image name." in image, image  # Kubernetes' own description

    template = _explain(rtj_cluster, "rtj.spec.template")
    assert f"PodTemplateSpec schema of Kubernetes {KUBERNETES_VERSION}" in template, template
    assert "metadata\t<Object>" in template and "spec\t<Object>" in template, template

    port = _explain(rtj_cluster, "rtj.spec.template.spec.containers.livenessProbe.httpGet.port")
    assert "Name or number of the port" in port, port

    meta = _explain(rtj_cluster, "rtj.spec.template.metadata")
    assert "labels\t<map[string]string>" in meta, meta
    assert "ownerReferences" not in meta, meta


@pytest.mark.parametrize(
    ("container", "messages"),
    [
        ({"imagee": "registry.example/trainer:dev"},
         ['unknown field "spec.template.spec.containers[0].imagee"']),
        ({"ports": [{"containerPort": "http"}]},
         ["spec.template.spec.containers[0].ports[0].containerPort", "must be of type integer"]),
        ({"resources": {"limits": {"cpu": "lots"}}},
         ["spec.template.spec.containers[0].resources.limits.cpu", "should match"]),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
         ["spec.template.spec.containers[0].env[1]", "Duplicate value"]),
    ],
    ids=["unknown-field", "wrong-type", "bad-quantity", "duplicate-env"],
)  # fmt: skip
def test_kubectl_apply_refuses_a_bad_pod_template_naming_the_field(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, tmp_path: Path,
    container: dict[str, Any], messages: list[str],
) -> None:  # fmt: skip
    body = rtj_body("typo", rtj_ns.name, URI)
    body["spec"]["template"]["spec"]["containers"][0].update(container)

    out = _apply(rtj_cluster, tmp_path, body)

    assert out.returncode != 0, out.stdout
    for message in messages:
        assert message in out.stderr, out.stderr
    assert rtj_api.list_rtjs(rtj_ns.name) == [], "nothing was stored"


def test_without_strict_validation_an_unknown_field_is_dropped_not_stored(
    rtj_api: Kube, rtj_ns: Any
) -> None:
    """A client that does not ask for strict field validation (the API server's default is
    Warn) gets the job without the unknown field: it never reaches the JobSet."""
    body = rtj_body("warned", rtj_ns.name, URI)
    body["spec"]["template"]["spec"]["containers"][0]["imagee"] = "x"
    body["spec"]["template"]["spec"]["nonsense"] = {"a": 1}
    rtj_api.create_rtj(rtj_ns.name, body)

    stored = rtj_api.get_rtj(rtj_ns.name, "warned")["spec"]["template"]
    assert "imagee" not in stored["spec"]["containers"][0]
    assert "nonsense" not in stored["spec"]


FULL_TEMPLATE: dict[str, Any] = {
    "metadata": {
        "labels": {"team": "llm", "app.kubernetes.io/name": "trainer"},
        "annotations": {"example.com/note": "kept"},
    },
    "spec": {
        "serviceAccountName": "trainer",
        "automountServiceAccountToken": True,
        "terminationGracePeriodSeconds": 120,
        "priorityClassName": "training",
        "nodeSelector": {"nvidia.com/gpu.product": "H100"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "spot",
                "operator": "Equal",
                "value": "true",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "topology.kubernetes.io/zone",
                                    "operator": "In",
                                    "values": ["a", "b"],
                                }
                            ]
                        }
                    ]
                }
            }
        },
        "securityContext": {"runAsUser": 0, "fsGroup": 1000, "supplementalGroups": [44]},
        "imagePullSecrets": [{"name": "registry"}],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
            {
                "name": "config",
                "configMap": {
                    "name": "train-config",
                    "defaultMode": 420,
                    "items": [{"key": "a.yaml", "path": "a.yaml"}],
                },
            },
            {
                "name": "token",
                "projected": {
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "path": "token",
                                "expirationSeconds": 3600,
                                "audience": "s3",
                            }
                        }
                    ]
                },
            },
        ],
        "initContainers": [
            {"name": "fetch", "image": "busybox:1.36", "command": ["sh", "-c", "true"]},
        ],
        "containers": [
            {
                "name": "trainer",
                "image": "registry.example/trainer:dev",
                "imagePullPolicy": "IfNotPresent",
                "command": ["torchrun"],
                "args": ["--nproc-per-node=8", "train.py"],
                "workingDir": "/workspace",
                "env": [
                    {"name": "NCCL_DEBUG", "value": "WARN"},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {
                        "name": "HF_TOKEN",
                        "valueFrom": {
                            "secretKeyRef": {"name": "hf", "key": "token", "optional": True}
                        },
                    },
                    {
                        "name": "GPU_LIMIT",
                        "valueFrom": {
                            "resourceFieldRef": {
                                "resource": "limits.nvidia.com/gpu",
                                "divisor": "1",
                            }
                        },
                    },
                ],
                "envFrom": [
                    {"configMapRef": {"name": "train-env"}},
                    {"prefix": "S3_", "secretRef": {"name": "s3", "optional": False}},
                ],
                "resources": {
                    "requests": {"cpu": "500m", "memory": "64Gi", "nvidia.com/gpu": "8"},
                    "limits": {"memory": "64Gi", "nvidia.com/gpu": 8},
                },
                "volumeMounts": [
                    {"name": "shm", "mountPath": "/dev/shm"},
                    {"name": "data", "mountPath": "/data", "readOnly": True, "subPath": "v1"},
                    {"name": "config", "mountPath": "/etc/train"},
                ],
                "securityContext": {
                    "runAsUser": 0,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"add": ["IPC_LOCK"], "drop": ["NET_RAW"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "ports": [
                    {"name": "http", "containerPort": 8080, "protocol": "TCP"},
                    {"containerPort": 29500, "protocol": "TCP"},
                ],
                "startupProbe": {
                    "exec": {"command": ["cat", "/tmp/ready"]},
                    "failureThreshold": 60,
                    "periodSeconds": 10,
                },
                "livenessProbe": {
                    "httpGet": {
                        "path": "/healthz",
                        "port": "http",
                        "scheme": "HTTP",
                        "httpHeaders": [{"name": "X-Probe", "value": "1"}],
                    },
                    "initialDelaySeconds": 30,
                    "timeoutSeconds": 5,
                },
                "readinessProbe": {"tcpSocket": {"port": 29500}, "periodSeconds": 5},
                "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ],
    },
}


def test_a_template_with_the_common_container_fields_is_stored_as_written(
    rtj_api: Kube, rtj_cluster: Any, rtj_ns: Any, tmp_path: Path
) -> None:
    body = rtj_body("full", rtj_ns.name, URI)
    body["spec"]["template"] = copy.deepcopy(FULL_TEMPLATE)

    out = _apply(rtj_cluster, tmp_path, body)
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr

    got = kubectl(rtj_cluster.kubeconfig, "get", "rtj", "full", "-n", rtj_ns.name, "-o", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["spec"]["template"] == FULL_TEMPLATE, "nothing pruned or added"


def test_the_kubernetes_defaults_of_the_template_apply_as_in_a_pod(
    rtj_api: Kube, rtj_ns: Any
) -> None:
    """The one visible default: a list-map key (`ports[].protocol`) must be defaulted, as the
    Pod API does; a port written without it is stored with TCP."""
    body = rtj_body("ports", rtj_ns.name, URI)
    body["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 29500}]
    rtj_api.create_rtj(rtj_ns.name, body)

    stored = rtj_api.get_rtj(rtj_ns.name, "ports")["spec"]["template"]
    assert stored["spec"]["containers"][0]["ports"] == [{"containerPort": 29500, "protocol": "TCP"}]
    assert (
        stored["spec"]["containers"][0].keys()
        == body["spec"]["template"]["spec"]["containers"][0].keys()
    )


def test_the_template_stays_immutable_while_running_and_needs_a_container(
    rtj_api: Kube, rtj_ns: Any
) -> None:
    """The CEL rules over the typed template still compile and hold: no containers is refused,
    and a template change outside a suspension is refused naming spec.template."""
    path = f"/apis/{keys.GROUP}/{keys.VERSION}/namespaces/{rtj_ns.name}/{keys.PLURAL}"
    empty = rtj_body("empty", rtj_ns.name, URI)
    empty["spec"]["template"]["spec"]["containers"] = []
    with pytest.raises(Exception, match="at least one container"):
        rtj_api.request("create", "POST", path, empty)

    rtj_api.create_rtj(rtj_ns.name, rtj_body("frozen", rtj_ns.name, URI))
    changed = rtj_api.get_rtj(rtj_ns.name, "frozen")
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example/other:1"
    with pytest.raises(Exception, match="template may change only while the job is suspended"):
        rtj_api.request("replace", "PUT", f"{path}/frozen", changed)
