"""Per-test isolation on a shared cluster: a namespace, its LocalQueue and ClusterQueue, and
node reset after tests that injected node faults."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException

from . import faults, kwok
from .cluster import NODE_LEASE_SECONDS, LocalCluster
from .kube import JOBSET_GROUP, JOBSET_VERSION, KUEUE_GROUP, KUEUE_VERSION, Kube, eventually
from .node_health import REPAIRED_BY_RESET, LeaseView, NodeProblem, NodeView, node_problems
from .startup import RESOURCE_FLAVOR

Obj = dict[str, Any]
RTJ_GROUP, RTJ_VERSION, RTJ_PLURAL = "training.resilient.dev", "v1alpha1", "resilienttrainingjobs"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
LOCAL_QUEUE = "team-a"
NODE_LEASE_NAMESPACE = "kube-node-lease"

# A worker that runs on a real kubelet too (``make e2e-kind``): it waits until a fault helper
# asks it to exit with a given code, like a trainer that dies (see faults.terminate_container).
WORKER_IMAGE = "busybox:1.36"
WORKER_COMMAND = [
    "sh",
    "-c",
    "trap 'exit \"$(cat /tmp/rtj-exit-code 2>/dev/null || echo 1)\"' USR1; "
    "while :; do sleep 1 & wait $!; done",
]


@dataclass
class ClusterHandle:
    """The session's cluster: where it is and a client bound to it."""

    kubeconfig: str
    kube: Kube
    nodes: int
    gpus_per_node: int
    managed: bool = True  # False when attached to a cluster someone else started
    backend: str = "local"  # "local" (KWOK nodes) or "kind" (real kubelets)
    lease_seconds: float = NODE_LEASE_SECONDS
    local: LocalCluster | None = None
    """The harness's own processes (None: attached to a cluster that is not ours)."""

    @property
    def node_names(self) -> list[str]:
        return [kwok.node_name(i) for i in range(self.nodes)]

    def node_is_pristine(self, node: Any | None) -> bool:
        if node is None:
            return False
        labels = node.metadata.labels or {}
        annotations = node.metadata.annotations or {}
        ready = next((c.status for c in node.status.conditions or [] if c.type == "Ready"), None)
        extra_conditions = [
            c
            for c in node.status.conditions or []
            if c.type
            not in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
        ]
        return (
            labels.get(kwok.MANAGED_LABEL) == kwok.MANAGED_VALUE
            and kwok.IGNORE_ANNOTATION not in annotations
            and faults.XID_LABEL_KEY not in labels
            and not (node.spec.taints or [])
            and not node.spec.unschedulable
            and ready == "True"
            and not extra_conditions
        )

    def reset_nodes(self, timeout: float = 60.0) -> list[str]:
        """Recreate every node a test faulted, tainted or deleted; returns their names.

        A node comes back under its old name only once its old Lease is gone: KWOK v0.8.0
        renews a Lease it still holds in its cache under the old Node's UID, and when the
        garbage collector then removes that Lease, KWOK's renewals fail for good
        (shared/notes/kwok-lease-recreate.md). The reset ends when each node is Ready and
        its Lease is the new Node's and fresh."""
        if self.backend != "local":
            return []  # real nodes: the local_only tests that break nodes do not run there
        existing = {n.metadata.name: n for n in self.kube.core.list_node().items}
        dirty = [name for name in self.node_names if not self.node_is_pristine(existing.get(name))]
        for name in dirty:
            if name in existing:
                _delete_ignoring_absent(lambda name=name: self.kube.core.delete_node(name))
        for name in dirty:
            eventually(
                f"node {name} deleted",
                lambda name=name: faults.node_ready_status(self.kube, name) is None,
                timeout,
            )
            self._delete_lease(name, timeout)
            i = int(name.removeprefix(kwok.NODE_PREFIX))
            self.kube.apply(
                kwok.node_manifest(i, self.nodes, kwok.NodeShape(gpus=self.gpus_per_node))
            )
        if dirty:
            eventually(
                f"nodes {', '.join(dirty)} Ready again, each with a fresh Lease of its own",
                lambda: not self.node_problems(dirty),
                timeout,
            )
        return dirty

    def _delete_lease(self, name: str, timeout: float) -> None:
        def gone() -> bool:
            try:
                self.kube.coord.read_namespaced_lease(name, NODE_LEASE_NAMESPACE)
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return False

        _delete_ignoring_absent(
            lambda: self.kube.coord.delete_namespaced_lease(
                name, NODE_LEASE_NAMESPACE, grace_period_seconds=0
            )
        )
        eventually(f"node {name}'s old Lease deleted", gone, timeout)

    def node_problems(self, names: Sequence[str] | None = None) -> list[NodeProblem]:
        """What keeps the shared nodes (or ``names``) from serving a test; empty: all fit."""
        now = time.time()
        nodes = {
            n.metadata.name: NodeView(n.metadata.name, n.metadata.uid, self.node_is_pristine(n))
            for n in self.kube.core.list_node().items
        }
        leases = {
            lease.metadata.name: LeaseView(
                lease.metadata.name,
                tuple(o.uid for o in lease.metadata.owner_references or []),
                None if lease.spec.renew_time is None else now - lease.spec.renew_time.timestamp(),
            )
            for lease in self.kube.coord.list_namespaced_lease(NODE_LEASE_NAMESPACE).items
        }
        wanted = self.node_names if names is None else list(names)
        return node_problems(wanted, nodes, leases, lease_seconds=self.lease_seconds)

    def repair_nodes(self, timeout: float = 60.0) -> list[NodeProblem]:
        """Mend what `node_problems` finds: re-create nodes a test left broken, restart
        KWOK when its leases are wrong. Returns what is still wrong afterwards."""
        problems = self.node_problems()
        if not problems:
            return []
        lease_trouble = sorted({p.node for p in problems if p.trouble not in REPAIRED_BY_RESET})
        for name in lease_trouble:
            self._delete_lease(name, timeout)
        if lease_trouble and self.local is not None:
            # a fresh KWOK has no stale Lease in its cache; but it renews under a holder
            # identity of its own (hostname and a new UUID), so it would take over every
            # other Lease only once the old holder's expired, each node silent ~20 s
            # meanwhile: a partition to an operator. Its Leases go while it is stopped.
            self.local.restart(
                "kwok",
                while_stopped=lambda: [self._delete_lease(n, timeout) for n in self.node_names],
            )
        self.reset_nodes(timeout)
        try:
            eventually("the shared nodes fit again", lambda: not self.node_problems(), timeout)
        except TimeoutError:
            return self.node_problems()
        return []


def _delete_ignoring_absent(delete: Callable[[], object]) -> None:
    try:
        delete()
    except ApiException as exc:
        if exc.status != 404:
            raise


def namespace_for(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    digest = hashlib.sha1(f"{test_name}{time.time_ns()}".encode()).hexdigest()[:6]
    return f"t-{slug}-{digest}"


@dataclass
class TestNamespace:
    """One test's slice of the cluster: namespace, LocalQueue ``team-a`` and its own
    ClusterQueue (named like the namespace) whose GPU quota the test may change."""

    __test__ = False  # not a pytest test class

    kube: Kube
    name: str
    cluster_queue: str
    local_queue: str = LOCAL_QUEUE
    gpu_quota: int = 0
    created: list[str] = field(default_factory=list)

    # --- queues ---------------------------------------------------------------------------
    def cluster_queue_body(self, gpus: int) -> Obj:
        return {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "ClusterQueue",
            "metadata": {"name": self.cluster_queue},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.name}},
                "queueingStrategy": "BestEffortFIFO",
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", kwok.GPU_RESOURCE],
                        "flavors": [
                            {
                                "name": RESOURCE_FLAVOR,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "100000"},
                                    {"name": "memory", "nominalQuota": "1000Ti"},
                                    {"name": kwok.GPU_RESOURCE, "nominalQuota": str(gpus)},
                                ],
                            }
                        ],
                    }
                ],
            },
        }

    def set_gpu_quota(self, gpus: int) -> None:
        """Change the ClusterQueue's nominal GPU quota (Kueue re-evaluates pending work).
        Read, change, replace; again on a conflict: Kueue writes the object too (a 409 from
        the replace failed a drill once, stop 55's CI run)."""
        for tries_left in range(9, -1, -1):
            cq = self.kube.kueue_get("clusterqueues", self.cluster_queue)
            for rg in cq["spec"]["resourceGroups"]:
                for fl in rg["flavors"]:
                    for r in fl["resources"]:
                        if r["name"] == kwok.GPU_RESOURCE:
                            r["nominalQuota"] = str(gpus)
            try:
                self.kube.custom.replace_cluster_custom_object(
                    KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", self.cluster_queue, cq
                )
                break
            except ApiException as exc:
                if exc.status != 409 or not tries_left:
                    raise
        self.gpu_quota = gpus

    # --- JobSets --------------------------------------------------------------------------
    def jobset(
        self,
        name: str,
        *,
        replicas: int = 2,
        gpus_per_pod: int = 8,
        queue: str | None = LOCAL_QUEUE,
        image: str = WORKER_IMAGE,
        restart_policy: str = "Never",
        max_restarts: int = 0,
    ) -> Obj:
        """A JobSet shaped like the operator's: one ``worker`` replicated job, one pod per
        node, the Kueue queue label, JobSet restarts off."""
        labels = {QUEUE_LABEL: queue} if queue else {}
        return {
            "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
            "kind": "JobSet",
            "metadata": {"name": name, "namespace": self.name, "labels": labels},
            "spec": {
                "failurePolicy": {"maxRestarts": max_restarts},
                "network": {"enableDNSHostnames": True},
                "replicatedJobs": [
                    {
                        "name": "worker",
                        "replicas": 1,
                        "template": {
                            "spec": {
                                "parallelism": replicas,
                                "completions": replicas,
                                "completionMode": "Indexed",
                                "backoffLimit": 0,
                                "template": {
                                    "spec": {
                                        "restartPolicy": restart_policy,
                                        "containers": [
                                            {
                                                "name": "trainer",
                                                "image": image,
                                                "command": WORKER_COMMAND,
                                                "terminationMessagePolicy": (
                                                    "FallbackToLogsOnError"
                                                ),
                                                "resources": {
                                                    "requests": {
                                                        kwok.GPU_RESOURCE: str(gpus_per_pod),
                                                        "cpu": "1",
                                                        "memory": "1Gi",
                                                    },
                                                    "limits": {
                                                        kwok.GPU_RESOURCE: str(gpus_per_pod)
                                                    },
                                                },
                                            }
                                        ],
                                    }
                                },
                            }
                        },
                    }
                ],
            },
        }

    def create_jobset(self, body: Obj) -> Obj:
        return self.kube.jobset_create(body, self.name)

    def get_jobset(self, name: str) -> Obj:
        return self.kube.jobset_get(name, self.name)

    def pods(self, label_selector: str = "") -> list[Any]:
        return list(
            self.kube.core.list_namespaced_pod(self.name, label_selector=label_selector).items
        )

    def workloads(self) -> list[Obj]:
        return self.kube.kueue_list("workloads", self.name)

    def wait_pods_running(self, n: int, label_selector: str = "", timeout: float = 60) -> list[Any]:
        def running() -> list[Any] | None:
            pods = [
                p
                for p in self.pods(label_selector)
                if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
            ]
            return pods if len(pods) >= n else None

        return eventually(f"{n} pods Running in {self.name}", running, timeout)


def create_test_namespace(kube: Kube, test_name: str, gpu_quota: int) -> TestNamespace:
    name = namespace_for(test_name)
    kube.core.create_namespace(
        {"metadata": {"name": name, "labels": {"e2e.resilient.dev/test": "true"}}}
    )
    tn = TestNamespace(kube=kube, name=name, cluster_queue=name, gpu_quota=gpu_quota)
    kube.kueue_create("clusterqueues", tn.cluster_queue_body(gpu_quota))
    kube.kueue_create(
        "localqueues",
        {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "LocalQueue",
            "metadata": {"name": tn.local_queue, "namespace": name},
            "spec": {"clusterQueue": tn.cluster_queue},
        },
        namespace=name,
    )
    eventually(
        f"ClusterQueue {name} active",
        lambda: any(
            c.get("type") == "Active" and c.get("status") == "True"
            for c in kube.kueue_get("clusterqueues", name).get("status", {}).get("conditions", [])
        ),
        30,
    )
    # the namespace's default ServiceAccount (created by the controller-manager) must exist
    # before pods can be created in it
    eventually(
        f"ServiceAccount default in {name}",
        lambda: kube.core.read_namespaced_service_account("default", name),
        30,
    )
    return tn


def delete_test_namespace(tn: TestNamespace, timeout: float = 60.0) -> None:
    """Delete the test's workloads and namespace; return once no pod of it holds a node.

    The namespace object itself may linger a little (its controller sweeps every API group);
    names are unique per test, so nothing waits for that.
    """
    kube = tn.kube
    for js in kube.custom.list_namespaced_custom_object(
        JOBSET_GROUP, JOBSET_VERSION, tn.name, "jobsets"
    ).get("items", []):
        try:
            kube.custom.delete_namespaced_custom_object(
                JOBSET_GROUP,
                JOBSET_VERSION,
                tn.name,
                "jobsets",
                js["metadata"]["name"],
                propagation_policy="Background",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
    # a job that quarantined nodes holds a finalizer its operator removes once it released
    # its claims; the test's operator may be gone by now: drop it as an administrator would
    try:
        jobs = kube.custom.list_namespaced_custom_object(
            RTJ_GROUP, RTJ_VERSION, tn.name, RTJ_PLURAL
        ).get("items", [])
    except ApiException as exc:
        if exc.status != 404:
            raise
        jobs = []  # the CRD is not installed in this cluster
    for job in jobs:
        if job["metadata"].get("finalizers"):
            try:
                kube.custom.patch_namespaced_custom_object(
                    RTJ_GROUP, RTJ_VERSION, tn.name, RTJ_PLURAL, job["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                )  # fmt: skip
            except ApiException as exc:
                if exc.status != 404:
                    raise
    try:
        kube.core.delete_namespace(tn.name)
    except ApiException as exc:
        if exc.status != 404:
            raise

    def no_pods() -> bool:
        return not kube.core.list_namespaced_pod(tn.name).items

    try:
        eventually(f"pods of {tn.name} deleted", no_pods, 10, interval=0.25)
    except TimeoutError:
        # Pods on a node whose kubelet is gone (a node_lost fault) stay Terminating, as in a
        # real cluster; clear them the way an administrator would: drop leftover test
        # finalizers and force-delete.
        for pod in kube.core.list_namespaced_pod(tn.name).items:
            try:  # a pod may vanish meanwhile: 404 is what we want
                if pod.metadata.finalizers:
                    kube.core.patch_namespaced_pod(
                        pod.metadata.name, tn.name, {"metadata": {"finalizers": None}}
                    )
                kube.core.delete_namespaced_pod(pod.metadata.name, tn.name, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        eventually(f"pods of {tn.name} deleted", no_pods, timeout, interval=0.5)
    try:
        kube.custom.delete_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", tn.cluster_queue
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
