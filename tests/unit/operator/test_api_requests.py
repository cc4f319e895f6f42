"""The operator counts its own API requests: `Kube(on_request=...)` -> rtj_api_requests_total."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rtj_operator.api_paths import request_kind
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import NotFound
from rtj_operator.metrics import Metrics, sample


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods", None, ("list", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods", {"watch": "true"}, ("watch", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods/p-0", None, ("get", "pods")),
        ("PATCH", "/api/v1/namespaces/ns/pods/p-0/status", None, ("patch", "pods/status")),
        ("DELETE", "/api/v1/namespaces/ns/pods/p-0", None, ("delete", "pods")),
        ("DELETE", "/api/v1/namespaces/ns/pods", None, ("deletecollection", "pods")),
        ("POST", "/api/v1/namespaces/ns/events", None, ("create", "events")),
        ("GET", "/api/v1/nodes/gpu-node-00", None, ("get", "nodes")),
        ("PATCH", "/api/v1/nodes/gpu-node-00", None, ("patch", "nodes")),
        ("GET", "/api/v1/namespaces/ns", None, ("get", "namespaces")),
        ("GET", "/api/v1/namespaces", None, ("list", "namespaces")),
        (
            "PATCH",
            "/apis/training.resilient.dev/v1alpha1/namespaces/ns/resilienttrainingjobs/j/status",
            None,
            ("patch", "resilienttrainingjobs/status"),
        ),
        ("GET", "/apis/training.resilient.dev/v1alpha1/resilienttrainingjobs", None,
         ("list", "resilienttrainingjobs")),
        ("POST", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ns/jobsets", None,
         ("create", "jobsets")),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/rtj", None,
         ("update", "leases")),
        ("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x.y", None,
         ("get", "customresourcedefinitions")),
        ("GET", "/metrics", None, ("get", "/metrics")),
    ],
)  # fmt: skip
def test_request_kind_names_verb_and_resource_like_the_api_server(
    method: str, path: str, query: dict[str, str] | None, expected: tuple[str, str]
) -> None:
    assert request_kind(method, path, query) == expected


class _Response:
    def __init__(self, status: int, data: bytes) -> None:
        self.status = status
        self._data = data

    def read(self) -> bytes:
        return self._data


class _FakeApiClient:
    """Just the two calls `Kube.request` makes on the official client."""

    def __init__(self, status: int = 200, data: bytes = b'{"items": []}') -> None:
        self.status = status
        self.data = data
        self.sent: list[tuple[str, str]] = []

    def param_serialize(self, **kw: Any) -> tuple[str, str, dict[str, str], Any, list[Any]]:
        return kw["method"], kw["resource_path"], kw["header_params"], kw["body"], []

    def call_api(self, method: str, url: str, **_: Any) -> _Response:
        self.sent.append((method, url))
        return _Response(self.status, self.data)


def test_every_request_reaches_the_counter_including_failed_ones() -> None:
    reg = CollectorRegistry()
    metrics = Metrics(reg)
    api = _FakeApiClient()
    kube = Kube(api, on_request=metrics.record_api_request)
    kube.list_pods("ns", "app=x")
    kube.list_pods("ns")
    kube.patch_rtj_status("ns", "j", {"phase": "Running"}, "7")
    api.status, api.data = 404, b'{"reason": "NotFound", "message": "gone"}'
    assert kube.delete_pod("ns", "p-0") is False  # a 404 is still a request sent
    with pytest.raises(NotFound):
        kube.get_rtj("ns", "j")
    assert len(api.sent) == 5

    def count(verb: str, resource: str) -> float:
        return sample(reg, "rtj_api_requests_total", {"verb": verb, "resource": resource})

    assert count("list", "pods") == 2
    assert count("patch", "resilienttrainingjobs/status") == 1
    assert count("delete", "pods") == 1
    assert count("get", "resilienttrainingjobs") == 1
    assert count("get", "pods") == 0


def test_without_a_callback_nothing_is_counted_and_requests_still_work() -> None:
    api = _FakeApiClient(data=b'{"items": [{"metadata": {"name": "a"}}]}')
    assert Kube(api).list_pods("ns") == [{"metadata": {"name": "a"}}]
