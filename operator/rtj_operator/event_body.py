"""The core/v1 Event the operator posts about an object: a plain function over plain data
(`kube.post_event` sends it)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

COMPONENT = "rtj-operator"


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(
    involved: Mapping[str, Any], type_: str, reason: str, message: str, *, instance: str = ""
) -> dict[str, Any]:
    """An Event about `involved` (apiVersion, kind, name, namespace, uid), stored in its
    namespace (`default` for a cluster-scoped object such as a Node, as client-go does)."""
    namespace = involved.get("namespace") or "default"
    stamp = now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved.get('name', 'rtj')}.", "namespace": namespace},
        "involvedObject": dict(involved),
        "type": type_,
        "reason": reason,
        "message": message,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance or COMPONENT,
    }
