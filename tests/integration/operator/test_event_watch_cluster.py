"""The operator's Event watch against the real API server (issue 49): it keeps the Events the
classifier reads, and only those; follows their changes; keeps a tenant's Node Event out; and
a watch gone dead is listed again without losing what was written meanwhile. Reached through
a loopback TCP forwarder whose open connections can go dead (as in the node Lease watch's
test)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from loop_thread import LoopThread
from test_node_lease_watch_cluster import _until, proxied  # noqa: F401 (a fixture)

from e2e.tcp_proxy import TcpProxy
from rtj_operator import event_watch
from rtj_operator.event_reads import EventKey
from rtj_operator.event_watch import EventWatch, scopes_of
from rtj_operator.kube import Kube
from rtj_operator.policy.node_event_sources import NODE_EVENT_NAMESPACE

pytestmark = [pytest.mark.cluster, pytest.mark.operator]


class Watching(LoopThread):
    """`EventWatch.run` on an event loop of its own (a thread), as the operator runs it."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.touched: list[tuple[EventKey, str]] = []
        self.watch = EventWatch(scopes_of([namespace]), lambda k, u: self.touched.append((k, u)))
        super().__init__(lambda: self.watch.run(kube))

    def about(self, key: EventKey) -> list[dict[str, Any]]:
        return self.call(lambda: self.watch.about(key))


def _event(namespace: str, kind: str, name: str, reason: str, component: str) -> dict[str, Any]:
    uid = str(uuid.uuid4())
    return {
        "metadata": {"name": f"{name}.{uid[:8]}", "namespace": namespace},
        # a Node has no namespace; the API server stores a tenant's Event about one only
        # when it names the tenant's (pkg/apis/core/validation/events.go)
        "involvedObject": {"kind": kind, "name": name, "uid": uid,
                           **({} if (kind, namespace) == ("Node", NODE_EVENT_NAMESPACE)
                              else {"namespace": namespace})},
        "reason": reason,
        "message": "Memory cgroup out of memory: Killed process 4242 (python)"
        if reason == "OOMKilling" else "The node was low on resource: memory.",
        "type": "Warning",
        "source": {"component": component},
    }  # fmt: skip


@pytest.fixture
def events(rtj_cluster: Any) -> Iterator[tuple[client.CoreV1Api, str, list[tuple[str, str]]]]:
    """The API to write Events with, a fresh namespace, and what to delete after."""
    api: client.CoreV1Api = rtj_cluster.kube.core
    namespace = f"rtj-events-{uuid.uuid4().hex[:6]}"
    api.create_namespace({"metadata": {"name": namespace}})
    written: list[tuple[str, str]] = []
    yield api, namespace, written
    for ns, name in written:
        with contextlib.suppress(client.ApiException):
            api.delete_namespaced_event(name, ns)
    api.delete_namespace(namespace)


def _write(api: client.CoreV1Api, written: list[tuple[str, str]], body: dict[str, Any]) -> str:
    api.create_namespaced_event(body["metadata"]["namespace"], body)
    written.append((body["metadata"]["namespace"], body["metadata"]["name"]))
    return str(body["metadata"]["name"])


def test_the_event_watch_keeps_what_the_classifier_reads_and_follows_it(
    events: tuple[client.CoreV1Api, str, list[tuple[str, str]]],
    proxied: tuple[Kube, TcpProxy, list[str]],  # noqa: F811
) -> None:
    api, ns, written = events
    kube, _, requests = proxied
    _write(api, written, _event(ns, "Pod", "w-0", "Evicted", "kubelet"))
    _write(api, written, _event(ns, "Pod", "w-0", "Scheduled", "default-scheduler"))
    node = f"gpu-{ns}"
    forged = _write(api, written, _event(ns, "Node", node, "OOMKilling", "kernel-monitor"))
    watching = Watching(kube, ns)
    try:
        _until("the cache synced", lambda: watching.watch.synced)
        assert [e["reason"] for e in watching.about((ns, "Pod", "w-0"))] == ["Evicted"]
        assert "watch" in requests, "the Events were watched"
        genuine = _event(NODE_EVENT_NAMESPACE, "Node", node, "OOMKilling", "kernel-monitor")
        _write(api, written, genuine)
        late = _event(ns, "Pod", "w-1", "Evicted", "kubelet")
        late_name = _write(api, written, late)
        _until("the late Event kept", lambda: watching.about((ns, "Pod", "w-1")))
        _until("the node's own Event kept", lambda: watching.about(("", "Node", node)))
        held = watching.about(("", "Node", node))
        assert [e["metadata"]["namespace"] for e in held] == [NODE_EVENT_NAMESPACE], (
            f"the tenant's Node Event {forged} is not evidence"
        )
        assert ((ns, "Pod", "w-1"), late["involvedObject"]["uid"]) in watching.touched
        api.delete_namespaced_event(late_name, ns)
        _until("a deleted Event dropped", lambda: not watching.about((ns, "Pod", "w-1")))
    finally:
        watching.stop()


def test_a_dead_event_watch_is_listed_again_and_misses_nothing(
    events: tuple[client.CoreV1Api, str, list[tuple[str, str]]],
    proxied: tuple[Kube, TcpProxy, list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(event_watch, "WATCH_IDLE_SECONDS", 2.0)
    api, ns, written = events
    kube, proxy, requests = proxied
    watching = Watching(kube, ns)
    try:
        _until("the cache synced", lambda: watching.watch.synced)
        lists = requests.count("list")
        assert proxy.stall() >= 1, "the watches' connections were open"
        _write(api, written, _event(ns, "Pod", "w-2", "Evicted", "kubelet"))
        _until("listed again", lambda: requests.count("list") > lists, timeout=40)
        _until("the Event written while dead kept", lambda: watching.about((ns, "Pod", "w-2")))
        _until("synced again", lambda: watching.watch.synced)
    finally:
        watching.stop()


def test_a_watch_the_server_ends_resumes_where_it_was_without_a_list(
    events: tuple[client.CoreV1Api, str, list[tuple[str, str]]],
    proxied: tuple[Kube, TcpProxy, list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A quiet namespace: each watch ends on the server's `timeoutSeconds` (2 s here), and
    the next resumes from the last version seen, still synced; nothing is listed again."""
    monkeypatch.setattr(event_watch, "WATCH_SECONDS", 2)
    api, ns, written = events
    kube, _, requests = proxied
    watching = Watching(kube, ns)
    try:
        _until("the cache synced", lambda: watching.watch.synced)
        lists = requests.count("list")
        _until("three watches more", lambda: requests.count("watch") >= 2 + 3 * 2, timeout=30)
        _write(api, written, _event(ns, "Pod", "w-3", "Evicted", "kubelet"))
        _until("the Event kept", lambda: watching.about((ns, "Pod", "w-3")))
        assert watching.watch.synced
        assert requests.count("list") == lists, "resumed, not listed again"
    finally:
        watching.stop()
