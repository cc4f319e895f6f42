"""The Helm chart without a cluster: lint, template with default and representative values,
the values schema's refusals, restricted pod security, least-privilege RBAC, the CRD copy."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from rtj_chart import (
    ALERTS,
    CHART,
    CHART_CRD,
    CRD_SOURCE,
    KUBE_VERSION,
    MONITORING,
    MONITORING_ON,
    helm,
    one,
    render,
    set_args,
    template_args,
)

from rtj_operator.api import keys
from rtj_operator.policy.intervals import IntervalPolicy
from rtj_operator.policy.platform import (
    NodeHealthPolicy,
    load_interval_policy,
    load_platform_config,
    load_preflight_policy,
)
from rtj_operator.policy.preflight import PreflightPolicy

pytestmark = pytest.mark.timeout(300)

REPRESENTATIVE: dict[str, Any] = {
    "image": {"repository": "registry.example/ml/rtj-operator", "tag": "1.2.3",
              "digest": "sha256:" + "a" * 64, "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "replicaCount": 3,
    "leaderElection": {"enabled": True, "leaseName": "rtj-leader", "leaseDurationSeconds": 30,
                       "renewDeadlineSeconds": 20, "retryPeriodSeconds": 4},
    "operator": {"logLevel": "DEBUG", "workers": 32, "watchNamespaces": ["team-a", "team-b"],
                 "extraArgs": ["--watch-server-timeout=120"],
                 "extraEnv": [{"name": "AWS_REGION", "value": "eu-west-1"}]},
    "serviceAccount": {"create": True, "name": "rtj", "annotations": {"iam.example/role": "x"}},
    "rbac": {"create": True, "readCheckpointSecrets": False,
             "watchCustomResourceDefinitions": False},
    "metrics": {"port": 9090, "service": {"enabled": True, "type": "ClusterIP", "port": 9090}},
    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kps"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "kps"},
                       "additionalAlertLabels": {"team": "ml"},
                       "disabledAlerts": ["RTJRecoverySlow"],
                       "checkpointStale": {"factor": 3, "for": "10m", "severity": "critical"}},
    "dashboard": {"enabled": True, "namespace": "monitoring"},
    "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1},
    "resources": {"requests": {"cpu": "250m", "memory": "512Mi"},
                  "limits": {"cpu": 2, "memory": "2Gi"}},
    "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
    "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
    "priorityClassName": "system-cluster-critical",
}  # fmt: skip


def _values_file(tmp_path: Path, values: dict[str, Any]) -> str:
    args = set_args(values, tmp_path)
    return args[1]


# --- lint and template ------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, REPRESENTATIVE], ids=["default", "representative"])
def test_helm_lint_is_clean(values: dict[str, Any] | None, tmp_path: Path) -> None:
    args = ["lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION]
    if values:
        args += ["-f", _values_file(tmp_path, values)]
    out = helm(*args)
    assert "0 chart(s) failed" in out.stdout
    assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout


def test_default_render_has_every_piece_and_nothing_for_missing_apis(tmp_path: Path) -> None:
    objs = render()
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted([
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
        "Role", "RoleBinding", "ClusterRole", "ClusterRole",
        "Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Secret",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    ])  # fmt: skip
    # monitoring is off by default, even where the cluster serves its kinds (as Kueue's)
    assert not {"ServiceMonitor", "PrometheusRule"} & {
        o["kind"] for o in render(api_versions=MONITORING)
    }
    # and rendered whenever enabled, whatever the cluster serves: `helm template`, Argo CD and
    # Flux render without a cluster (no --api-versions) and must not silently lose the alerts
    enabled = {o["kind"] for o in render(MONITORING_ON, tmp_path)}
    assert {"ServiceMonitor", "PrometheusRule"} <= enabled
    only_rules = {o["kind"] for o in render({"prometheusRule": {"enabled": True}}, tmp_path)}
    assert "PrometheusRule" in only_rules and "ServiceMonitor" not in only_rules


def test_the_platform_node_health_policy_reaches_the_operator_and_rolls_it(tmp_path: Path) -> None:
    import yaml

    strict = {"nodeHealth": {"taintKey": "gpu.example.com/quarantine", "taintEffect": "NoExecute",
                             "xidCodes": [79], "xidConditionTypes": ["SysLogsXIDError"],
                             "xidLabelKeys": ["gpu.example.com/xids"]}}  # fmt: skip
    objs = render(strict, tmp_path)
    cm = one(objs, "ConfigMap", "rtj-resilient-training-operator-platform")
    policy = load_platform_config(cm["data"]["platform.yaml"])
    assert (policy.taint_key, policy.taint_effect) == ("gpu.example.com/quarantine", "NoExecute")
    assert policy.xid_codes == frozenset({79})
    pod = one(objs, "Deployment")["spec"]["template"]
    args = pod["spec"]["containers"][0]["args"]
    assert "--platform-config=/etc/rtj/platform.yaml" in args
    default_pod = one(render(), "Deployment")["spec"]["template"]
    assert (
        pod["metadata"]["annotations"]["checksum/platform"]
        != (default_pod["metadata"]["annotations"]["checksum/platform"])
    )
    # the chart's defaults are the operator's defaults
    default_cm = one(render(), "ConfigMap", "rtj-resilient-training-operator-platform")
    assert load_platform_config(default_cm["data"]["platform.yaml"]) == NodeHealthPolicy()
    assert yaml.safe_load(default_cm["data"]["platform.yaml"])["nodeHealth"]["taintEffect"] == (
        "NoSchedule"
    )


def test_the_platform_preflight_reaches_the_operator(tmp_path: Path) -> None:
    """The chart's preflight block is what `rtj run --platform-config` reads: the chart's
    defaults are the operator's; an image and a command of the platform's come through."""
    default_cm = one(render(), "ConfigMap", "rtj-resilient-training-operator-platform")
    assert load_preflight_policy(default_cm["data"]["platform.yaml"]) == PreflightPolicy()
    own = {"preflight": {"image": "registry.example/rtj-dcgm:1", "nodeCommand": ["true"]}}
    cm = one(render(own, tmp_path), "ConfigMap", "rtj-resilient-training-operator-platform")
    assert load_preflight_policy(cm["data"]["platform.yaml"]) == PreflightPolicy(
        "registry.example/rtj-dcgm:1", ("true",)
    )
    none = {"preflight": {"nodeCommand": []}}
    cm = one(render(none, tmp_path), "ConfigMap", "rtj-resilient-training-operator-platform")
    assert load_preflight_policy(cm["data"]["platform.yaml"]).node_command == ()


def test_the_platform_checkpoint_intervals_reach_the_operator(tmp_path: Path) -> None:
    """`plannedIntervalSeconds: auto`'s prior and bounds: the chart's defaults are the
    operator's; the platform's own come through (the rest keep the defaults)."""
    default_cm = one(render(), "ConfigMap", "rtj-resilient-training-operator-platform")
    assert load_interval_policy(default_cm["data"]["platform.yaml"]) == IntervalPolicy()
    own = {"checkpointIntervals": {"priorFailuresPerNodeHour": 0.02, "minSeconds": 60}}
    cm = one(render(own, tmp_path), "ConfigMap", "rtj-resilient-training-operator-platform")
    policy = load_interval_policy(cm["data"]["platform.yaml"])
    assert (policy.prior_failures_per_node_hour, policy.min_seconds) == (0.02, 60)
    assert policy.max_seconds == IntervalPolicy().max_seconds


def test_every_object_has_the_standard_labels(tmp_path: Path) -> None:
    for obj in render(REPRESENTATIVE, tmp_path, api_versions=MONITORING):
        labels = obj["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                    "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
                    "app.kubernetes.io/part-of", "helm.sh/chart"):  # fmt: skip
            assert labels.get(key), f"{obj['kind']} {obj['metadata']['name']} lacks {key}"
        assert labels["app.kubernetes.io/version"] == "1.2.3"


def test_deployment_runs_restricted_with_requests_and_limits() -> None:
    dep = one(render(), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(c["resources"]) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    assert {"cpu", "memory"} <= set(c["resources"]["limits"])
    assert pod["serviceAccountName"] == "rtj-resilient-training-operator"
    assert c["image"] == "ghcr.io/resilient-training/rtj-operator:0.1.0"
    probes = {p: c[p]["httpGet"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {
        "startupProbe": {"path": "/healthz", "port": "health"},
        "livenessProbe": {"path": "/healthz", "port": "health"},
        "readinessProbe": {"path": "/readyz", "port": "health"},
    }
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert "--health-port=8081" in c["args"]


def test_two_replicas_share_one_lease_that_the_role_names() -> None:
    objs = render()
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    assert args[0] == "run" and c["command"] == ["rtj"]
    assert "--leader-elect" in args
    assert "--lease-name=rtj-resilient-training-operator" in args
    assert "--lease-namespace=$(POD_NAMESPACE)" in args and "--identity=$(POD_NAME)" in args
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    role = one(objs, "Role", "rtj-resilient-training-operator-leader-election")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": ["rtj-resilient-training-operator"],
                      "verbs": ["get", "update"]}]  # fmt: skip
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


def test_representative_values_reach_the_objects(tmp_path: Path) -> None:
    objs = render(REPRESENTATIVE, tmp_path, api_versions=MONITORING)
    dep = one(objs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert dep["spec"]["replicas"] == 3
    assert c["image"] == "registry.example/ml/rtj-operator:1.2.3@sha256:" + "a" * 64
    assert c["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "rtj"
    assert pod["priorityClassName"] == "system-cluster-critical"
    args = c["args"]
    for want in ("--namespace=team-a", "--namespace=team-b", "--lease-name=rtj-leader",
                 "--lease-duration=30", "--metrics-port=9090", "--log-level=DEBUG",
                 "--watch-server-timeout=120"):  # fmt: skip
        assert want in args
    assert {"name": "AWS_REGION", "value": "eu-west-1"} in c["env"]
    rules = one(objs, "ClusterRole", OPERATOR_ROLE)["rules"]
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]} in rules
    assert not any("secrets" in r["resources"] for r in rules)
    assert not any("customresourcedefinitions" in r["resources"] for r in rules)
    svc = one(objs, "Service")
    assert svc["spec"]["ports"][0]["port"] == 9090
    sm = one(objs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    assert sm["spec"]["endpoints"][0]["interval"] == "15s"
    pr = one(objs, "PrometheusRule")
    alerts = {r["alert"]: r for r in pr["spec"]["groups"][0]["rules"]}
    assert "RTJRecoverySlow" not in alerts and len(alerts) == len(ALERTS) - 1
    assert alerts["RTJCheckpointStale"]["labels"] == {"severity": "critical", "team": "ml"}
    assert "> 3 * max by" in alerts["RTJCheckpointStale"]["expr"]
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and "dashboard" in o["metadata"]["name"]]
    assert cm["metadata"]["namespace"] == "monitoring"


# --- least privilege ----------------------------------------------------------------------------

# The contract with operator/rtj_operator/kube.py and kopf's watches (the audit table in
# docs/operations.md, held to the chart and the code by test_chart_rbac.py); a change here is
# a change of the operator's privileges and must be deliberate.
OPERATOR_ROLE = "rtj-resilient-training-operator"
EXPECTED_CLUSTER_RULES = {
    # delete: spec.ttlSecondsAfterFinished (reconcile/lifecycle.py)
    ("training.resilient.dev", "resilienttrainingjobs"): {"get", "list", "watch", "patch",
                                                          "delete"},
    ("training.resilient.dev", "resilienttrainingjobs/status"): {"patch"},
    ("training.resilient.dev", "resilienttrainingjobs/finalizers"): {"update"},
    ("jobset.x-k8s.io", "jobsets"): {"list", "watch", "create", "delete"},
    ("", "pods"): {"list", "watch", "delete"},
    ("", "nodes"): {"get", "list", "watch", "patch"},
    ("", "events"): {"list", "watch", "create"},
    ("kueue.x-k8s.io", "localqueues"): {"get"},
    ("", "secrets"): {"get", "create"},  # credentials by name; each job's key Secret
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
}  # fmt: skip


def _grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "*" not in rule.get("apiGroups", []), rule
        assert not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_cluster_role_is_exactly_the_least_privilege_contract() -> None:
    objs = render()
    assert _grants(one(objs, "ClusterRole", OPERATOR_ROLE)["rules"]) == EXPECTED_CLUSTER_RULES
    role = one(objs, "Role", "rtj-resilient-training-operator-leader-election")
    assert _grants(role["rules"]) == {
        ("coordination.k8s.io", "leases"): {"create", "get", "update"}
    }
    assert role["metadata"]["namespace"] == "rtj-system"
    # node Leases: read-only, in kube-node-lease only (silent nodes judged from them)
    leases = one(objs, "Role", "rtj-resilient-training-operator-node-leases")
    assert _grants(leases["rules"]) == {("coordination.k8s.io", "leases"): {"list", "watch"}}
    assert leases["metadata"]["namespace"] == "kube-node-lease"
    bindings = [o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert len(bindings) == 3
    for binding in bindings:
        (subject,) = binding["subjects"]
        assert subject == {"kind": "ServiceAccount", "name": "rtj-resilient-training-operator",
                           "namespace": "rtj-system"}  # fmt: skip


def test_no_kopf_peering_rights_and_no_escalation_verbs() -> None:
    users = ("-edit", "-view")  # the namespace users' aggregated roles, tested below
    operator_roles = [
        o for o in render()
        if o["kind"] in ("ClusterRole", "Role") and not o["metadata"]["name"].endswith(users)
    ]  # fmt: skip
    text = json.dumps(operator_roles)
    for word in ("kopfpeerings", "clusterkopfpeerings", "escalate", "bind", "impersonate",
                 "serviceaccounts/token", "deletecollection"):  # fmt: skip
        assert word not in text


def test_namespace_users_get_jobs_through_the_default_roles(tmp_path: Path) -> None:
    objs = render()
    edit = one(objs, "ClusterRole", "rtj-resilient-training-operator-edit")
    labels = edit["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert _grants(edit["rules"]) == {
        ("training.resilient.dev", "resilienttrainingjobs"): {
            "create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
        ("training.resilient.dev", "resilienttrainingjobs/status"): {"get"},
    }  # fmt: skip
    view = one(objs, "ClusterRole", "rtj-resilient-training-operator-view")
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert all(set(r["verbs"]) == {"get", "list", "watch"} for r in view["rules"])
    off = render({"rbac": {"aggregateToDefaultRoles": False}}, tmp_path)
    assert {o["metadata"]["name"] for o in off if o["kind"] == "ClusterRole"} == {OPERATOR_ROLE}


def test_only_the_operator_may_remove_the_release_finalizer(tmp_path: Path) -> None:
    """Issue 42: a tenant that drops the finalizer before deleting its job would strand its
    quarantine claims (the sweep releases them later; the policy keeps it from happening)."""
    objs = render()
    policy = one(objs, "ValidatingAdmissionPolicy")
    name = policy["metadata"]["name"]
    binding = one(objs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["resources"], rule["operations"]) == (["resilienttrainingjobs"], ["UPDATE"])
    exempt = [c["expression"] for c in policy["spec"]["matchConditions"]]
    operator = "system:serviceaccount:rtj-system:rtj-resilient-training-operator"
    assert exempt[0] == f'request.userInfo.username != "{operator}"'
    assert '["system:masters"]' in exempt[1]
    (check,) = policy["spec"]["validations"]
    assert check["expression"].count(f'"{keys.RELEASE_FINALIZER}" in') == 2
    assert check["reason"] == "Forbidden"
    # the ServiceAccount the operator runs as, whatever it is named
    named = render({"serviceAccount": {"create": True, "name": "rtj"}}, tmp_path)
    conditions = one(named, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert conditions[0]["expression"].endswith(':rtj-system:rtj"')
    kinds = {o["kind"] for o in render({"finalizerPolicy": {"enabled": False}}, tmp_path)}
    assert not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    older = helm(*template_args(), "--kube-version", "1.29.0").stdout
    assert "ValidatingAdmissionPolicy" not in older, "admissionregistration v1 from 1.30"


def test_rbac_can_be_left_to_the_platform_team(tmp_path: Path) -> None:
    objs = render(
        {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing"}},
        tmp_path,
    )
    assert not {o["kind"] for o in objs} & {"ClusterRole", "ClusterRoleBinding", "Role",
                                           "RoleBinding", "ServiceAccount"}  # fmt: skip
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "existing"


# --- the values schema ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": 2, "leaderElection": {"enabled": False}},
         "at '/leaderElection/enabled': value must be true"),
        ({"replicaCount": -1}, "at '/replicaCount': minimum: got -1, want 0"),
        ({"replicaCount": "two"}, "at '/replicaCount': got string, want integer"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
        ({"image": {"digest": "latest"}}, "at '/image/digest': 'latest' does not match pattern"),
        ({"securityContext": {"allowPrivilegeEscalation": True}},
         "at '/securityContext/allowPrivilegeEscalation': value must be false"),
        ({"securityContext": {"privileged": True}}, "at '/securityContext/privileged'"),
        ({"podSecurityContext": {"runAsNonRoot": False}},
         "at '/podSecurityContext/runAsNonRoot': value must be true"),
        ({"podSecurityContext": {"runAsUser": 0}},
         "at '/podSecurityContext/runAsUser': minimum: got 0, want 1"),
        ({"resources": {"limits": None}}, "at '/resources': missing property 'limits'"),
        ({"resources": {"requests": {"cpu": "lots"}}}, "at '/resources/requests/cpu'"),
        ({"metrics": {"port": 80}}, "at '/metrics/port': minimum: got 80, want 1,024"),
        ({"prometheusRule": {"checkpointStale": {"factor": 1}}},
         "at '/prometheusRule/checkpointStale/factor': exclusiveMinimum: got 1, want 1"),
        ({"prometheusRule": {"checkpointStale": {"for": "5 minutes"}}},
         "at '/prometheusRule/checkpointStale/for': '5 minutes' does not match pattern"),
        ({"prometheusRule": {"disabledAlerts": ["RTJTypo"]}},
         "at '/prometheusRule/disabledAlerts/0': value must be one of"),
        ({"prometheusRule": {"runbookBaseUrl": "docs/operations.md"}},
         "at '/prometheusRule/runbookBaseUrl'"),
        ({"operator": {"watchNamespaces": ["Team_A"]}}, "at '/operator/watchNamespaces/0'"),
        ({"podDisruptionBudget": {"maxUnavailable": 0}},
         "at '/podDisruptionBudget/maxUnavailable'"),
        ({"replicas": 2}, "additional properties 'replicas' not allowed"),
    ],
)  # fmt: skip
def test_the_schema_refuses_bad_values_with_a_clear_message(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    out = helm(*template_args(values, tmp_path), check=False)
    assert out.returncode != 0, f"accepted {values}"
    assert "values don't meet the specifications of the schema" in out.stderr
    assert message in out.stderr, out.stderr


def test_the_schema_is_valid_json_schema_and_covers_every_default() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    defaults = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert schema["additionalProperties"] is False
    assert set(defaults) <= set(schema["properties"])


def test_every_alert_can_be_disabled_by_name() -> None:
    """The schema's disabledAlerts names exactly the alerts the chart renders (ALERTS is
    checked against the rendered PrometheusRule above)."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    rule = schema["properties"]["prometheusRule"]["properties"]["disabledAlerts"]
    assert sorted(rule["items"]["enum"]) == sorted(ALERTS)


# --- the CRD ----------------------------------------------------------------------------------


def test_the_charts_crd_is_byte_for_byte_the_generated_one() -> None:
    assert CHART_CRD.read_bytes() == CRD_SOURCE.read_bytes(), (
        f"{CHART_CRD.relative_to(CHART.parent.parent)} is stale: run `make chart-crds`"
    )


def test_the_crd_ships_with_the_chart_and_is_not_templated(tmp_path: Path) -> None:
    crds = [o for o in render(include_crds=True) if o["kind"] == "CustomResourceDefinition"]
    assert [c["metadata"]["name"] for c in crds] == ["resilienttrainingjobs.training.resilient.dev"]
    assert crds[0] == yaml.safe_load(CRD_SOURCE.read_text(encoding="utf-8"))
    assert not list((CHART / "templates").glob("*crd*"))


def test_the_resolver_image_is_ours_by_default_and_can_be_left_to_the_trainer(
    tmp_path: Path,
) -> None:
    def args(values: dict[str, Any] | None) -> list[str]:
        objs = render(values, tmp_path) if values else render()
        return list(one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"])

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    ours = f"--resolver-image=ghcr.io/resilient-training/rtj-resolver:{chart['appVersion']}"
    assert ours in args(None)
    pinned = {"resolverImage": {"repository": "registry.example/rtj-resolver", "tag": "1.2.3",
                                "digest": "sha256:" + "b" * 64}}  # fmt: skip
    want = "--resolver-image=registry.example/rtj-resolver:1.2.3@sha256:" + "b" * 64
    assert want in args(pinned)
    trainers = args({"resolverImage": {"repository": ""}})
    assert not [a for a in trainers if a.startswith("--resolver-image")]


def test_in_place_restart_orders_are_keyed_by_a_generated_secret_only_the_operator_reads(
    tmp_path: Path,
) -> None:
    objs = render()
    secret = one(objs, "Secret", "rtj-resilient-training-operator-control")
    assert len(base64.b64decode(secret["data"]["secret"])) == 48
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert "--control-secret-file=/etc/rtj-control/secret" in pod["containers"][0]["args"]
    volume = next(v for v in pod["volumes"] if v["name"] == "control")
    assert volume["secret"] == {"secretName": secret["metadata"]["name"], "defaultMode": 0o400}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "control")
    assert mount["readOnly"] is True
    off = render({"operator": {"inPlaceRestart": {"enabled": False}}}, tmp_path)
    assert not [o for o in off if o["kind"] == "Secret"]
    args = one(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--control-secret-file")]


def test_a_gitops_install_brings_its_own_control_secret(tmp_path: Path) -> None:
    """Issue 44: `helm template` cannot `lookup` the generated Secret, so under Argo CD or
    Flux its value would change on every render; `existingSecret` names one the platform
    keeps (any key), and the chart then renders none."""
    values = {"operator": {"inPlaceRestart": {"existingSecret": "platform-rtj-key",
                                              "existingSecretKey": "hmac"}}}  # fmt: skip
    objs = render(values, tmp_path)
    assert not [o for o in objs if o["kind"] == "Secret"]
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert "--control-secret-file=/etc/rtj-control/secret" in pod["containers"][0]["args"]
    volume = next(v for v in pod["volumes"] if v["name"] == "control")
    assert volume["secret"] == {
        "secretName": "platform-rtj-key",
        "items": [{"key": "hmac", "path": "secret"}],
        "defaultMode": 0o400,
    }
    assert helm(*template_args({"operator": {"inPlaceRestart": {"existingSecretKey": ""}}},
                               tmp_path), check=False).returncode != 0  # fmt: skip


def _sidecar_policies(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["namespace"]: o for o in objs if o["kind"] == "NetworkPolicy"}


def test_the_sidecar_ports_admit_only_the_operator_and_the_namespaces_own_pods(
    tmp_path: Path,
) -> None:
    """Issue 42: a NetworkPolicy per job namespace (the watched ones by default) in which
    the progress sidecars' port answers the operator's pods and the namespace's own pods
    only, while every other port and protocol stays open (NCCL, rendezvous)."""
    assert not _sidecar_policies(render()), "a cluster-wide operator names no namespace"
    objs = render({"operator": {"watchNamespaces": ["team-a", "team-b"]}}, tmp_path)
    policies = _sidecar_policies(objs)
    assert sorted(policies) == ["team-a", "team-b"]
    spec = policies["team-a"]["spec"]
    assert spec["podSelector"] == {
        "matchExpressions": [{"key": keys.JOB_LABEL, "operator": "Exists"}]
    }
    assert spec["policyTypes"] == ["Ingress"]
    sidecar, others = spec["ingress"]
    assert sidecar["ports"] == [{"protocol": "TCP", "port": keys.DEFAULT_PROGRESS_PORT}]
    operator, own = sidecar["from"]
    assert operator == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rtj-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "resilient-training-operator",
                                        "app.kubernetes.io/instance": "rtj"}},
    }  # fmt: skip
    assert own == {"podSelector": {}}
    assert "from" not in others, "every other port is open to all, as without the policy"
    assert others["ports"] == [
        {"protocol": "TCP", "port": 1, "endPort": keys.DEFAULT_PROGRESS_PORT - 1},
        {"protocol": "TCP", "port": keys.DEFAULT_PROGRESS_PORT + 1, "endPort": 65535},
        {"protocol": "UDP"},
        {"protocol": "SCTP"},
    ]
    deployment = one(objs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert operator["podSelector"]["matchLabels"].items() <= labels.items()


def test_the_sidecar_policy_takes_its_own_namespaces_and_every_port_jobs_use(
    tmp_path: Path,
) -> None:
    values = {"networkPolicy": {"namespaces": ["ml"], "sidecarPorts": [1, 9478, 9479, 65535]}}
    (policy,) = _sidecar_policies(render(values, tmp_path)).values()
    sidecar, others = policy["spec"]["ingress"]
    assert [p["port"] for p in sidecar["ports"]] == [1, 9478, 9479, 65535]
    assert others["ports"] == [
        {"protocol": "TCP", "port": 2, "endPort": 9477},
        {"protocol": "TCP", "port": 9480, "endPort": 65534},
        {"protocol": "UDP"},
        {"protocol": "SCTP"},
    ]
    single = {"networkPolicy": {"namespaces": ["ml"], "sidecarPorts": [2, 65535]}}
    (policy,) = _sidecar_policies(render(single, tmp_path)).values()
    assert policy["spec"]["ingress"][1]["ports"][0] == {"protocol": "TCP", "port": 1}
    off = {"operator": {"watchNamespaces": ["ml"]}, "networkPolicy": {"enabled": False}}
    assert not _sidecar_policies(render(off, tmp_path))
    unsorted = {"networkPolicy": {"namespaces": ["ml"], "sidecarPorts": [9479, 9478]}}
    failed = helm(*template_args(unsorted, tmp_path), check=False)
    assert failed.returncode != 0
    assert "networkPolicy.sidecarPorts: expected distinct ports in ascending order" in (
        failed.stderr
    )


def test_the_chart_refuses_a_cluster_without_native_sidecars() -> None:
    """The progress sidecar (on by default) is an init container with restartPolicy Always:
    Kubernetes 1.29 and later. helm says so on an older cluster instead of a pod that never
    starts its sidecar."""
    old = helm(*template_args(), "--kube-version", "1.28.9", check=False)
    assert old.returncode != 0 and "kubeVersion" in old.stderr, old.stderr
    assert helm(*template_args(), "--kube-version", "1.29.0").returncode == 0
