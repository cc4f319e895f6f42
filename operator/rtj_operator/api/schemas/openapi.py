"""Kubernetes OpenAPI v3 definitions -> structural CRD schemas (what controller-gen emits).

The Kubernetes document describes built-in types for clients; a CRD schema must be
*structural* and may only use the keywords `apiextensions.k8s.io/v1` knows. For an embedded
type controller-gen (JobSet's and Kueue's CRDs) renders:

- every `$ref` / `allOf: [{$ref}]` inlined; a field's own description wins over its type's;
- `IntOrString` and `resource.Quantity` (`oneOf` integer|string, no type) as
  `anyOf: [integer, string]` + `x-kubernetes-int-or-string: true`; a Quantity also gets
  controller-gen's quantity `pattern`, so `cpu: lots` is refused on apply;
- an embedded `ObjectMeta` as an object of `labels`, `annotations`, `name`, `namespace` and
  `finalizers`, with their descriptions but no list semantics (what
  `crd:generateEmbeddedObjectMeta` emits: everything else of it is server-set or meaningless
  in a template);
- `x-kubernetes-list-type`, `-list-map-keys` and `-map-type` kept (the API server merges
  and checks uniqueness of list maps by them); the strategic-merge-patch hints
  (`x-kubernetes-patch-strategy`, `-patch-merge-key`) and `x-kubernetes-unions` dropped (a
  CRD schema has no field for them);
- `default` only where the Go type declares one with a `+default` marker: on an optional
  field, not `{}`. openapi-gen also writes the zero value of every required or
  non-pointer field (`containerPort: 0`, `resources: {}`); those are dropped, or the API
  server would add `{}`s to every stored template. (A list-map key must be required or
  defaulted: `ports[].protocol` keeps its `TCP`.)

Anything else (a keyword a newer Kubernetes adds) is an error here, not a silent drop.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rtj_operator.api import schemas

INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
EMBEDDED_META_FIELDS = ("annotations", "finalizers", "labels", "name", "namespace")
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""controller-gen's pattern for a `resource.Quantity` (sigs.k8s.io/controller-tools
pkg/crd/known_types.go), the grammar `resource.ParseQuantity` accepts."""

_KEPT = (
    "description", "type", "format", "properties", "required", "items", "additionalProperties",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
)  # fmt: skip
_DROPPED = {"x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key", "x-kubernetes-unions"}
_FORMATS = {"int32", "int64", "double", "float", "byte", "date-time"}


def _deref(node: dict[str, Any], defs: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(the referenced definition's name or None, the node with the definition inlined)."""
    name: str | None = None
    chain: tuple[str, ...] = ()
    while "allOf" in node or "$ref" in node:
        node = dict(node)
        if "allOf" in node:
            (only,) = node.pop("allOf")  # openapi-gen wraps a $ref with siblings in a 1-item allOf
            node = {**only, **node}
        if "$ref" in node:
            name = node.pop("$ref").rsplit("/", 1)[-1]
            chain = (*chain, name)
            if len(chain) > 8:
                raise ValueError(f"$ref chain too long: {' -> '.join(chain)}")
            node = {**defs[name], **node}  # the field's own description and default win
    return name, node


def _plain(node: dict[str, Any]) -> dict[str, Any]:
    """An embedded ObjectMeta field as controller-gen writes it: no list or map semantics (the
    same as the pinned JobSet's template, so the RTJ refuses nothing its JobSet accepts)."""
    return {k: v for k, v in node.items() if not k.startswith("x-kubernetes-")}


def _int_or_string(description: str | None, pattern: str | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {} if description is None else {"description": description}
    node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if pattern is not None:
        node["pattern"] = pattern
    node["x-kubernetes-int-or-string"] = True
    return node


def _convert(
    raw: dict[str, Any],
    defs: dict[str, Any],
    path: str,
    *,
    optional_field: bool,
    seen: tuple[str, ...],
) -> dict[str, Any]:
    name, node = _deref(raw, defs)
    if name is not None and name in seen:
        raise ValueError(f"{path}: recursive type {name} cannot be inlined")
    inner = (*seen, name) if name is not None else seen
    description = node.get("description")
    if name == INT_OR_STRING:
        return _int_or_string(description)
    if name == QUANTITY:
        return _int_or_string(description, QUANTITY_PATTERN)
    if name == OBJECT_META:
        node = {
            **node,
            "properties": {k: _plain(node["properties"][k]) for k in EMBEDDED_META_FIELDS},
            "description": f"{description}\n\nIn a template: labels, annotations, name, "
            "namespace and finalizers; other fields are refused (strict field validation, as "
            "kubectl uses) or dropped.",
        }
    unknown = set(node) - set(_KEPT) - _DROPPED - {"default"}
    if unknown:
        raise ValueError(f"{path}: keywords a CRD schema cannot carry: {sorted(unknown)}")
    if "type" not in node:
        raise ValueError(f"{path}: untyped node")
    if "format" in node and node["format"] not in _FORMATS:
        raise ValueError(f"{path}: format {node['format']!r} unknown to CRD schemas")
    out: dict[str, Any] = {k: node[k] for k in _KEPT if k in node}
    default = node.get("default")
    if optional_field and default is not None and default != {}:
        out["default"] = default
    required = set(node.get("required", ()))
    if "properties" in node:
        out["properties"] = {
            key: _convert(
                child, defs, f"{path}.{key}", optional_field=key not in required, seen=inner
            )
            for key, child in sorted(node["properties"].items())
        }
    if "items" in node:
        out["items"] = _convert(node["items"], defs, f"{path}[]", optional_field=False, seen=inner)
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(
            node["additionalProperties"], defs, f"{path}{{}}", optional_field=False, seen=inner
        )
    return out


def structural_schema(openapi: dict[str, Any], definition: str) -> dict[str, Any]:
    """One definition of a Kubernetes OpenAPI v3 document as a structural CRD schema."""
    defs: dict[str, Any] = openapi["components"]["schemas"]
    return _convert(
        {"$ref": f"#/components/schemas/{definition}"},
        defs,
        definition,
        optional_field=False,
        seen=(),
    )


def vendored_document(openapi_bytes: bytes) -> dict[str, Any]:
    """What `schemas.VENDORED` holds: the source (module, file, its SHA-256) and the schema."""
    openapi = json.loads(openapi_bytes)
    return {
        "source": {
            "module": schemas.MODULE,
            "file": schemas.OPENAPI_FILE,
            "sha256": hashlib.sha256(openapi_bytes).hexdigest(),
            "definition": schemas.POD_TEMPLATE_SPEC,
            "generator": "python -m rtj_operator.api.schemas",
        },
        "schema": structural_schema(openapi, schemas.POD_TEMPLATE_SPEC),
    }


def render(document: dict[str, Any]) -> str:
    """The vendored file's exact text (sorted keys: regenerating is byte-for-byte stable)."""
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def module_cache() -> Path:
    """`GOMODCACHE`: the environment's, else `go env`'s, else Go's default `~/go/pkg/mod`."""
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    go = shutil.which("go")
    if go is not None:
        out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip())
    return Path.home() / "go" / "pkg" / "mod"


def default_openapi_path() -> Path:
    """The document in the Go module cache (there after `make cluster-build`)."""
    return module_cache() / schemas.MODULE / schemas.OPENAPI_FILE


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rtj_operator.api.schemas",
        description=f"Regenerate {schemas.VENDORED.name} from {schemas.MODULE}'s "
        f"{schemas.OPENAPI_FILE}.",
    )
    parser.add_argument(
        "--from-openapi", type=Path, default=None, metavar="PATH",
        help="the OpenAPI v3 document (default: the Go module cache's, after make cluster-build)",
    )  # fmt: skip
    parser.add_argument("--check", action="store_true", help="exit 1 if the vendored file differs")
    args = parser.parse_args(argv)
    source: Path = args.from_openapi or default_openapi_path()
    if not source.is_file():
        print(
            f"{source}: not found (run `make cluster-build`, or pass --from-openapi)",
            file=sys.stderr,
        )
        return 2
    text = render(vendored_document(source.read_bytes()))
    current = schemas.VENDORED.read_text(encoding="utf-8") if schemas.VENDORED.exists() else ""
    if args.check:
        if text != current:
            print(
                f"{schemas.VENDORED} is stale: run python -m rtj_operator.api.schemas",
                file=sys.stderr,
            )
            return 1
        return 0
    if text != current:
        schemas.VENDORED.write_text(text, encoding="utf-8")
        print(f"wrote {schemas.VENDORED} ({len(text)} bytes) from {source}")
    return 0
