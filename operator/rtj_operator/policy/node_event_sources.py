"""Which Events about a Node are the node's own, not a tenant's. Pure.

Anyone who may create Events in a namespace can write one whose `involvedObject` (or
`regarding`) names any Node, with any reason, message and `source`: a tenant could make
another job's failure read as the node's OOM killer, a lost node or an XID (issue 42). What a
tenant cannot choose is where its Event is stored, and the node's own reporters store theirs
in `default`:

- An Event lives in its involved object's namespace, and a Node has none: client-go's
  recorders store it in `default` (k8s.io/client-go tools/record/event.go `makeEvent`:
  `namespace := ref.Namespace; if namespace == "" { namespace = metav1.NamespaceDefault }`;
  tools/events/event_recorder.go does the same for events.k8s.io/v1).
- The kubelet's node reference has `Namespace: ""` (pkg/kubelet/kubelet.go `NewMainKubelet`,
  `nodeRef`), as have the node lifecycle controller's (pkg/controller/util/node
  `RecordNodeEvent`, `RecordNodeStatusChange`) and node-problem-detector's (k8sexporter
  problemclient `getNodeRef` with its default `--event-namespace` of "").
- The API server holds tenants to it: an Event whose involved object names no namespace is
  refused in any namespace but `default` (and `kube-system`, for one with an `eventTime`),
  so a tenant's Event naming a Node must name the tenant's namespace and is stored there
  (pkg/apis/core/validation/events.go `legacyValidateEvent`: "does not match
  event.namespace").

A Node Event counts only from that namespace and from one of those reporters
(`source.component`, or `reportingController` for events.k8s.io/v1). Events about pods,
JobSets and Kueue Workloads are read in the job's own namespace (`event_reads`), where only
the job's own tenant and the cluster's controllers write, and count as they are. This module
is the one place the rule is written: `counts` is what the classifier and the event reader
ask (`classify.reads_event`).
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from rtj_operator.policy.observed import EventView

NODE_EVENT_NAMESPACE: Final = "default"
"""Where client-go stores Events about a Node (metav1.NamespaceDefault)."""


class NodeReporter(str, Enum):
    """A component whose Events about a Node are node-level evidence."""

    KUBELET = "kubelet"
    """cmd/kubelet/app/server.go `componentKubelet` (NodeShutdown, ...)."""
    NODE_CONTROLLER = "node-controller"
    """pkg/controller/nodelifecycle: `EventSource{Component: "node-controller"}`
    (NodeNotReady, RemovingNode)."""
    CLOUD_NODE_LIFECYCLE = "cloud-node-lifecycle-controller"
    """k8s.io/cloud-provider controllers/nodelifecycle (DeletingNode)."""
    NPD_KERNEL_MONITOR = "kernel-monitor"
    """node-problem-detector config/kernel-monitor.json `source` (OOMKilling)."""


NODE_REPORTERS: Final = frozenset(r.value for r in NodeReporter)


def node_event(event: EventView) -> bool:
    """Whether the Event is about a Node."""
    return event.kind == "Node"


def trusted_node_event(event: EventView) -> bool:
    """A Node Event the node's own reporters wrote where they write (see the module)."""
    return event.namespace == NODE_EVENT_NAMESPACE and event.reporter in NODE_REPORTERS


def counts(event: EventView) -> bool:
    """Whether an Event may be read as evidence: every Event not about a Node, and Node
    Events only from the node's own reporters in `default`."""
    return not node_event(event) or trusted_node_event(event)
