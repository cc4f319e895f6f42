"""Where the operator's resources live on the API server, and what the server calls a request.

`api_path` joins a resource's path from its parts, `request_kind` names a request the way
the API server's own metrics and audit log do (verb, resource), for `rtj_api_requests_total`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

from rtj_operator.api import keys

JOBSET_GROUP, JOBSET_VERSION = keys.JOBSET_API_VERSION.split("/")
JOBSET_PLURAL = "jobsets"
RTJ = ("apis", keys.GROUP, keys.VERSION)
JOBSETS = ("apis", JOBSET_GROUP, JOBSET_VERSION)
LEASES = ("apis", "coordination.k8s.io", "v1")


def api_path(*parts: str) -> str:
    """The URL path of `parts`, each percent-encoded (a name never adds a segment)."""
    return "/" + "/".join(quote(p, safe="") for p in parts)


def request_kind(method: str, path: str, query: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """The Kubernetes verb and resource of one request, as the API server names them.

    `GET` of a collection is `list` (`watch` with `watch=true`), of one object `get`; `POST`
    is `create`, `PUT` `update`, `PATCH` `patch`, `DELETE` `delete` (`deletecollection`
    without a name). The resource is the plural, with the subresource after a slash
    (`pods/status`); paths outside /api and /apis are reported as they are (`/metrics`).
    """
    parts = [unquote(p) for p in path.split("?", 1)[0].strip("/").split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        rest = parts[3:]
    else:
        return method.lower(), "/" + "/".join(parts)
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]  # a namespaced resource (a namespace itself has at most 2 parts)
    resource = "/".join(rest[:1] + rest[2:3]) or "?"
    named = len(rest) >= 2
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method.upper())
    if verb is None and method.upper() == "GET":
        watch = str((query or {}).get("watch", "")).lower() in ("true", "1")
        verb = "get" if named else ("watch" if watch else "list")
    elif verb is None and method.upper() == "DELETE":
        verb = "delete" if named else "deletecollection"
    return verb or method.lower(), resource
