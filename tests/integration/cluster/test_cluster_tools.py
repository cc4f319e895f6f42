"""helm and promtool (for the chart and alert-rule tests) are built at the pinned versions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from e2e.cluster import build
from e2e.cluster.versions import load_versions


@pytest.fixture(scope="module")
def tools() -> dict[str, str]:
    build.build(["kubectl", "helm", "promtool"], quiet=True)
    return {n: str(build.binary_path(n)) for n in ("kubectl", "helm", "promtool")}


def _out(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout


def test_helm_reports_the_pinned_version(tools: dict[str, str]) -> None:
    assert _out(tools["helm"], "version", "--short").startswith(load_versions()["HELM"])


def test_promtool_checks_an_alert_rule(tools: dict[str, str], tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n- name: g\n  rules:\n  - alert: CheckpointTooOld\n"
        "    expr: time() - rtj_last_verified_checkpoint_timestamp_seconds > 1200\n"
        "    for: 5m\n"
    )
    out = subprocess.run(
        [tools["promtool"], "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 1 rules found" in out.stdout


def test_kubectl_matches_the_cluster_release(tools: dict[str, str]) -> None:
    assert _out(tools["kubectl"], "version", "--client").startswith(
        f"Client Version: {load_versions()['KUBERNETES']}"
    )
