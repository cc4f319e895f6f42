"""What the watch caches keep of each object: the part the classifier and the planner read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rtj_operator.api import keys
from rtj_operator.reconcile.world import Json, get_in


def plain(obj: Any) -> Any:
    """A deep copy as plain dicts and lists (watch bodies may be read-only mapping views)."""
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


_KEPT_METADATA = (
    "name", "namespace", "uid", "labels", "annotations",
    "deletionTimestamp", "creationTimestamp", "resourceVersion",
)  # fmt: skip


def _trim_meta(meta: Json, *extra: str) -> dict[str, Any]:
    kept = {k: plain(meta[k]) for k in (*_KEPT_METADATA, *extra) if k in meta}
    controller = [
        {k: ref.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
        for ref in meta.get("ownerReferences") or []
        if isinstance(ref, Mapping) and ref.get("controller") is True
    ]
    if controller:  # who controls it: the trust and identity checks read only this
        kept["ownerReferences"] = controller
    return kept


_KEPT_POD_SPEC = ("nodeName", "hostname", "subdomain")


def trim_pod(body: Json) -> dict[str, Any]:
    """The part of a pod the classifier and the planner read (indexes keep only this)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    # the node, and the pod's stable DNS name (a spare given rank 0 is the new rendezvous host)
    kept: dict[str, Any] = {k: spec[k] for k in _KEPT_POD_SPEC if isinstance(spec.get(k), str)}
    sidecar = _progress_sidecar(spec)
    if sidecar is not None:
        kept["initContainers"] = [sidecar]
    return {
        "metadata": _trim_meta(meta, "deletionGracePeriodSeconds"),
        "spec": kept,
        "status": plain(body.get("status") or {}),
    }


def _progress_sidecar(spec: Json) -> dict[str, Any] | None:
    """The operator's progress sidecar as the pod has it (its name and ports): the port the
    poller reads is the one this pod was created with, whatever the spec says now."""
    for container in spec.get("initContainers") or []:
        if isinstance(container, dict) and container.get("name") == keys.PROGRESS_SIDECAR:
            kept: dict[str, Any] = {"name": keys.PROGRESS_SIDECAR,
                                    "ports": plain(container.get("ports") or [])}  # fmt: skip
            sealed = [e for e in container.get("env") or [] if isinstance(e, dict)
                      and e.get("name") == keys.ENV_SEALED_ANSWERS]  # fmt: skip
            if sealed:  # whether its answers must carry its seal
                kept["env"] = plain(sealed[:1])
            return kept
    return None


def trim_jobset(body: Json) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {
        "metadata": _trim_meta(meta),
        "spec": {"suspend": get_in(body, "spec", "suspend")},
        "status": {"conditions": plain(get_in(body, "status", "conditions") or [])},
    }


def trim_node(body: Json) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    kept = {k: plain(meta[k]) for k in ("name", "uid", "labels", "resourceVersion") if k in meta}
    claims = (meta.get("annotations") or {}).get(keys.QUARANTINE_OWNERS_ANNOTATION)
    if claims is not None:  # who holds our taints (the only annotation read)
        kept["annotations"] = {keys.QUARANTINE_OWNERS_ANNOTATION: claims}
    return {
        "metadata": kept,
        "spec": {"taints": plain(get_in(body, "spec", "taints") or [])},
        "status": {"conditions": plain(get_in(body, "status", "conditions") or [])},
    }


def trim_event(body: Json) -> dict[str, Any]:
    keep = (
        "involvedObject",
        "regarding",
        "reason",
        "message",
        "note",
        "eventTime",
        "firstTimestamp",
        "lastTimestamp",
        "type",
        "source",  # who wrote it: a Node event counts only from the node's own reporters
        "reportingController",
        "reportingComponent",
    )
    out = {k: plain(body[k]) for k in keep if k in body}
    meta = body.get("metadata") or {}
    keep_meta = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
    out["metadata"] = {k: meta[k] for k in keep_meta if k in meta}
    return out
