"""Where a job's pods get the job's control key (issue 42, finding 8). Pure.

The key (`rtj_shim.wire.control.job_key`: derived from the operator's secret and the job's uid)
signs the operator's reads, orders, assignments and drain orders to the job's progress
sidecars, and their answers' seals. It is not written into the pod template: a template is
copied into the JobSet, its Jobs, its pods and Kueue's Workload, which anyone who may *view*
the namespace reads (the `view` role reads pods, never Secrets). The operator keeps it in a
Secret of the job's namespace, one per job incarnation (named by the uid, so a job deleted
and created again under its name never finds its predecessor's key), owned by the job (the
garbage collector deletes it with the job), and the sidecar's ``RTJ_CONTROL_KEY`` refers to
it (`secretKeyRef`): the kubelet resolves it when it starts the container.
"""

from __future__ import annotations

from typing import Any

from rtj_operator.api import keys

Obj = dict[str, Any]

KEY_SECRET_PREFIX = "rtj-control-"  # noqa: S105 (a name, not a secret)
KEY_SECRET_FIELD = "key"  # noqa: S105 (a name, not a secret)


def key_secret_name(uid: str) -> str:
    """The Secret holding the key of the job with `uid` (at most 12 + 36 characters)."""
    return f"{KEY_SECRET_PREFIX}{uid}"


def key_env(uid: str) -> Obj:
    """The sidecar's ``RTJ_CONTROL_KEY``, read from the job's key Secret."""
    ref = {"name": key_secret_name(uid), "key": KEY_SECRET_FIELD}
    return {"name": keys.ENV_CONTROL_KEY, "valueFrom": {"secretKeyRef": ref}}


def key_secret(name: str, uid: str, key: str, owner: Obj) -> Obj:
    """The job's key Secret: immutable, owned by the job (`owner`: its ownerReference)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": key_secret_name(uid),
            "labels": {keys.JOB_LABEL: name},
            "ownerReferences": [owner],
        },
        "type": "Opaque",
        "immutable": True,
        "stringData": {KEY_SECRET_FIELD: key},
    }
