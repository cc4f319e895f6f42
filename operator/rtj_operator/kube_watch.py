"""One WATCH request, read as plain JSON lines: the operator's own watches (node Leases,
Events) beside kopf's. Blocking; called from a thread of its own.

The official client's `watch.Watch` builds a generated model of every object and then turns
it back into a dict; a watch on Events sees every Event of the cluster, so here each line is
parsed once (`json.loads`) and handed on as it came. The stream ends when the server closes
it (`timeoutSeconds`); the client's own read timeout is the idle limit, since a dead
connection never ends on the server's word (kubernetes-client/python#1402).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from rtj_operator.api_paths import request_kind
from rtj_operator.kube_errors import Unavailable, from_answer, translated

if TYPE_CHECKING:
    from rtj_operator.kube import Kube

WatchEvent = tuple[str, dict[str, Any]]
"""(type, object): ADDED, MODIFIED, DELETED or BOOKMARK, and the object as plain JSON."""


def stream(
    kube: Kube,
    what: str,
    path: str,
    query: Mapping[str, Any],
    idle_seconds: float | None,
) -> Iterator[WatchEvent]:
    """WATCH `path` with `query` (`watch=1` added) until the server ends it or nothing arrives
    for `idle_seconds`. Raises KubeError: an ERROR event (410 Gone: list again) as its code
    says, a broken or idle connection as Unavailable."""
    from kubernetes.watch.watch import iter_resp_lines

    params = [(k, v) for k, v in {**query, "watch": "1"}.items() if v is not None]
    if kube.on_request is not None:
        kube.on_request(*request_kind("GET", path, dict(params)))
    response: Any = None
    try:
        with translated(what):
            method, url, headers, body, post = kube.api_client.param_serialize(
                method="GET",
                resource_path=path,
                query_params=params,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = kube.api_client.call_api(
                method, url, header_params=headers, body=body, post_params=post,
                _request_timeout=(kube.timeout, idle_seconds),
            )  # fmt: skip
            if not 200 <= response.status <= 299:
                code = response.status
                raise from_answer(what, code, response.read(), f"HTTP {code}")
            for line in iter_resp_lines(response.response):  # type: ignore[no-untyped-call]
                if line:
                    yield _event(what, line)
    finally:
        if response is not None:
            response.response.release_conn()


def _event(what: str, line: str) -> WatchEvent:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise Unavailable(f"{what}: a watch line that is not JSON: {line[:80]!r}") from exc
    kind = str(event.get("type") or "")
    body = event.get("object") or {}
    if kind == "ERROR":
        code = int(body.get("code") or 500)
        raise from_answer(what, code, json.dumps(body), f"HTTP {code}")
    return kind, body
