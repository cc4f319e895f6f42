"""Schemas of Kubernetes types, vendored from the pinned Kubernetes release's OpenAPI document.

`spec.template` of a ResilientTrainingJob is a `PodTemplateSpec`. Its schema is not written
here by hand: `python -m rtj_operator.api.schemas` converts the definition in the OpenAPI v3
document the Kubernetes module ships (`k8s.io/kubernetes@<version>`, file
`api/openapi-spec/v3/api__v1_openapi.json`) into a structural CRD schema, the way
controller-gen renders an embedded PodTemplateSpec (JobSet's and Kueue's CRDs), and writes it
next to this file. `make crds` reads only the vendored file: no network, no Go module cache.

The version is the cluster harness's (`KUBERNETES` in e2e/versions.env; a unit test keeps
them equal): bump both, then regenerate.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

KUBERNETES_VERSION = "v1.35.4"
MODULE = f"k8s.io/kubernetes@{KUBERNETES_VERSION}"
OPENAPI_FILE = "api/openapi-spec/v3/api__v1_openapi.json"
POD_TEMPLATE_SPEC = "io.k8s.api.core.v1.PodTemplateSpec"
VENDORED = Path(__file__).with_name(f"podtemplatespec-{KUBERNETES_VERSION}.json")


@cache
def _vendored_text() -> str:
    return VENDORED.read_text(encoding="utf-8")


def vendored_document() -> dict[str, Any]:
    """The vendored file: where it came from (`source`) and the structural `schema`."""
    document: dict[str, Any] = json.loads(_vendored_text())
    return document


def pod_template_spec_schema() -> dict[str, Any]:
    """The structural schema of Kubernetes `KUBERNETES_VERSION`'s PodTemplateSpec (a fresh copy)."""
    schema: dict[str, Any] = vendored_document()["schema"]
    return schema
