"""Events naming a Node count only where and from whom the node's own reporters write them
(issue 42): a tenant can create an Event in its own namespace whose involvedObject names any
node, and it must not reclassify another job's failure.

The world is the corpus's `torchrun_sigkill_no_oom` (a worker SIGKILLed, nothing else known:
Unknown); its twin `npd_host_oom_explains_sigkill` adds node-problem-detector's OOMKilling
Event on that worker's node, which makes it OutOfMemory.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from rtj_test_support import FIXTURES, NOW, load_json

from rtj_operator import reconcile as rc
from rtj_operator.api import FailureClass
from rtj_operator.policy.classify import classify_failure, reads_event
from rtj_operator.policy.node_event_sources import NODE_EVENT_NAMESPACE, NodeReporter, counts
from rtj_operator.policy.observed import read_event

C = FailureClass
WORLD = FIXTURES / "classify" / "torchrun_sigkill_no_oom"
NPD_OOM = FIXTURES / "classify" / "npd_host_oom_explains_sigkill"
NODE = "gpu-node-012"
TENANT_NS = "team-a"


def _items(folder: Any, kind: str) -> list[dict[str, Any]]:
    return copy.deepcopy(load_json(folder / f"{kind}.json")["items"])


def _node_event(reason: str, message: str, reporter: str, namespace: str) -> dict[str, Any]:
    """A core/v1 Event about NODE, as the reporter (or a tenant posing as it) writes it: the
    API server stores one naming no namespace only in `default`, so a tenant's names its own
    (pkg/apis/core/validation/events.go, legacyValidateEvent)."""
    (npd,) = _items(NPD_OOM, "events")
    npd["metadata"]["namespace"] = namespace
    npd["involvedObject"]["namespace"] = "" if namespace == NODE_EVENT_NAMESPACE else namespace
    npd.update(reason=reason, message=message, reportingComponent=reporter)
    npd["source"] = {"component": reporter, "host": NODE}
    return dict(npd)


def _as_events_v1(event: dict[str, Any]) -> dict[str, Any]:
    """The same Event read through events.k8s.io/v1 (regarding, note, reportingController)."""
    return {
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": event["metadata"],
        "regarding": event["involvedObject"], "reason": event["reason"],
        "note": event["message"], "reportingController": event["source"]["component"],
        "deprecatedFirstTimestamp": event["firstTimestamp"], "type": event["type"],
    }  # fmt: skip


def _classify(events: list[dict[str, Any]], nodes: bool = True) -> FailureClass:
    found = classify_failure(
        _items(WORLD, "pods"), _items(WORLD, "nodes") if nodes else None, events, NOW
    )
    assert found is not None
    return found.failure_class


KERNEL_OOM = _items(NPD_OOM, "events")[0]["message"]
FORGED = [
    # node-problem-detector's kernel monitor: a SIGKILL becomes the host's OOM killer's
    ("OOMKilling", KERNEL_OOM, NodeReporter.NPD_KERNEL_MONITOR, True, C.OUT_OF_MEMORY),
    # the node lifecycle controller, read where the node object is not known: a lost node
    ("NodeNotReady", f"Node {NODE} status is now: NodeNotReady", NodeReporter.NODE_CONTROLLER,
     False, C.NODE_LOST),
    # any Event's message is read for Kueue's eviction words: the job "was preempted"
    ("NodeNotReady", "Preempted to accommodate a higher priority Workload",
     NodeReporter.NODE_CONTROLLER, True, C.PREEMPTED),
]  # fmt: skip


@pytest.mark.parametrize(("reason", "message", "reporter", "nodes", "would_be"), FORGED)
def test_a_node_event_in_a_tenants_namespace_changes_no_classification(
    reason: str, message: str, reporter: NodeReporter, nodes: bool, would_be: FailureClass
) -> None:
    assert _classify([], nodes) is C.UNKNOWN
    genuine = _node_event(reason, message, reporter.value, NODE_EVENT_NAMESPACE)
    assert _classify([genuine], nodes) is would_be, "the node's own Event is evidence"
    assert _classify([_as_events_v1(genuine)], nodes) is would_be, "through either API"
    forged = _node_event(reason, message, reporter.value, TENANT_NS)
    assert _classify([forged], nodes) is C.UNKNOWN
    assert _classify([_as_events_v1(forged)], nodes) is C.UNKNOWN
    assert not reads_event(forged), "the reader does not keep it either"


def test_a_node_event_in_default_from_another_reporter_is_no_evidence() -> None:
    """`default` is where the node's reporters write, not a licence for anyone there."""
    posing = _node_event("OOMKilling", KERNEL_OOM, "my-trainer", NODE_EVENT_NAMESPACE)
    assert _classify([posing]) is C.UNKNOWN
    assert not counts(read_event(posing)) and not reads_event(posing)


def test_the_rule_is_for_node_events_only() -> None:
    """Pod, JobSet and Workload Events are read in the job's own namespace: as they are."""
    pod = {"metadata": {"namespace": TENANT_NS}, "reason": "Evicted", "source": {},
           "involvedObject": {"kind": "Pod", "name": "llm-a1-worker-0-2-r2v8n",
                              "namespace": TENANT_NS}}  # fmt: skip
    assert counts(read_event(pod)) and reads_event(pod)
    for reporter in NodeReporter:
        event = _node_event("NodeShutdown", "", reporter.value, NODE_EVENT_NAMESPACE)
        assert counts(read_event(event)), reporter
    nameless = _node_event("OOMKilling", KERNEL_OOM, "kernel-monitor", NODE_EVENT_NAMESPACE)
    del nameless["metadata"]["namespace"]
    assert not counts(read_event(nameless)), "where it is stored must be known"


def test_what_the_operator_keeps_of_an_event_still_says_who_wrote_it() -> None:
    """`event_reads` trims each Event before the classifier reads it."""
    genuine = _node_event("OOMKilling", KERNEL_OOM, "kernel-monitor", NODE_EVENT_NAMESPACE)
    for event in (genuine, _as_events_v1(genuine)):
        assert counts(read_event(rc.trim_event(event)))
    assert _classify([rc.trim_event(genuine)]) is C.OUT_OF_MEMORY
