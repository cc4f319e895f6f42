"""Editing a job's spec on the real kube-apiserver as a user would, and expecting the CRD's
rules to refuse it (shared by the cluster tests of the lifecycle and the API conventions)."""

from __future__ import annotations

from typing import Any

import pytest

from rtj_operator.api import keys
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import Invalid


def patch_spec(kube: Kube, ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """`kubectl patch rtj <name> --type merge -p '{"spec": ...}'`."""
    path = f"/apis/{keys.API_VERSION}/namespaces/{ns}/{keys.PLURAL}/{name}"
    return kube.request(
        "patch rtj", "PATCH", path, {"spec": spec}, content_type="application/merge-patch+json"
    )


def refused(kube: Kube, ns: str, name: str, spec: dict[str, Any], field: str) -> str:
    """The API server's refusal of the patch, which names `spec.<field>`."""
    with pytest.raises(Invalid) as err:
        patch_spec(kube, ns, name, spec)
    message = str(err.value)
    assert f"spec.{field}" in message, message
    return message
