"""The Kubernetes adapter: the only module that calls the API server. Typed errors.

Every call is blocking (the official client); the controller runs them in worker threads.
Errors come out as `KubeError` subclasses (`NotFound`, `Conflict`, `AlreadyExists`,
`Invalid`, `Forbidden`, `Unavailable`; in `kube_errors`) so callers branch on meaning, not on
status codes. Resource paths and request names come from `api_paths`.
Responses are read as plain JSON (`_preload_content=False`), never as generated models.
Every request is reported to an optional `on_request(verb, resource)` callback injected at
construction (the operator counts them in `rtj_api_requests_total`); this module imports no
metrics library.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from rtj_operator import kube_watch
from rtj_operator.api import keys
from rtj_operator.api_paths import JOBSET_PLURAL, JOBSETS, LEASES, RTJ, api_path, request_kind
from rtj_operator.event_body import event_body
from rtj_operator.kube_errors import (
    Conflict,
    NotFound,
    from_answer,
    translated,
)
from rtj_operator.kube_watch import WatchEvent

FIELD_MANAGER = "rtj-operator"
MERGE_PATCH = "application/merge-patch+json"
_RETRIES = 5
NODE_LEASE_NAMESPACE = "kube-node-lease"
EVENT_PAGE = 500
MAX_EVENT_PAGES = 20


class NodeChange(Protocol):
    """A node edit's result: the new taints and the new value of one annotation."""

    @property
    def taints(self) -> Sequence[Mapping[str, Any]]: ...

    @property
    def annotation(self) -> str | None: ...


RequestHook = Callable[[str, str], None]
"""Told of every request: (verb, resource), e.g. ("patch", "resilienttrainingjobs/status")."""


def _collection(kind: str, namespace: str | None) -> tuple[str, str | None]:
    """The path and label selector of a kind the operator lists and watches."""
    scope = ("namespaces", namespace) if namespace else ()
    if kind == "pods":
        return api_path("api", "v1", *scope, "pods"), keys.JOB_LABEL
    if kind == "jobsets":
        return api_path(*JOBSETS, *scope, JOBSET_PLURAL), keys.JOB_LABEL
    if kind == "nodes":
        return api_path("api", "v1", "nodes"), None
    if kind == "rtjs":
        return api_path(*RTJ, *scope, keys.PLURAL), None
    if kind == "events":
        return api_path("api", "v1", *scope, "events"), None
    if kind == "leases":
        return api_path(*LEASES, *scope, "leases"), None
    raise ValueError(f"unknown kind {kind!r}")


def _json(response: Any) -> dict[str, Any]:
    data = response.data if hasattr(response, "data") else response
    if isinstance(data, (bytes, str)):
        parsed = json.loads(data) if data else {}
        return parsed if isinstance(parsed, dict) else {}
    return data if isinstance(data, dict) else {}


class Kube:
    """Typed calls the operator makes. Thread-safe (urllib3 pools); one per process.

    Requests go through the official client's transport (authentication, TLS, pools) but
    bodies are plain JSON both ways: no generated models, no per-call model validation.
    """

    def __init__(
        self,
        api_client: Any = None,
        *,
        pool_size: int = 32,
        timeout: float = 30.0,
        on_request: RequestHook | None = None,
    ) -> None:
        from kubernetes import client

        if api_client is None:
            configuration = client.Configuration.get_default_copy()
            configuration.connection_pool_maxsize = pool_size
            api_client = client.ApiClient(configuration)
        self.api_client = api_client
        self.timeout = timeout
        self.on_request = on_request

    def request(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One API call; the answer as a dict. Raises a KubeError subclass on failure."""
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        if self.on_request is not None:
            self.on_request(*request_kind(method, path, query))
        headers = {"Accept": "application/json", "Content-Type": content_type}
        with translated(what):
            method_, url, headers_, body_, post = self.api_client.param_serialize(
                method=method,
                resource_path=path,
                query_params=params or None,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self.api_client.call_api(
                method_,
                url,
                header_params=headers_,
                body=body_,
                post_params=post,
                _request_timeout=self.timeout,
            )
            data = response.read()
        if not 200 <= response.status <= 299:
            raise from_answer(what, response.status, data, f"HTTP {response.status}")
        return _json(data)

    # --- lists for the watch caches --------------------------------------------------------

    def list_kind(
        self,
        kind: str,
        namespace: str | None,
        trim: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        page: int = 250,
        keep: Callable[[dict[str, Any]], bool] | None = None,
    ) -> tuple[list[dict[str, Any]], int | None]:
        """One paged LIST of what the operator caches: `pods` and `jobsets` labelled for a
        job, all `nodes`, all `rtjs`, `events` (those `keep` accepts). Items are filtered and
        trimmed page by page (bounded memory); returns them and the list's resourceVersion."""
        path, selector = _collection(kind, namespace)
        items: list[dict[str, Any]] = []
        token: str | None = None
        rv: str | None = None
        while True:
            query = {"labelSelector": selector, "limit": page, "continue": token}
            answer = self.request(f"list {kind}", "GET", path, query=query)
            meta = answer.get("metadata") or {}
            rv = rv or meta.get("resourceVersion")
            found = [i for i in answer.get("items") or [] if keep is None or keep(i)]
            items += [trim(item) for item in found] if trim is not None else found
            token = meta.get("continue")
            if not token:
                break
        return items, int(rv) if isinstance(rv, str) and rv.isdigit() else None

    def watch_kind(
        self,
        kind: str,
        namespace: str | None,
        resource_version: str | None,
        timeout_seconds: int = 300,
        idle_seconds: float | None = None,
    ) -> Iterator[WatchEvent]:
        """WATCH a kind `list_kind` reads from `resource_version` (bookmarks asked for),
        until the server ends it (`timeout_seconds`) or nothing arrives for `idle_seconds`;
        yields (type, plain object). Raises KubeError (410 Gone: list again)."""
        path, selector = _collection(kind, namespace)
        query = {
            "labelSelector": selector,
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
            "allowWatchBookmarks": "true",
        }
        return kube_watch.stream(self, f"watch {kind}", path, query, idle_seconds)

    # --- ResilientTrainingJobs -------------------------------------------------------------

    def get_rtj(self, namespace: str, name: str) -> dict[str, Any]:
        path = api_path(*RTJ, "namespaces", namespace, keys.PLURAL, name)
        return self.request(f"get rtj {namespace}/{name}", "GET", path)

    def list_rtjs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        scope = ("namespaces", namespace) if namespace else ()
        path = api_path(*RTJ, *scope, keys.PLURAL)
        return list(self.request("list rtjs", "GET", path).get("items", []))

    def create_rtj(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        path = api_path(*RTJ, "namespaces", namespace, keys.PLURAL)
        return self.request(f"create rtj in {namespace}", "POST", path, dict(body))

    def delete_rtj(
        self, namespace: str, name: str, uid: str | None = None, propagation: str | None = None
    ) -> None:
        """Delete a job; with `uid`, only that object (a job re-created under the same name
        answers Conflict, as DeleteOptions preconditions do); `propagation`: Foreground,
        Background or Orphan (None: the API server's default)."""
        path = api_path(*RTJ, "namespaces", namespace, keys.PLURAL, name)
        body: dict[str, Any] | None = None
        if uid or propagation:
            body = {"apiVersion": "v1", "kind": "DeleteOptions"}
            if uid:
                body["preconditions"] = {"uid": uid}
            if propagation:
                body["propagationPolicy"] = propagation
        self.request(f"delete rtj {namespace}/{name}", "DELETE", path, body)

    def patch_rtj_status(
        self, namespace: str, name: str, status: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        """Write `status` through the status subresource (merge patch).

        With `resource_version` the patch is conditional: a stale decision gets `Conflict`.
        """
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        path = api_path(*RTJ, "namespaces", namespace, keys.PLURAL, name, "status")
        return self.request(
            f"patch status of rtj {namespace}/{name}",
            "PATCH",
            path,
            body,
            query={"fieldManager": FIELD_MANAGER},
            content_type=MERGE_PATCH,
        )

    # --- JobSets ---------------------------------------------------------------------------

    def create_jobset(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        name = body.get("metadata", {}).get("name", "?")
        path = api_path(*JOBSETS, "namespaces", namespace, JOBSET_PLURAL)
        return self.request(
            f"create jobset {namespace}/{name}",
            "POST",
            path,
            dict(body),
            # unknown or duplicate fields (a typo in spec.template) are refused with a 422
            # naming them, not dropped silently
            query={"fieldManager": FIELD_MANAGER, "fieldValidation": "Strict"},
        )

    def delete_jobset(self, namespace: str, name: str, propagation: str = "Background") -> bool:
        """Delete a JobSet; False: absent. Background propagation by default: the JobSet goes
        at once and the garbage collector deletes its Jobs and pods after it (the operator
        deletes the pods itself in the same pass and waits until they are gone)."""
        path = api_path(*JOBSETS, "namespaces", namespace, JOBSET_PLURAL, name)
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        try:
            self.request(f"delete jobset {namespace}/{name}", "DELETE", path, body)
        except NotFound:
            return False
        return True

    def list_jobsets(self, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        path = api_path(*JOBSETS, "namespaces", namespace, JOBSET_PLURAL)
        answer = self.request(
            f"list jobsets in {namespace}", "GET", path, query={"labelSelector": selector}
        )
        return list(answer.get("items", []))

    # --- pods ------------------------------------------------------------------------------

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> bool:
        path = api_path("api", "v1", "namespaces", namespace, "pods", name)
        try:
            self.request(
                f"delete pod {namespace}/{name}",
                "DELETE",
                path,
                query={"gracePeriodSeconds": grace_seconds},
            )
        except NotFound:
            return False
        return True

    def list_pods(self, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        path = api_path("api", "v1", "namespaces", namespace, "pods")
        answer = self.request(
            f"list pods in {namespace}", "GET", path, query={"labelSelector": selector}
        )
        return list(answer.get("items", []))

    # --- nodes -----------------------------------------------------------------------------

    def get_node(self, name: str) -> dict[str, Any]:
        return self.request(f"get node {name}", "GET", api_path("api", "v1", "nodes", name))

    def _read_modify_patch(
        self, what: str, path: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> bool:
        """GET `path`, let `change` compute a merge patch from the object (None: nothing to
        do), PATCH it under the object's resourceVersion; retried on 409. False: nothing
        changed, or the object does not exist."""
        for _ in range(_RETRIES):
            try:
                current = self.request(f"get {what}", "GET", path)
            except NotFound:
                return False
            body = change(current)
            if body is None:
                return False
            body.setdefault("metadata", {})["resourceVersion"] = current["metadata"][
                "resourceVersion"
            ]
            try:
                self.request(
                    f"patch {what}",
                    "PATCH",
                    path,
                    body,
                    query={"fieldManager": FIELD_MANAGER},
                    content_type=MERGE_PATCH,
                )
                return True
            except Conflict:
                continue
            except NotFound:
                return False
        raise Conflict(f"{what} kept changing during {_RETRIES} updates", 409)

    def edit_node(
        self,
        node: str,
        edit: Callable[[Sequence[Mapping[str, Any]], str | None], NodeChange | None],
        annotation: str,
    ) -> bool:
        """Read-modify-write the node's taints and one annotation under its resourceVersion;
        False: no change.

        `edit` gets the taints and the annotation's value and returns the new taints and
        value (None: remove the annotation), or None when nothing needs to change. A node
        that does not exist is left alone (False): there is nothing to quarantine.
        """

        def change(current: dict[str, Any]) -> dict[str, Any] | None:
            taints = (current.get("spec") or {}).get("taints") or []
            annotations = (current.get("metadata") or {}).get("annotations") or {}
            edited = edit(taints, annotations.get(annotation))
            if edited is None:
                return None
            return {
                "metadata": {"annotations": {annotation: edited.annotation}},
                "spec": {"taints": [dict(x) for x in edited.taints]},
            }

        return self._read_modify_patch(f"node {node}", api_path("api", "v1", "nodes", node), change)

    def set_rtj_finalizer(
        self, namespace: str, name: str, uid: str, finalizer: str, present: bool
    ) -> bool:
        """Add or remove one finalizer of the job `uid` (read-modify-write under its
        resourceVersion); False: nothing to change, or the job is gone or another one."""

        def change(current: dict[str, Any]) -> dict[str, Any] | None:
            meta = current.get("metadata") or {}
            finalizers = list(meta.get("finalizers") or [])
            if (uid and meta.get("uid") != uid) or (finalizer in finalizers) == present:
                return None
            kept = [f for f in finalizers if f != finalizer]
            return {"metadata": {"finalizers": [*kept, finalizer] if present else kept}}

        path = api_path(*RTJ, "namespaces", namespace, keys.PLURAL, name)
        return self._read_modify_patch(f"rtj {namespace}/{name}", path, change)

    # --- secrets ---------------------------------------------------------------------------

    def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        raw = self.request(
            f"get secret {namespace}/{name}",
            "GET",
            api_path("api", "v1", "namespaces", namespace, "secrets", name),
        )
        data = raw.get("data") or {}
        return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in data.items()}

    def create_secret(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a Secret (AlreadyExists when one of its name is there)."""
        name = body.get("metadata", {}).get("name", "?")
        path = api_path("api", "v1", "namespaces", namespace, "secrets")
        return self.request(f"create secret {namespace}/{name}", "POST", path, dict(body),
                            query={"fieldManager": FIELD_MANAGER})  # fmt: skip

    # --- events ----------------------------------------------------------------------------

    def post_event(
        self,
        involved: Mapping[str, Any],
        type_: str,
        reason: str,
        message: str,
        *,
        instance: str = "",
    ) -> None:
        """A core/v1 Event about `involved` (apiVersion, kind, name, namespace, uid)."""
        body = event_body(involved, type_, reason, message, instance=instance)
        namespace = body["metadata"]["namespace"]
        path = api_path("api", "v1", "namespaces", namespace, "events")
        self.request(f"post event {reason} on {involved.get('name')}", "POST", path, body)

    def list_events(
        self, namespace: str | None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Events matching `field_selector`, read in pages of EVENT_PAGE (a busy cluster
        holds far more Events than one answer should carry)."""
        scope = ("namespaces", namespace) if namespace else ()
        path = api_path("api", "v1", *scope, "events")
        items: list[dict[str, Any]] = []
        query: dict[str, Any] = {"fieldSelector": field_selector, "limit": EVENT_PAGE}
        for _ in range(MAX_EVENT_PAGES):
            answer = self.request(f"list events in {namespace}", "GET", path, query=query)
            items += answer.get("items", [])
            more = (answer.get("metadata") or {}).get("continue")
            if not more:
                return items
            query = {**query, "continue": more}
        return items  # bounded: the newest pages a classification needs are long read

    # --- node leases (kube-node-lease): when each kubelet last renewed -------------------

    def list_node_leases(self) -> tuple[list[dict[str, Any]], str | None]:
        """Every node Lease and the list's resourceVersion."""
        items, rv = self.list_kind("leases", NODE_LEASE_NAMESPACE)
        return items, None if rv is None else str(rv)

    def watch_node_leases(
        self,
        resource_version: str | None,
        timeout_seconds: int = 300,
        idle_seconds: float | None = None,
    ) -> Iterator[WatchEvent]:
        """Watch node Leases from `resource_version` (see `watch_kind`)."""
        return self.watch_kind(
            "leases", NODE_LEASE_NAMESPACE, resource_version, timeout_seconds, idle_seconds
        )

    # --- leases (leader election) ----------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request(
                f"get lease {namespace}/{name}",
                "GET",
                api_path(*LEASES, "namespaces", namespace, "leases", name),
            )
        except NotFound:
            return None

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request(
            f"create lease in {namespace}",
            "POST",
            api_path(*LEASES, "namespaces", namespace, "leases"),
            dict(body),
        )

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Conditional on body.metadata.resourceVersion (Conflict when someone else wrote)."""
        return self.request(
            f"update lease {namespace}/{name}",
            "PUT",
            api_path(*LEASES, "namespaces", namespace, "leases", name),
            dict(body),
        )
