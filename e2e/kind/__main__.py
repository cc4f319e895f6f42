"""``python -m e2e.kind up|down|test|all`` -- the cluster scenarios against kind.

kind, kubectl (with its built-in kustomize) are built from their Go modules like the rest of
the harness; JobSet and Kueue are installed from their modules' own ``config/default``
kustomizations with the release images of the pinned versions. A kind node has no GPU, so
each worker advertises ``nvidia.com/gpu: 8`` as an extended resource (a node-status patch,
the documented way) and carries the same zone/rack/GPU labels as the KWOK nodes.

This needs a Docker daemon and registry access; it cannot run on the build machines (no
container engine), so it is kept honest by review, not by CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from e2e.cluster import build, kwok
from e2e.cluster.cluster import PODS_READY_TIMEOUT
from e2e.cluster.components import KUEUE_NAMESPACE, kueue_config
from e2e.cluster.startup import RESOURCE_FLAVOR
from e2e.cluster.versions import load_versions

NAME = "rtj-kind"
REPO = Path(__file__).resolve().parents[2]


def state_dir() -> Path:
    return build.cache_dir() / "kind" / NAME


def kubeconfig() -> Path:
    return state_dir() / "kubeconfig"


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    print("+ " + " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, text=True, **kw)  # type: ignore[call-overload,no-any-return]


def _kubectl(*args: str, stdin: str | None = None) -> str:
    kc = str(build.binary_path("kubectl"))
    out = _run([kc, f"--kubeconfig={kubeconfig()}", *args], input=stdin, capture_output=True)
    return str(out.stdout)


def kind_config(workers: int) -> dict[str, object]:
    nodes: list[dict[str, object]] = [{"role": "control-plane"}]
    for i in range(workers):
        labels = kwok.node_manifest(i, workers)["metadata"]["labels"]
        labels = {
            k: v
            for k, v in labels.items()
            if k
            not in (
                "kubernetes.io/hostname",
                "kubernetes.io/os",
                "kubernetes.io/arch",
                kwok.MANAGED_LABEL,
            )
        }
        nodes.append({"role": "worker", "labels": labels})
    return {"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4", "nodes": nodes}


def _overlay(module_dir: Path, image: str, tag: str, tmp: Path, name: str) -> Path:
    d = tmp / name
    d.mkdir()
    (d / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(module_dir / "config" / "default")],
                "images": [{"name": "controller", "newName": image, "newTag": tag}],
            }
        )
    )
    return d


def docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        r = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def up(workers: int) -> None:
    if not docker_available():
        sys.exit(
            "make e2e-kind needs a running Docker daemon (`docker info` fails here); "
            "use the local cluster (make cluster-up / make test) instead"
        )
    versions = load_versions()
    build.build(["kind", "kubectl"])
    image = os.environ.get("RTJ_E2E_KIND_NODE_IMAGE", versions["KIND_NODE_IMAGE"])
    state_dir().mkdir(parents=True, exist_ok=True)
    cfg = state_dir() / "kind.yaml"
    cfg.write_text(yaml.safe_dump(kind_config(workers)))
    _run(
        [
            str(build.binary_path("kind")),
            "create",
            "cluster",
            "--name",
            NAME,
            "--image",
            image,
            "--config",
            str(cfg),
            "--kubeconfig",
            str(kubeconfig()),
            "--wait",
            "180s",
        ]
    )
    # advertise the simulated GPUs (extended resources are advertised by patching node status)
    nodes = json.loads(_kubectl("get", "nodes", "-l", kwok.GPU_PRODUCT_LABEL, "-o", "json"))
    for n in nodes["items"]:
        _kubectl(
            "patch",
            "node",
            n["metadata"]["name"],
            "--subresource=status",
            "--type=json",
            "-p",
            json.dumps([{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"}]),
        )
    with tempfile.TemporaryDirectory() as tmp:
        jobset_dir = build.module_dir("sigs.k8s.io/jobset", versions["JOBSET"])
        kueue_dir = build.module_dir("sigs.k8s.io/kueue", versions["KUEUE"])
        _kubectl(
            "apply",
            "--server-side",
            "-k",
            str(
                _overlay(
                    jobset_dir,
                    "registry.k8s.io/jobset/jobset",
                    versions["JOBSET"],
                    Path(tmp),
                    "jobset",
                )
            ),
        )
        _kubectl(
            "apply",
            "--server-side",
            "-k",
            str(
                _overlay(
                    kueue_dir, "registry.k8s.io/kueue/kueue", versions["KUEUE"], Path(tmp), "kueue"
                )
            ),
        )
    _kubectl(
        "-n",
        "jobset-system",
        "rollout",
        "status",
        "deploy/jobset-controller-manager",
        "--timeout=300s",
    )
    # the same Kueue configuration as the local cluster, minus its loopback ports
    cfg_doc = kueue_config(
        {k: 0 for k in ("kueue_health", "kueue_metrics", "kueue_wh")},
        Path("/tmp"),
        PODS_READY_TIMEOUT,
    )
    for k in ("health", "metrics", "webhook", "internalCertManagement"):
        cfg_doc.pop(k)
    cfg_doc["internalCertManagement"] = {"enable": True}
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kueue-manager-config", "namespace": KUEUE_NAMESPACE},
        "data": {"controller_manager_config.yaml": yaml.safe_dump(cfg_doc)},
    }
    _kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(cm))
    _kubectl("-n", KUEUE_NAMESPACE, "rollout", "restart", "deploy/kueue-controller-manager")
    _kubectl(
        "-n",
        KUEUE_NAMESPACE,
        "rollout",
        "status",
        "deploy/kueue-controller-manager",
        "--timeout=300s",
    )
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": RESOURCE_FLAVOR},
        "spec": {"nodeLabels": {kwok.GPU_PRODUCT_LABEL: kwok.GPU_PRODUCT}},
    }
    _kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(flavor))
    print(kubeconfig())


def down() -> None:
    _run([str(build.binary_path("kind")), "delete", "cluster", "--name", NAME])


def test(workers: int, extra: list[str]) -> int:
    env = dict(
        os.environ,
        RTJ_E2E_KUBECONFIG=str(kubeconfig()),
        RTJ_E2E_BACKEND="kind",
        RTJ_E2E_NODES=str(workers),
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/integration/cluster",
        "-m",
        "cluster and not local_only",
        *extra,
    ]
    return subprocess.call(cmd, cwd=REPO, env=env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.kind")
    ap.add_argument("cmd", choices=["up", "down", "test", "all"])
    ap.add_argument("--workers", type=int, default=int(os.environ.get("RTJ_E2E_NODES", "2")))
    args, extra = ap.parse_known_args(argv)
    if args.cmd == "up":
        up(args.workers)
        return 0
    if args.cmd == "down":
        down()
        return 0
    if args.cmd == "test":
        return test(args.workers, extra)
    up(args.workers)
    try:
        return test(args.workers, extra)
    finally:
        down()


if __name__ == "__main__":
    sys.exit(main())
