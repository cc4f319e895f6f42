"""Thin helpers over the Kubernetes Python client used by the harness and the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.rest import ApiException

T = TypeVar("T")
Obj = dict[str, Any]

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"  # storage version of Kueue v0.17; v1beta1 is served via conversion
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"


def api_client(kubeconfig: Path | str) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig))


class Kube:
    """The typed APIs the harness needs, bound to one kubeconfig."""

    def __init__(self, kubeconfig: Path | str) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.api = api_client(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.ext = client.ApiextensionsV1Api(self.api)
        self.adm = client.AdmissionregistrationV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.policy = client.PolicyV1Api(self.api)

    def close(self) -> None:
        self.api.close()

    # --- generic create-or-replace ------------------------------------------------------
    def apply(self, obj: Obj) -> None:
        """Create ``obj``, or replace it when it exists (kinds the harness installs)."""
        kind = obj["kind"]
        if kind not in _APPLY:
            raise ValueError(f"apply: unsupported kind {kind}")
        api_name, suffix, namespaced = _APPLY[kind]
        api = getattr(self, api_name)
        name = obj["metadata"]["name"]
        ns_args = (obj["metadata"]["namespace"],) if namespaced else ()
        try:
            getattr(api, f"create_{suffix}")(*ns_args, obj)
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = getattr(api, f"read_{suffix}")(name, *ns_args)
            getattr(api, f"replace_{suffix}")(
                name, *ns_args, _with_rv(obj, current.metadata.resource_version)
            )

    # --- Kueue and JobSet custom objects ----------------------------------------------
    def kueue_create(self, plural: str, obj: Obj, namespace: str | None = None) -> Obj:
        if namespace:
            return self.custom.create_namespaced_custom_object(  # type: ignore[no-any-return]
                KUEUE_GROUP, KUEUE_VERSION, namespace, plural, obj
            )
        return self.custom.create_cluster_custom_object(  # type: ignore[no-any-return]
            KUEUE_GROUP, KUEUE_VERSION, plural, obj
        )

    def kueue_get(
        self, plural: str, name: str, namespace: str | None = None, version: str = KUEUE_VERSION
    ) -> Obj:
        if namespace:
            return self.custom.get_namespaced_custom_object(  # type: ignore[no-any-return]
                KUEUE_GROUP, version, namespace, plural, name
            )
        return self.custom.get_cluster_custom_object(  # type: ignore[no-any-return]
            KUEUE_GROUP, version, plural, name
        )

    def kueue_list(self, plural: str, namespace: str) -> list[Obj]:
        out = self.custom.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, namespace, plural
        )
        return list(out.get("items", []))

    def jobset_create(self, obj: Obj, namespace: str) -> Obj:
        return self.custom.create_namespaced_custom_object(  # type: ignore[no-any-return]
            JOBSET_GROUP, JOBSET_VERSION, namespace, "jobsets", obj
        )

    def jobset_get(self, name: str, namespace: str) -> Obj:
        return self.custom.get_namespaced_custom_object(  # type: ignore[no-any-return]
            JOBSET_GROUP, JOBSET_VERSION, namespace, "jobsets", name
        )


_APPLY: dict[str, tuple[str, str, bool]] = {
    "CustomResourceDefinition": ("ext", "custom_resource_definition", False),
    "MutatingWebhookConfiguration": ("adm", "mutating_webhook_configuration", False),
    "ValidatingWebhookConfiguration": ("adm", "validating_webhook_configuration", False),
    "Namespace": ("core", "namespace", False),
    "Node": ("core", "node", False),
    "Secret": ("core", "namespaced_secret", True),
}


def _with_rv(obj: Obj, rv: str) -> Obj:
    out = dict(obj)
    out["metadata"] = dict(obj["metadata"], resourceVersion=rv)
    return out


def eventually(
    what: str, fn: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.25
) -> T:
    """Poll ``fn`` until it returns something truthy and return it; fail with ``what``."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = fn()
            if value:
                return value
        except ApiException as exc:
            last = exc
        if time.monotonic() > deadline:
            extra = f" (last API error: {last.status} {last.reason})" if last else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s: {what}{extra}")
        time.sleep(interval)


def not_found(exc: ApiException) -> bool:
    return exc.status == 404
