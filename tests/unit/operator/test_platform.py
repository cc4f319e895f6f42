"""The platform's node-health policy and what a job may narrow of it (issue 13)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from rtj_test_support import NOW
from rtj_world import jobset, node, pod, rtj_raw, snapshot

from rtj_operator import reconcile as rc
from rtj_operator.api.detection_spec import DEFAULT_XID_CODES, NodeHealth
from rtj_operator.policy.platform import (
    NodeHealthPolicy,
    PlatformConfigError,
    effective_node_health,
    load_platform_config,
    load_preflight_policy,
)
from rtj_operator.policy.preflight import PreflightPolicy

RUNNING = {"phase": "Running", "attempt": 1, "attempts": [{"attempt": 1, "jobSet": "llm-a1"}]}
PLATFORM = NodeHealthPolicy(
    taint_key="gpu.example.com/quarantine",
    taint_effect="NoSchedule",
    xid_codes=frozenset({48, 79, 94}),
    xid_condition_types=("SysLogsXIDError",),
    xid_label_keys=("gpu.example.com/xids",),
)


def test_a_job_can_only_narrow_the_platform_policy() -> None:
    asked = NodeHealth(
        taint_key="kubernetes.io/hostname",
        taint_effect="NoExecute",
        xid_codes=[79, 13],
        xid_label_keys=["kubernetes.io/hostname", "gpu.example.com/xids"],
        xid_condition_types=["SysLogsXIDError", "Ready"],
    )
    got = effective_node_health(asked, PLATFORM)
    assert got.taint_key == "gpu.example.com/quarantine"
    assert got.taint_effect == "NoSchedule", "NoExecute would evict other tenants' pods"
    assert got.xid_codes == [79]
    assert got.xid_label_keys == ["gpu.example.com/xids"]
    assert got.xid_condition_types == ["SysLogsXIDError"]
    # a weaker effect is the job's own business
    assert effective_node_health(
        NodeHealth(taint_effect="PreferNoSchedule"), PLATFORM
    ).taint_effect == ("PreferNoSchedule")


def test_a_job_left_at_the_defaults_gets_the_platform_lists() -> None:
    got = effective_node_health(NodeHealth(), PLATFORM)
    assert got.xid_codes == [48, 79, 94]
    assert got.xid_label_keys == ["gpu.example.com/xids"]
    assert got.xid_condition_types == ["SysLogsXIDError"]
    assert effective_node_health(NodeHealth(), NodeHealthPolicy()).xid_codes == sorted(
        DEFAULT_XID_CODES
    )


def test_the_plan_taints_with_the_platform_key_and_never_a_stronger_effect() -> None:
    own = {"taintKey": "team-a.example/own", "taintEffect": "NoExecute"}
    raw = rtj_raw(RUNNING, nodeHealth=own)
    pods = [pod(1, 0, exit_code=1, message="RuntimeError: CUDA error"), pod(1, 1)]
    nodes = {"gpu-node-000": node("gpu-node-000", xid=79), "gpu-node-001": node("gpu-node-001")}
    snap = replace(snapshot(raw, jobsets=[jobset(1)], pods=pods, nodes=nodes), node_health=PLATFORM)
    (taint,) = [a for a in rc.plan(snap).actions if isinstance(a, rc.TaintNode)]
    assert dict(taint.taint) == {"key": "gpu.example.com/quarantine", "value": "llm",
                                 "effect": "NoSchedule"}  # fmt: skip


def test_a_job_cannot_make_any_node_label_an_xid_signal() -> None:
    """A job naming kubernetes.io/hostname (or any label the platform did not list) as an
    XID label gets no quarantine from it."""
    raw = rtj_raw(RUNNING, nodeHealth={"xidLabelKeys": ["team-a.example/xids"]})
    pods = [pod(1, 0, exit_code=1, message="RuntimeError: CUDA error"), pod(1, 1)]
    labelled = node("gpu-node-000", **{"team-a.example/xids": "79"})
    nodes = {"gpu-node-000": labelled, "gpu-node-001": node("gpu-node-001")}
    snap = replace(snapshot(raw, jobsets=[jobset(1)], pods=pods, nodes=nodes, now=NOW),
                   node_health=PLATFORM)  # fmt: skip
    assert not [a for a in rc.plan(snap).actions if isinstance(a, rc.TaintNode)]
    # the platform's own label key is honoured for a job that does not narrow it (the
    # check can fail)
    allowed = node("gpu-node-000", **{"gpu.example.com/xids": "79"})
    plain = snapshot(rtj_raw(RUNNING), jobsets=[jobset(1)], pods=pods, now=NOW,
                     nodes={**nodes, "gpu-node-000": allowed})  # fmt: skip
    snap = replace(plain, node_health=PLATFORM)
    assert [a.node for a in rc.plan(snap).actions if isinstance(a, rc.TaintNode)] == [
        "gpu-node-000"
    ]


def test_the_platform_configuration_file_is_checked_field_by_field() -> None:
    policy = load_platform_config(
        "nodeHealth:\n  taintKey: gpu.example.com/quarantine\n  taintEffect: NoExecute\n"
        "  xidCodes: [79, 48]\n  xidLabelKeys: [gpu.example.com/xids]\n"
    )
    assert policy.taint_effect == "NoExecute" and policy.xid_codes == frozenset({48, 79})
    assert load_platform_config("") == NodeHealthPolicy()
    for text, field in [
        ("nodeHealth: {taintEffect: Evict}", "nodeHealth.taintEffect"),
        ("nodeHealth: {xidCodes: [79, -1]}", "nodeHealth.xidCodes"),
        ("nodeHealth: {xidLabelKeys: [kubernetes.io/hostname]}", "nodeHealth.xidLabelKeys"),
        ("nodeHealth: {taintKey: kubernetes.io/hostname}", "nodeHealth.taintKey"),
        ("nodeHealth: {taintkey: x}", "unknown field(s) taintkey"),
        ("nodehealth: {}", "unknown field(s) nodehealth"),
        ("[1, 2]", "expected a mapping"),
    ]:
        with pytest.raises(PlatformConfigError, match=re.escape(field)):
            load_platform_config(text)


def test_the_platform_names_the_preflights_image_and_node_command() -> None:
    text = (
        "preflight:\n  image: registry.example/rtj-dcgm:1\n  nodeCommand: [dcgmi, diag, -r, '2']\n"
    )
    policy = load_preflight_policy(text)
    assert policy == PreflightPolicy("registry.example/rtj-dcgm:1", ("dcgmi", "diag", "-r", "2"))
    assert policy.image_for("ghcr.io/x/rtj-resolver:1") == "registry.example/rtj-dcgm:1"
    default = load_preflight_policy("nodeHealth: {}\n")
    assert default.node_command == ("dcgmi", "diag", "-r", "1")
    assert default.image_for("ghcr.io/x/rtj-resolver:1") == "ghcr.io/x/rtj-resolver:1"
    assert default.image_for(None) is None, "no platform image: no preflight"
    assert load_platform_config(text) == NodeHealthPolicy(), "both blocks in one file"


@pytest.mark.parametrize(
    ("text", "named"),
    [("preflight: {imag: x}\n", "imag"), ("preflight: {image: ''}\n", "preflight.image"),
     ("preflight: {nodeCommand: 'dcgmi diag'}\n", "preflight.nodeCommand"),
     ("preflight: [1]\n", "preflight: expected a mapping")],
)  # fmt: skip
def test_a_bad_preflight_block_is_refused_by_name(text: str, named: str) -> None:
    with pytest.raises(PlatformConfigError, match=named):
        load_preflight_policy(text)
