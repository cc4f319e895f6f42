"""KWOK: the stage configuration and the simulated GPU nodes.

Nodes carry ``type=kwok`` (the label the KWOK controller manages), GPU capacity and zone/rack
labels. Pods and nodes annotated ``e2e.resilient.dev/kwok: ignore`` are left alone by every
stage except deletion, so a fault helper can write a status the way the kubelet would and
KWOK will not overwrite it (a deleted pod is still finalized, like a kubelet would).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

MANAGED_LABEL = "type"
MANAGED_VALUE = "kwok"
IGNORE_ANNOTATION = "e2e.resilient.dev/kwok"
IGNORE_VALUE = "ignore"
RACK_LABEL = "e2e.resilient.dev/rack"
ZONE_LABEL = "topology.kubernetes.io/zone"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
NODE_PREFIX = "gpu-node-"

_NOT_IGNORED = {"key": f'.metadata.annotations["{IGNORE_ANNOTATION}"]', "operator": "DoesNotExist"}


_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'


def _stage(
    name: str,
    kind: str,
    match: list[dict[str, Any]],
    next_: dict[str, Any],
    delay: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One KWOK Stage: what it selects (``match``) and what it does next."""
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": match},
    }
    if delay is not None:
        spec["delay"] = delay
    spec["next"] = next_
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": spec,
    }


def _node_initialize() -> dict[str, Any]:
    return _stage(
        "node-initialize",
        "Node",
        [_NOT_IGNORED, {"key": _READY, "operator": "NotIn", "values": ["True"]}],
        {"statusTemplate": _NODE_STATUS_TEMPLATE},
    )


def _node_heartbeat() -> dict[str, Any]:
    return _stage(
        "node-heartbeat-with-lease",
        "Node",
        [
            _NOT_IGNORED,
            {"key": ".status.phase", "operator": "In", "values": ["Running"]},
            {"key": _READY, "operator": "In", "values": ["True"]},
        ],
        {"statusTemplate": _NODE_HEARTBEAT_TEMPLATE},
        # the kubelet posts an unchanged status every 5 minutes when it also renews a lease
        delay={"durationMilliseconds": 300000, "jitterDurationMilliseconds": 310000},
    )


def _pod_ready() -> dict[str, Any]:
    return _stage(
        "pod-ready",
        "Pod",
        [
            _NOT_IGNORED,
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
            {"key": _READY, "operator": "NotIn", "values": ["True"]},
        ],
        {"statusTemplate": _POD_READY_TEMPLATE},
    )


def _pod_delete(after_terminal_phase: bool = False) -> dict[str, Any]:
    # Applies to ignored pods too: a kubelet finalizes a deleted pod whatever its status.
    match = [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}]
    if after_terminal_phase:
        live = ["Pending", "Running"]
        match.append({"key": ".status.phase", "operator": "NotIn", "values": live})
    return _stage("pod-delete", "Pod", match, {"delete": True})


_POD_TERMINATED_TEMPLATE = """\
{{ $now := Now }}
phase: Failed
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: 137
      reason: Error
      finishedAt: {{ $now | Quote }}
      startedAt: {{ $now | Quote }}
{{ end }}
"""
"""A deleted running pod once its kubelet killed its containers: the terminal phase, written
before the object goes. The kubelet does so for every deleted pod since Kubernetes 1.27
(kubernetes/kubernetes#115331, "Give terminal phase correctly to all pods that will not be
restarted", KEP-3329; pkg/kubelet/kubelet_pods.go `generateAPIPodStatus`); 137 is the code
its TerminatePod gives a container it killed (kubernetes/kubernetes#108366). Not faithful
for a node that has lost contact (`faults.node_lost`): its kubelet could write nothing, yet
this stage, which has no node selector, still turns its deleted pods Failed; the clusters
that use it (`bench.in_place_scale`) lose no node."""


def _pod_terminate() -> dict[str, Any]:
    return _stage(
        "pod-terminate-on-delete",
        "Pod",
        [
            {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
            {"key": ".status.phase", "operator": "In", "values": ["Pending", "Running"]},
        ],
        {"statusTemplate": _POD_TERMINATED_TEMPLATE},
    )


POD_CIDR = "10.0.0.1/16"
NODE_IP = "10.255.0.1"


def kwok_config_yaml(terminal_phase_on_delete: bool = False) -> str:
    """The Stage documents (the controller options are passed as flags: a partial
    KwokConfiguration document would leave the other options at zero). With
    ``terminal_phase_on_delete`` a deleted running pod first turns Failed, as a kubelet
    writes it, and only then goes (off: it goes at once, its phase unchanged)."""
    docs = [_node_initialize(), _node_heartbeat(), _pod_ready()]
    if terminal_phase_on_delete:
        docs.append(_pod_terminate())
    docs.append(_pod_delete(terminal_phase_on_delete))
    return yaml.safe_dump_all(docs, sort_keys=False)


@dataclass(frozen=True)
class NodeShape:
    gpus: int = 8
    cpu: str = "96"
    memory: str = "1Ti"
    pods: str = "110"
    zones: int = 2
    racks_per_zone: int = 2


def node_name(i: int) -> str:
    return f"{NODE_PREFIX}{i:02d}"


def gpu_node_labels(name: str, gpus: int) -> dict[str, str]:
    """What every simulated GPU node carries (the Kueue flavor selects the product label)."""
    return {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        GPU_PRODUCT_LABEL: GPU_PRODUCT,
        "nvidia.com/gpu.count": str(gpus),
    }


def loopback_pod_cidr(i: int) -> str:
    """Node ``i``'s pod range on loopback (127.4.0.0/24, 127.4.1.0/24, ...): every pod's
    address is this machine's, so one listener on 0.0.0.0 can stand in for every pod's."""
    return f"127.{4 + i // 256}.{i % 256}.0/24"


def node_manifest(
    i: int, n_nodes: int, shape: NodeShape = NodeShape(), pod_cidr: str | None = None
) -> dict[str, Any]:
    """Node ``i`` of ``n_nodes``: zones and racks spread evenly, 8 GPUs by default. With
    ``pod_cidr``, KWOK gives its pods addresses from it (pod_controller.go `PodIPsWith`:
    the node's podCIDRs first, else its ``--cidr``)."""
    racks = max(1, shape.zones * shape.racks_per_zone)
    per_rack = max(1, -(-n_nodes // racks))
    rack = i // per_rack
    zone = rack // shape.racks_per_zone
    name = node_name(i)
    resources = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": shape.pods,
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(shape.gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                MANAGED_LABEL: MANAGED_VALUE,
                **gpu_node_labels(name, shape.gpus),
                "node.kubernetes.io/instance-type": f"sim-{shape.gpus}x-h100",
                "topology.kubernetes.io/region": "e2e",
                ZONE_LABEL: f"e2e-zone-{chr(ord('a') + zone)}",
                RACK_LABEL: f"rack-{rack}",
            },
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]} if pod_cidr else {},
        "status": {
            "allocatable": resources,
            "capacity": resources,
        },
    }


# The two node templates are KWOK's own (kustomize/stage/node/fast and heartbeat-with-lease).
_NODE_STATUS_TEMPLATE = """\
{{ $now := Now }}
{{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $lastTransitionTime | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type  | Quote}}
{{ end }}
addresses:
{{ with NodeIP }}
- address: {{ . | Quote }}
  type: InternalIP
{{ end }}
{{ with NodeName }}
- address: {{ . | Quote }}
  type: Hostname
{{ end }}
{{ with NodePort }}
daemonEndpoints:
  kubeletEndpoint:
    Port: {{ . }}
{{ end }}
allocatable:
{{ with .status.allocatable }}
{{ YAML . 1 }}
{{ else }}
  cpu: 1k
  memory: 1Ti
  pods: 1M
{{ end }}
capacity:
{{ with .status.capacity }}
{{ YAML . 1 }}
{{ else }}
  cpu: 1k
  memory: 1Ti
  pods: 1M
{{ end }}
{{ $nodeInfo := .status.nodeInfo }}
{{ $kwokVersion := printf "kwok-%s" Version }}
nodeInfo:
  architecture: {{ or $nodeInfo.architecture "amd64" }}
  bootID: {{ or $nodeInfo.bootID `""` }}
  containerRuntimeVersion: {{ or $nodeInfo.containerRuntimeVersion $kwokVersion }}
  kernelVersion: {{ or $nodeInfo.kernelVersion $kwokVersion }}
  kubeProxyVersion: {{ or $nodeInfo.kubeProxyVersion $kwokVersion }}
  kubeletVersion: {{ or $nodeInfo.kubeletVersion $kwokVersion }}
  machineID: {{ or $nodeInfo.machineID `""` }}
  operatingSystem: {{ or $nodeInfo.operatingSystem "linux" }}
  osImage: {{ or $nodeInfo.osImage `""` }}
  systemUUID: {{ or $nodeInfo.systemUUID `""` }}
phase: Running
"""

_NODE_HEARTBEAT_TEMPLATE = """\
{{ $now := Now }}
{{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $lastTransitionTime | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""

# KWOK's kustomize/stage/pod/fast/pod-ready.yaml
_POD_READY_TEMPLATE = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: PodReadyToStartContainers
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
{{ range .spec.readinessGates }}
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: {{ .conditionType | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  {{ if eq .restartPolicy "Always" }}
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
  {{ else }}
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
  {{ end }}
{{ end }}
{{ $hostIPs := NodeIPsWith .spec.nodeName }}
{{ with $hostIPs }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )
  ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
{{ with $podIPs }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""
