"""Rendering the Helm chart with the pinned helm (built by e2e.cluster) and reading it back.

A uniquely named module (tests/ has no packages): the chart's unit and cluster tests share it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import build

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "resilient-training-operator"
CRD_SOURCE = REPO / "crds" / "resilienttrainingjobs.yaml"
CHART_CRD = CHART / "crds" / "resilienttrainingjobs.yaml"
KUBE_VERSION = "1.35.4"
MONITORING = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)
"""What a cluster with the Prometheus Operator serves (the chart no longer asks)."""
MONITORING_ON = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
ALERTS = (
    "RTJCheckpointStale",
    "RTJRestartBudgetLow",
    "RTJJobFailed",
    "RTJRecoverySlow",
    "RTJNodeQuarantined",
    "RTJRunningShrunk",
    "RTJFastTierReplicaStalled",
    "RTJFastTierDrainStalled",
    "RTJOperatorDown",
    "RTJOperatorReconcileErrors",
)
Obj = dict[str, Any]


def tool(name: str) -> str:
    """The pinned program (built from its Go module when missing; cached afterwards)."""
    if build.missing([name]):
        build.build([name], quiet=True)
    return str(build.binary_path(name))


def helm(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [tool("helm"), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    if check and out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out


def set_args(values: Mapping[str, Any] | None, tmp: Path | None) -> list[str]:
    if not values:
        return []
    assert tmp is not None, "values need a directory for the values file"
    path = tmp / f"values-{abs(hash(repr(sorted(values.items()))))}.yaml"
    path.write_text(yaml.safe_dump(dict(values)), encoding="utf-8")
    return ["-f", str(path)]


def template_args(
    values: Mapping[str, Any] | None = None,
    tmp: Path | None = None,
    *,
    api_versions: Sequence[str] = (),
    namespace: str = "rtj-system",
    release: str = "rtj",
) -> list[str]:
    args = ["template", release, str(CHART), "--namespace", namespace,
            "--kube-version", KUBE_VERSION]  # fmt: skip
    for api in api_versions:
        args += ["--api-versions", api]
    return args + set_args(values, tmp)


def render(
    values: Mapping[str, Any] | None = None,
    tmp: Path | None = None,
    *,
    api_versions: Sequence[str] = (),
    namespace: str = "rtj-system",
    release: str = "rtj",
    include_crds: bool = False,
) -> list[Obj]:
    args = template_args(values, tmp, api_versions=api_versions, namespace=namespace,
                         release=release)  # fmt: skip
    if include_crds:
        args.append("--include-crds")
    out = helm(*args)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(objs: Sequence[Obj], kind: str, name: str | None = None) -> Obj:
    found = [
        o for o in objs
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]  # fmt: skip
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, nested mappings merged (as Helm merges values files)."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        out[key] = (
            deep_merge(old, value)
            if isinstance(old, Mapping) and isinstance(value, Mapping)
            else value
        )
    return out


def rules_file(values: Mapping[str, Any] | None, tmp: Path) -> Path:
    """The chart's PrometheusRule as a plain Prometheus rule file (what promtool reads)."""
    values = deep_merge(MONITORING_ON, values or {})
    rule = one(render(values, tmp, api_versions=MONITORING), "PrometheusRule")
    path = tmp / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}), encoding="utf-8")
    return path
