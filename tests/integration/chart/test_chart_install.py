"""`helm install` into the harness's real API server (restricted Pod Security enforced), then
the operator as a local process under the chart's ServiceAccount (a TokenRequest token):
the chart's RBAC is enough for a full failure-and-restart, and more than that is denied;
installed for named namespaces (operator.watchNamespaces), nothing is granted outside them
but what is cluster-scoped."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from rtj_chart import CHART, helm

from e2e.cluster import faults
from e2e.operator_proc import (
    OperatorProcess,
    client,
    jobsets_of,
    publish_steps,
    rtj_body,
    rtj_status,
    running_pods,
    wait_for,
)
from rtj_operator.api import keys
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import Forbidden, KubeError
from rtj_operator.policy.node_event_sources import NODE_EVENT_NAMESPACE

pytestmark = [pytest.mark.cluster, pytest.mark.operator, pytest.mark.timeout(420)]

RELEASE = "rtj"
SA = "rtj-resilient-training-operator"
LEASE = SA
XID_MESSAGE = (
    "RuntimeError: CUDA error: unspecified launch failure\n"
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."
)


@dataclass
class Installed:
    namespace: str
    admin: Kube
    sa_kubeconfig: str
    sa: Kube
    notes: str


def _kubeconfig_with_token(admin_kubeconfig: str, token: str, path: Path) -> str:
    """The admin kubeconfig's server and CA, authenticated as the ServiceAccount."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text(encoding="utf-8"))
    ctx_name = admin["current-context"]
    ctx = next(c for c in admin["contexts"] if c["name"] == ctx_name)["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "rtj-operator", "user": {"token": token}}],
        "contexts": [{"name": "rtj-operator",
                      "context": {"cluster": cluster["name"], "user": "rtj-operator"}}],
        "current-context": "rtj-operator",
    }  # fmt: skip
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def installed(rtj_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The chart installed (and `helm --wait`ed) in a namespace enforcing restricted PSS."""
    core = rtj_cluster.kube.core
    ns = f"rtj-chart-{uuid.uuid4().hex[:6]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(
        name=ns,
        labels={"pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
                "pod-security.kubernetes.io/warn": "restricted"},
    )))  # fmt: skip
    kubeconfig = rtj_cluster.kubeconfig
    tmp = tmp_path_factory.mktemp("chart")
    try:
        out = helm("install", RELEASE, str(CHART), "--namespace", ns, "--kubeconfig", kubeconfig,
                   "--wait", "--timeout", "120s", timeout=180)  # fmt: skip
        token = core.create_namespaced_service_account_token(
            SA, ns, k8s.AuthenticationV1TokenRequest(
                spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
        ).status.token  # fmt: skip
        sa_kubeconfig = _kubeconfig_with_token(kubeconfig, token, tmp / "sa.kubeconfig")
        yield Installed(ns, client(kubeconfig), sa_kubeconfig, client(sa_kubeconfig), out.stdout)
    finally:
        helm("uninstall", RELEASE, "--namespace", ns, "--kubeconfig", kubeconfig, "--wait",
             "--timeout", "60s", check=False, timeout=90)  # fmt: skip
        core.delete_namespace(ns)


# --- the installation ---------------------------------------------------------------------------


def test_helm_install_runs_two_restricted_replicas(installed: Installed, rtj_cluster: Any) -> None:
    apps = rtj_cluster.kube.apps
    dep = apps.read_namespaced_deployment(SA, installed.namespace)
    assert dep.status.ready_replicas == 2, "admitted under restricted Pod Security, and ready"
    pods = rtj_cluster.kube.core.list_namespaced_pod(
        installed.namespace, label_selector=f"app.kubernetes.io/instance={RELEASE}"
    ).items
    assert len(pods) == 2
    assert all(p.spec.service_account_name == SA for p in pods)
    crd = rtj_cluster.kube.ext.read_custom_resource_definition(keys.CRD_NAME)
    assert crd.spec.group == keys.GROUP
    svc = rtj_cluster.kube.core.read_namespaced_service(f"{SA}-metrics", installed.namespace)
    assert svc.spec.ports[0].name == "metrics"
    # monitoring off by default (no Prometheus Operator in the harness): the notes say how on
    assert "No ServiceMonitor (serviceMonitor.enabled=true" in installed.notes
    assert "No PrometheusRule (prometheusRule.enabled=true" in installed.notes
    assert "kubectl get rtj -A" in installed.notes


def test_a_privileged_pod_is_refused_in_that_namespace(
    installed: Installed, rtj_cluster: Any
) -> None:
    """Control: the namespace really enforces restricted, so the chart's pods passed it."""
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="root"),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="busybox")]),
    )
    with pytest.raises(ApiException) as err:
        rtj_cluster.kube.core.create_namespaced_pod(installed.namespace, pod)
    assert err.value.status == 403 and "violates PodSecurity" in str(err.value.body)


# --- least privilege, as the ServiceAccount -----------------------------------------------------


def test_the_service_account_may_do_what_the_operator_does(
    installed: Installed, rtj_cluster: Any
) -> None:
    sa = installed.sa
    node = rtj_cluster.node_names[0]
    assert sa.get_node(node)["metadata"]["name"] == node
    sa.list_kind("nodes", None)
    sa.list_kind("pods", None)
    sa.list_kind("jobsets", None)
    sa.list_kind("rtjs", None)
    sa.list_events(NODE_EVENT_NAMESPACE, "involvedObject.kind=Node")
    leases, _ = sa.list_node_leases()  # silent nodes are judged from these
    assert {lease["metadata"]["name"] for lease in leases} >= {node}
    # a taint patch (dry run: the node is shared)
    sa.request("patch node", "PATCH", f"/api/v1/nodes/{node}",
               {"metadata": {"labels": {"rtj-chart-test": "x"}}},
               query={"dryRun": "All"}, content_type="application/merge-patch+json")  # fmt: skip


@pytest.mark.parametrize(
    ("what", "method", "path", "body"),
    [
        ("delete a node", "DELETE", "/api/v1/nodes/{node}", None),
        ("create a node", "POST", "/api/v1/nodes", {"metadata": {"name": "intruder"}}),
        ("list secrets", "GET", "/api/v1/secrets", None),
        ("watch secrets", "GET", "/api/v1/namespaces/{ns}/secrets?watch=true", None),
        ("create a pod", "POST", "/api/v1/namespaces/{ns}/pods",
         {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
        ("evict via pods/eviction", "POST", "/api/v1/namespaces/{ns}/pods/x/eviction",
         {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "x"}}),
        ("get a pod", "GET", "/api/v1/namespaces/{ns}/pods/x", None),
        ("update a JobSet", "PUT", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets/x",
         {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "x"}}),
        ("patch a JobSet", "PATCH", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets/x",
         {"metadata": {"labels": {"x": "y"}}}),
        ("update an RTJ's status", "PUT",
         "/apis/training.resilient.dev/v1alpha1/namespaces/{ns}/resilienttrainingjobs/x/status",
         {"apiVersion": "training.resilient.dev/v1alpha1", "kind": "ResilientTrainingJob",
          "metadata": {"name": "x"}}),
        ("create an RTJ", "POST",
         "/apis/training.resilient.dev/v1alpha1/namespaces/{ns}/resilienttrainingjobs",
         {"apiVersion": "training.resilient.dev/v1alpha1", "kind": "ResilientTrainingJob",
          "metadata": {"name": "x"}}),
        ("delete a namespace", "DELETE", "/api/v1/namespaces/{ns}", None),
        ("list configmaps", "GET", "/api/v1/configmaps", None),
        ("create a clusterrolebinding", "POST",
         "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
         {"metadata": {"name": "x"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
          "kind": "ClusterRole", "name": "cluster-admin"}, "subjects": []}),
        ("list Kueue workloads", "GET", "/apis/kueue.x-k8s.io/v1beta2/workloads", None),
        ("update another Lease", "PUT",
         "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/someone-else",
         {"metadata": {"name": "someone-else"}, "spec": {}}),
        ("list Leases outside kube-node-lease", "GET",
         "/apis/coordination.k8s.io/v1/namespaces/default/leases", None),
        ("update a node's Lease", "PUT",
         "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}",
         {"metadata": {"name": "{node}"}, "spec": {}}),
        ("create a Lease elsewhere", "POST",
         "/apis/coordination.k8s.io/v1/namespaces/default/leases",
         {"metadata": {"name": "x"}, "spec": {}}),
        ("create a CRD", "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
         {"metadata": {"name": "x.example.com"}}),
    ],
)  # fmt: skip
def test_anything_more_is_forbidden(
    installed: Installed, rtj_cluster: Any, what: str, method: str, path: str, body: Any
) -> None:
    path = path.format(node=rtj_cluster.node_names[0], ns=installed.namespace)
    query = None
    if "?" in path:
        path, _, qs = path.partition("?")
        query = dict(p.split("=") for p in qs.split("&"))
    with pytest.raises(Forbidden) as err:
        installed.sa.request(what, method, path, body, query=query)
    assert err.value.status == 403
    assert f"system:serviceaccount:{installed.namespace}:{SA}" in str(err.value)


def test_deleting_a_node_is_denied_and_the_node_is_still_there(
    installed: Installed, rtj_cluster: Any
) -> None:
    node = rtj_cluster.node_names[-1]
    with pytest.raises(Forbidden):
        installed.sa.request("delete node", "DELETE", f"/api/v1/nodes/{node}")
    assert installed.admin.get_node(node)["metadata"]["name"] == node


def _user(installed: Installed, rtj_cluster: Any, tmp: Path, name: str, role: str) -> Kube:
    """A ServiceAccount bound to the default ClusterRole `role` in the chart's namespace."""
    core, ns = rtj_cluster.kube.core, installed.namespace
    core.create_namespaced_service_account(
        ns, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=name))
    )
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": f"{name}-{role}", "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": role},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}  # fmt: skip
    installed.admin.request("create rolebinding", "POST",
                            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
                            binding)  # fmt: skip
    token = core.create_namespaced_service_account_token(
        name, ns, k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[]))
    ).status.token  # fmt: skip
    return client(_kubeconfig_with_token(rtj_cluster.kubeconfig, token, tmp / f"{name}.kubeconfig"))


def test_namespace_editors_create_jobs_and_viewers_only_read_them(
    installed: Installed, rtj_cluster: Any, tmp_path: Path
) -> None:
    """The chart's ClusterRoles are aggregated into `edit` and `view` (issue 19)."""
    ns = installed.namespace
    editor = _user(installed, rtj_cluster, tmp_path, "alice", "edit")
    viewer = _user(installed, rtj_cluster, tmp_path, "bob", "view")
    body = rtj_body("users-job", ns, "file:///mnt/ckpt/users")
    path = f"/apis/{keys.API_VERSION}/namespaces/{ns}/{keys.PLURAL}"

    def created() -> bool:  # the aggregation controller folds the rules in within seconds
        try:
            editor.request("create rtj", "POST", path, body, query={"dryRun": "All"})
        except Forbidden:
            return False
        return True

    wait_for("edit to include ResilientTrainingJobs", created, 60)
    viewer.request("list rtjs", "GET", path)
    with pytest.raises(Forbidden):
        viewer.request("create rtj", "POST", path, body, query={"dryRun": "All"})
    with pytest.raises(Forbidden):  # status is the operator's
        editor.request("patch status", "PATCH", f"{path}/users-job/status",
                       {"status": {"phase": "Succeeded"}},
                       content_type="application/merge-patch+json")  # fmt: skip


def test_only_the_operator_removes_a_jobs_release_finalizer(
    installed: Installed, rtj_cluster: Any, tmp_path: Path
) -> None:
    """Issue 42: the chart's ValidatingAdmissionPolicy. A tenant who drops the finalizer and
    deletes its job would leave its quarantine claims on nodes (the operator's sweep releases
    them later); the tenant may still edit the rest of its job."""
    ns = installed.namespace
    tenant = _user(installed, rtj_cluster, tmp_path, "carol", "edit")
    path = f"/apis/{keys.API_VERSION}/namespaces/{ns}/{keys.PLURAL}"
    body = rtj_body("held", ns, "file:///mnt/ckpt/held")
    body["metadata"]["finalizers"] = [keys.RELEASE_FINALIZER]
    installed.admin.request("create rtj", "POST", path, body)
    merge = "application/merge-patch+json"
    drop = {"metadata": {"finalizers": None}}

    def refused() -> str | None:  # the aggregated role and the policy take a moment to apply
        try:
            tenant.request("drop the finalizer", "PATCH", f"{path}/held", drop,
                           query={"dryRun": "All"}, content_type=merge)  # fmt: skip
        except Forbidden as exc:
            return str(exc) if "ValidatingAdmissionPolicy" in str(exc) else None
        return None

    why = wait_for("the tenant refused by the policy", refused, 60)
    assert keys.RELEASE_FINALIZER in why and "only the operator" in why, why
    tenant.request("label the job", "PATCH", f"{path}/held",
                   {"metadata": {"labels": {"team": "a"}}}, content_type=merge)  # fmt: skip
    installed.sa.request("drop the finalizer", "PATCH", f"{path}/held", drop, content_type=merge)
    meta = installed.admin.get_rtj(ns, "held")["metadata"]
    assert not meta.get("finalizers") and meta["labels"] == {"team": "a"}
    installed.admin.delete_rtj(ns, "held")


# --- a namespaced install, last: each test narrows the release to its own namespace ------------


def _allowed(call: Callable[[], object]) -> bool:
    """Whether the API server let the call past authorization (a 404 or 422 did get past)."""
    try:
        call()
    except Forbidden:
        return False
    except KubeError:
        return True
    return True


def _watch_only(installed: Installed, rtj_cluster: Any, namespace: str) -> None:
    """What a platform team does to watch only some namespaces: the operator's rights where
    jobs live become a Role in each (kopf then lists namespaces), the ClusterRole keeps only
    cluster-scoped ones."""
    watch = f"operator.watchNamespaces={{{namespace}}}"
    helm("upgrade", RELEASE, str(CHART), "--namespace", installed.namespace, "--kubeconfig",
         rtj_cluster.kubeconfig, "--reuse-values", "--set", watch,
         "--wait", "--timeout", "120s", timeout=180)  # fmt: skip
    # the API server's authorizer sees a new Role within moments
    sa = installed.sa
    wait_for("the Role in the watched namespace", lambda: _allowed(
        lambda: sa.list_kind("pods", namespace)), 30)  # fmt: skip


def test_a_namespaced_install_reads_no_secret_and_touches_nothing_outside_its_namespaces(
    installed: Installed, rtj_cluster: Any, rtj_ns: Any
) -> None:
    """Issue 42: with operator.watchNamespaces the operator's Secret reads, JobSets, pods and
    Events are confined to those namespaces, not granted cluster-wide."""
    ns, other, sa = rtj_ns.name, installed.namespace, installed.sa
    _watch_only(installed, rtj_cluster, ns)
    # the watched namespace's sidecar ports admit the operator and the namespace's own pods
    # (the API server took the chart's NetworkPolicy; the harness enforces none)
    networking = k8s.NetworkingV1Api(rtj_cluster.kube.core.api_client)
    policy = networking.read_namespaced_network_policy(f"{SA}-sidecars", ns)
    sidecar = policy.spec.ingress[0]
    assert [p.port for p in sidecar.ports] == [keys.DEFAULT_PROGRESS_PORT]
    assert sidecar._from[0].namespace_selector.match_labels == {
        "kubernetes.io/metadata.name": other
    }
    creds = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="creds"),
                         string_data={"AWS_ACCESS_KEY_ID": "a"})  # fmt: skip
    rtj_cluster.kube.core.create_namespaced_secret(ns, creds)
    assert sa.secret_data(ns, "creds") == {"AWS_ACCESS_KEY_ID": "a"}  # a job's credentials
    control = f"{SA}-control"  # the chart's own Secret, beside the operator: mounted, not read
    assert installed.admin.secret_data(other, control)["secret"]
    intruder = {"apiVersion": keys.JOBSET_API_VERSION, "kind": "JobSet",
                "metadata": {"name": "intruder"}, "spec": {}}  # fmt: skip
    elsewhere = {"apiVersion": keys.API_VERSION, "kind": keys.KIND, "name": "x",
                 "namespace": other, "uid": "u"}  # fmt: skip
    denied: dict[str, Callable[[], object]] = {
        "get a secret in the operator's namespace": lambda: sa.secret_data(other, control),
        "get a secret in default": lambda: sa.secret_data("default", "anything"),
        "list secrets anywhere": lambda: sa.request("list", "GET", "/api/v1/secrets"),
        "create a JobSet elsewhere": lambda: sa.create_jobset(other, intruder),
        "delete a JobSet elsewhere": lambda: sa.delete_jobset(other, "intruder"),
        "list JobSets in every namespace": lambda: sa.list_kind("jobsets", None),
        "list pods in every namespace": lambda: sa.list_kind("pods", None),
        "delete a pod elsewhere": lambda: sa.delete_pod(other, "x"),
        "list jobs in every namespace": lambda: sa.list_kind("rtjs", None),
        "patch a job's status elsewhere": lambda: sa.patch_rtj_status(other, "x", {}, None),
        "list events elsewhere": lambda: sa.list_events(other),
        "post an event elsewhere": lambda: sa.post_event(elsewhere, "Normal", "X", "x"),
    }
    allowed = [what for what, call in denied.items() if _allowed(call)]
    assert not allowed, allowed
    # what it needs beyond the watched namespace still holds
    sa.list_kind("nodes", None)
    sa.list_events(NODE_EVENT_NAMESPACE, "involvedObject.kind=Node")
    leases, _ = sa.list_node_leases()
    assert leases


# --- the operator under the chart's identity, namespaced: a full failure and restart ------------


@pytest.fixture
def operator_as_sa(
    installed: Installed, rtj_cluster: Any, rtj_ns: Any, s3_root: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """Started after `s3_root` put the S3 endpoint and credentials into the environment.

    `rtj run` on the ServiceAccount's kubeconfig, leading through the chart's Lease (the
    chart's own replicas are KWOK pods: nothing in them runs, so the Lease is free), with
    only the rights of a namespaced install: the job's namespace's Role and the rest."""
    _watch_only(installed, rtj_cluster, rtj_ns.name)
    proc = OperatorProcess(
        installed.sa_kubeconfig, rtj_ns.name, tmp_path, lease_name=LEASE,
        extra=("--lease-namespace", installed.namespace, "--lease-name", LEASE),
    )  # fmt: skip
    try:
        yield proc.start()
    finally:
        proc.stop()
        print(f"\n--- {proc.log_path.name} (last 4000 chars) ---\n{proc.log()[-4000:]}")


def test_a_gpu_fault_is_survived_with_only_the_charts_permissions(
    installed: Installed, rtj_cluster: Any, rtj_ns: Any, operator_as_sa: OperatorProcess,
    s3_root: str, tmp_path: Path,
) -> None:  # fmt: skip
    admin, ns, op = installed.admin, rtj_ns.name, operator_as_sa
    uri = s3_root
    publish_steps(uri, [100], tmp_path, run_id=f"{ns}.llm")
    admin.create_rtj(ns, rtj_body("llm", ns, uri))
    pods = wait_for("attempt 1's pods to run", lambda: running_pods(admin, ns, "llm", 1, 2), 90)
    wait_for("phase Running", lambda: rtj_status(admin, ns, "llm").get("phase") == "Running", 30)
    publish_steps(uri, [300], tmp_path, run_id=f"{ns}.llm")
    victim = next(p for p in pods if p["metadata"]["labels"][keys.JOB_COMPLETION_INDEX] == "1")
    node = victim["spec"]["nodeName"]
    # the node's GPU agent reports the XID: a trainer's own words never quarantine (issue 13)
    faults.gpu_xid(rtj_cluster.kube, node, 79)
    faults.terminate_container(rtj_cluster.kube, ns, victim["metadata"]["name"], exit_code=1,
                               message=XID_MESSAGE)  # fmt: skip

    wait_for("attempt 2's pods to run", lambda: running_pods(admin, ns, "llm", 2, 2), 120)
    status = rtj_status(admin, ns, "llm")
    assert status["attempts"][0]["failureClass"] == "GPUFault"
    assert status["restarts"]["infrastructure"] == 1
    assert status["attempts"][1]["resumedFromStep"] == 300
    assert [q["node"] for q in status["quarantinedNodes"]] == [node]
    taints = (admin.get_node(node).get("spec") or {}).get("taints") or []
    assert {"key": keys.DEFAULT_TAINT_KEY, "value": "llm", "effect": "NoSchedule"} in taints
    assert [j["metadata"]["name"] for j in jobsets_of(admin, ns, "llm")] == ["llm-a2"]
    lease = admin.request("get lease", "GET", f"/apis/coordination.k8s.io/v1/namespaces/"
                          f"{installed.namespace}/leases/{LEASE}")  # fmt: skip
    assert lease["spec"]["holderIdentity"].startswith(LEASE)
    # the operator met no permission error anywhere on the way
    # (each line's message, past its "date time,millis" stamp: a millisecond can read 403)
    messages = [line.split(" ", 2)[-1] for line in op.log().splitlines()]
    for needle in ("403", "Forbidden", "forbidden"):
        bad = [m for m in messages if needle in m]
        assert not bad, bad[:5]
