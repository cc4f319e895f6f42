"""Checks of the harness itself that need no running cluster."""

from __future__ import annotations

import yaml

from e2e.cluster import build, kwok, manifests
from e2e.cluster.versions import GOMOD_DIR, PROGRAMS, load_versions


def test_gomod_agrees_with_the_versions_file() -> None:
    versions = load_versions()
    assert build.gomod_problems(versions, (GOMOD_DIR / "go.mod").read_text()) == []
    assert {p.version_key for p in PROGRAMS} <= set(versions)


def test_gomod_problems_names_the_mismatch() -> None:
    versions = dict(load_versions(), KUBERNETES="v1.99.0")
    problems = build.gomod_problems(versions, (GOMOD_DIR / "go.mod").read_text())
    assert any("k8s.io/kubernetes" in p and "v1.99.0" in p for p in problems)


def test_kube_binaries_are_stamped_with_their_release() -> None:
    flags = build.program("kube-apiserver").ldflags(load_versions())
    assert f"-X k8s.io/component-base/version.gitVersion={load_versions()['KUBERNETES']}" in flags


def test_nodes_spread_over_zones_and_racks() -> None:
    nodes = [kwok.node_manifest(i, 8) for i in range(8)]
    racks = [n["metadata"]["labels"][kwok.RACK_LABEL] for n in nodes]
    zones = {n["metadata"]["labels"][kwok.ZONE_LABEL] for n in nodes}
    assert len(set(racks)) == 4 and len(zones) == 2
    assert all(n["status"]["capacity"][kwok.GPU_RESOURCE] == "8" for n in nodes)


def test_loopback_pod_ranges_and_the_kubelets_terminal_phase_are_opt_in() -> None:
    assert "podCIDR" not in kwok.node_manifest(0, 8)["spec"]
    cidrs = [kwok.node_manifest(i, 600, pod_cidr=kwok.loopback_pod_cidr(i))["spec"]["podCIDR"]
             for i in (0, 1, 255, 256, 599)]  # fmt: skip
    assert cidrs == ["127.4.0.0/24", "127.4.1.0/24", "127.4.255.0/24", "127.5.0.0/24",
                     "127.6.87.0/24"]  # fmt: skip
    plain = [d["metadata"]["name"] for d in yaml.safe_load_all(kwok.kwok_config_yaml())]
    assert plain == ["node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-delete"]
    staged = list(yaml.safe_load_all(kwok.kwok_config_yaml(terminal_phase_on_delete=True)))
    names = [d["metadata"]["name"] for d in staged]
    assert names[-2:] == ["pod-terminate-on-delete", "pod-delete"]
    # a deleted pod goes only once it is Failed (or Succeeded): never straight from Running
    delete = staged[-1]["spec"]["selector"]["matchExpressions"]
    assert {"key": ".status.phase", "operator": "NotIn", "values": ["Pending", "Running"]} in delete
    assert "phase: Failed" in staged[-2]["spec"]["next"]["statusTemplate"]


def test_webhooks_point_at_loopback_with_the_ca() -> None:
    objs = [
        {
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mutating-webhook-configuration"},
            "webhooks": [
                {
                    "name": "m.kb.io",
                    "clientConfig": {
                        "service": {
                            "name": "webhook-service",
                            "namespace": "system",
                            "path": "/mutate",
                        }
                    },
                }
            ],
        }
    ]
    out = manifests.point_at_loopback(objs, port=1234, ca_pem=b"CA", name_prefix="kueue")
    assert out[0]["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    cc = out[0]["webhooks"][0]["clientConfig"]
    assert cc["url"] == "https://127.0.0.1:1234/mutate" and cc["caBundle"] == "Q0E="
