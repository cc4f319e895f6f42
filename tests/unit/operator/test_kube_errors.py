"""kube_errors: what a failed API call means, from the API server's status and Status body.

The bodies are `metav1.Status` objects as the API server writes them: the reasons and
messages of k8s.io/apimachinery v0.35 `pkg/api/errors/errors.go` (`NewAlreadyExists`,
`NewConflict`, `NewNotFound`, `NewForbidden`, `NewTooManyRequests`) and the strict decoding
error of k8s.io/apiserver v0.35's handlers.
"""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from rtj_operator.kube_errors import (
    AlreadyExists,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    Unavailable,
    from_answer,
    from_exception,
)


def status(code: int, reason: str, message: str) -> str:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                       "status": "Failure", "message": message, "reason": reason,
                       "code": code})  # fmt: skip


@pytest.mark.parametrize(
    ("code", "reason", "message", "kind"),
    [
        (409, "AlreadyExists", 'jobsets.jobset.x-k8s.io "llm-a1" already exists', AlreadyExists),
        (409, "Conflict", 'Operation cannot be fulfilled on nodes "gpu-7": the object has been '
         "modified; please apply your changes to the latest version and try again", Conflict),
        (404, "NotFound", 'pods "llm-w-0-0" not found', NotFound),
        (403, "Forbidden", 'nodes "gpu-7" is forbidden: User "system:serviceaccount:rtj:rtj" '
         'cannot patch resource "nodes" in API group "" at the cluster scope', Forbidden),
        (429, "TooManyRequests", "the server has received too many requests and has asked us "
         "to try again later", Unavailable),
        (500, "InternalError", "Internal error occurred: etcdserver: request timed out",
         Unavailable),
    ],
)  # fmt: skip
def test_the_client_exception_is_read_by_its_status_and_reason(
    code: int, reason: str, message: str, kind: type[KubeError]
) -> None:
    exc = ApiException(status=code, reason=reason, body=status(code, reason, message))
    err = from_exception(exc, "create jobset team-a/llm-a1")
    assert type(err) is kind and err.status == code
    assert str(err) == f"create jobset team-a/llm-a1: {message}"


def test_an_answer_without_a_status_body_keeps_what_is_known() -> None:
    gateway = from_answer("list pods", 502, b"<html>Bad Gateway</html>", "HTTP 502")
    assert isinstance(gateway, Unavailable) and str(gateway) == "list pods: HTTP 502"
    teapot = from_answer("list pods", 418, b"[]", "HTTP 418")
    assert type(teapot) is KubeError and teapot.status == 418
    unanswered = from_exception(ApiException(status=0, reason="timed out"), "get node gpu-7")
    assert isinstance(unanswered, Unavailable) and not unanswered.status


def test_a_strict_decoding_error_is_an_invalid_object_not_a_transient_error() -> None:
    # the API server's answer to an unknown field under fieldValidation=Strict (HTTP 400,
    # reason BadRequest: apiserver handlers' strict decoding, k8s.io/apiserver v0.35)
    body = json.dumps({"kind": "Status", "status": "Failure", "reason": "BadRequest", "code": 400,
                       "message": 'JobSet in version "v1alpha2" cannot be handled as a JobSet: '
                       'strict decoding error: unknown field "spec.x"'})  # fmt: skip
    err = from_answer("create jobset team-a/llm-a1", 400, body.encode(), "HTTP 400")
    assert isinstance(err, Invalid) and 'unknown field "spec.x"' in str(err)
