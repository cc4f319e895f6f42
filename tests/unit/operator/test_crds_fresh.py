"""The committed CRD is exactly what the models generate, and the API server would accept it."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.versions import load_versions
from rtj_operator import crdgen
from rtj_operator.api import schemas
from rtj_operator.api.schemas import openapi
from rtj_operator.cli import main

REPO = Path(__file__).resolve().parents[3]


def test_committed_crd_matches_the_models() -> None:
    committed = (REPO / crdgen.CRD_PATH).read_text(encoding="utf-8")
    assert committed == crdgen.render_crd_yaml(), "crds/ is stale: run `make crds`"


def test_crd_schema_is_structural() -> None:
    schema = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert crdgen.structural_problems(schema) == []


def test_structural_check_catches_what_the_api_server_refuses() -> None:
    bad = {"type": "object", "properties": {"a": {"$ref": "#/x"}, "b": {"anyOf": []}}}
    problems = crdgen.structural_problems(bad)
    assert any("'$ref'" in p for p in problems)
    assert any("needs a type" in p for p in problems)


def test_crd_identity_and_columns() -> None:
    crd = yaml.safe_load(crdgen.render_crd_yaml())
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "resilienttrainingjobs.training.resilient.dev"
    assert spec["group"] == "training.resilient.dev"
    assert spec["names"]["shortNames"] == ["rtj"]
    assert spec["names"]["plural"] == "resilienttrainingjobs"
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "Phase", "Attempt", "Workers", "Step", "Steps/s", "Checkpoint", "Checkpoint Age", "Age",
        "Fast", "Fast Age", "Queue",
    ]  # fmt: skip
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1]
    assert wide == ["Fast", "Fast Age", "Queue"]


def _rules(node: object) -> list[dict[str, str]]:
    if isinstance(node, dict):
        found = list(node.get("x-kubernetes-validations", []))
        return found + [r for value in node.values() for r in _rules(value)]
    if isinstance(node, list):
        return [r for item in node for r in _rules(item)]
    return []


def test_cel_rules_carry_field_messages() -> None:
    rules = _rules(crdgen.crd())
    messages = {r["message"] for r in rules}
    assert "checkpoint.uri must start with s3:// or file://" in messages
    assert "backoff.initialSeconds must be <= backoff.maxSeconds" in messages
    assert any(m.startswith("metadata.name must be a DNS-1035 label") for m in messages)
    assert all(r["rule"] and r["message"] for r in rules)


def _template() -> dict[str, Any]:
    spec = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template: dict[str, Any] = spec["properties"]["template"]
    return template


def _walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_template_is_the_kubernetes_pod_template_spec() -> None:
    template = _template()
    assert template["type"] == "object"
    assert template["description"].startswith("Worker PodTemplateSpec")
    assert schemas.KUBERNETES_VERSION in template["description"]
    pod = template["properties"]["spec"]
    assert pod["required"] == ["containers"]
    containers = pod["properties"]["containers"]
    assert containers["x-kubernetes-list-type"] == "map"
    assert containers["x-kubernetes-list-map-keys"] == ["name"]
    container = containers["items"]["properties"]
    assert container["image"]["type"] == "string"
    assert container["image"]["description"].startswith("Container image name.")
    port = container["ports"]["items"]["properties"]
    assert port["containerPort"] == {**port["containerPort"], "type": "integer", "format": "int32"}
    assert port["protocol"]["default"] == "TCP", "a list-map key needs a default"
    assert container["resources"]["properties"]["limits"]["additionalProperties"][
        "x-kubernetes-int-or-string"
    ]
    assert set(template["properties"]["metadata"]["properties"]) == {
        "annotations", "finalizers", "labels", "name", "namespace"
    }  # fmt: skip
    # nothing free-form is left: every field is declared, so unknown ones are refused
    assert not [p for p, n in _walk(template) if "x-kubernetes-preserve-unknown-fields" in n]
    assert crdgen.structural_problems(template) == []


def test_template_keeps_the_at_least_one_container_rule() -> None:
    (rule,) = _template()["x-kubernetes-validations"]
    assert rule["message"] == "template.spec.containers must list at least one container"
    assert "size(self.spec.containers) > 0" in rule["rule"]


def test_template_defaults_are_only_the_kubernetes_markers() -> None:
    """No `{}` and no zero value of a required field: the API server would add them to every
    stored template (openapi-gen writes them; controller-gen does not)."""
    defaults = {p: n["default"] for p, n in _walk(_template()) if "default" in n}
    assert defaults[".spec.containers[].ports[].protocol"] == "TCP"
    assert ".spec.containers[].ports[].containerPort" not in defaults
    assert {} not in defaults.values()
    assert not [p for p in defaults if p.endswith("[]") or p.endswith("{}")]


def test_structural_check_knows_int_or_string_list_maps_and_defaults() -> None:
    ios = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
    assert crdgen.structural_problems({"type": "object", "properties": {"port": ios}}) == []
    typed_ios = {**ios, "type": "string"}
    assert any("int-or-string" in p for p in crdgen.structural_problems(typed_ios))
    assert any("'anyOf'" in p for p in crdgen.structural_problems({"anyOf": [], "type": "string"}))

    def ports(protocol: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
            "items": {
                "type": "object",
                "required": ["containerPort"],
                "properties": {"containerPort": {"type": "integer"}, "protocol": protocol},
            },
        }

    assert crdgen.structural_problems(ports({"type": "string", "default": "TCP"})) == []
    problems = crdgen.structural_problems(ports({"type": "string"}))
    assert any("'protocol' must be a required or defaulted" in p for p in problems)
    assert any("list-type" in p for p in crdgen.structural_problems(
        {"type": "string", "x-kubernetes-list-type": "map"}
    ))  # fmt: skip
    assert any("default 'x'" in p for p in crdgen.structural_problems(
        {"type": "integer", "default": "x"}
    ))  # fmt: skip


# --- the vendored schema and its generator ----------------------------------------------------


def test_vendored_schema_is_the_pinned_kubernetes_release() -> None:
    pinned = load_versions()["KUBERNETES"]
    assert pinned == schemas.KUBERNETES_VERSION, (
        "e2e/versions.env moved: regenerate the vendored PodTemplateSpec "
        "(make cluster-build; python -m rtj_operator.api.schemas) and bump KUBERNETES_VERSION"
    )
    source = schemas.vendored_document()["source"]
    assert source["module"] == f"k8s.io/kubernetes@{pinned}"
    assert source["file"] == "api/openapi-spec/v3/api__v1_openapi.json"
    assert source["definition"] == "io.k8s.api.core.v1.PodTemplateSpec"
    assert len(source["sha256"]) == 64
    text = schemas.VENDORED.read_text(encoding="utf-8")
    assert openapi.render(schemas.vendored_document()) == text, "hand-edited: regenerate it"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


MINI_OPENAPI: dict[str, Any] = {
    "components": {
        "schemas": {
            "T": {
                "type": "object",
                "description": "the type's own words",
                "required": ["port"],
                "properties": {
                    "metadata": {"allOf": [_ref(openapi.OBJECT_META)], "default": {},
                                 "description": "meta"},
                    "port": {"allOf": [_ref(openapi.INT_OR_STRING)], "description": "a port"},
                    "size": {"allOf": [_ref(openapi.QUANTITY)]},
                    "items": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "x-kubernetes-patch-strategy": "merge",
                        "x-kubernetes-patch-merge-key": "name",
                        "items": {"allOf": [_ref("Item")], "default": {}},
                    },
                    "child": {"allOf": [_ref("Item")], "description": "field words win"},
                    "nested": {"allOf": [_ref("Item")], "default": {}},
                },
            },
            "Item": {
                "type": "object",
                "description": "an item",
                "required": ["name"],
                "x-kubernetes-unions": [{"discriminator": "mode"}],
                "properties": {
                    "name": {"type": "string", "default": ""},
                    "mode": {"type": "string", "default": "Fast"},
                    "off": {"type": "boolean", "default": False},
                    "count": {"type": "integer", "format": "int32", "default": 0},
                    "tags": {"type": "array", "items": {"type": "string", "default": ""}},
                },
            },
            openapi.INT_OR_STRING: {"format": "int-or-string", "description": "int or string",
                                    "oneOf": [{"type": "integer"}, {"type": "string"}]},
            openapi.QUANTITY: {"description": "a quantity",
                               "oneOf": [{"type": "string"}, {"type": "number"}]},
            openapi.OBJECT_META: {
                "type": "object",
                "description": "ObjectMeta",
                "properties": {
                    k: {"type": "string", "description": k}
                    for k in ("name", "namespace", "generateName", "uid", "resourceVersion")
                } | {
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                    "finalizers": {"type": "array", "items": {"type": "string"}},
                },
            },
        }
    }
}  # fmt: skip


def test_openapi_conversion_is_what_controller_gen_emits() -> None:
    out = openapi.structural_schema(MINI_OPENAPI, "T")
    assert crdgen.structural_problems(out) == []
    props = out["properties"]
    assert out["description"] == "the type's own words" and out["required"] == ["port"]
    assert props["port"] == {
        "description": "a port",
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
    }
    assert props["size"]["pattern"] == openapi.QUANTITY_PATTERN
    assert props["size"]["description"] == "a quantity", "the type's words when the field has none"
    assert set(props["metadata"]["properties"]) == {
        "annotations", "finalizers", "labels", "name", "namespace"
    }  # fmt: skip
    assert props["metadata"]["description"].startswith("meta")
    assert "default" not in props["metadata"], "{} is never a default"
    lst = props["items"]
    assert "x-kubernetes-patch-strategy" not in lst and "x-kubernetes-patch-merge-key" not in lst
    assert lst["x-kubernetes-list-map-keys"] == ["name"]
    item = lst["items"]
    assert "default" not in item and "x-kubernetes-unions" not in item
    assert item["description"] == "an item"
    assert "default" not in item["properties"]["name"], "required: its zero value is no default"
    assert item["properties"]["mode"]["default"] == "Fast"
    assert item["properties"]["off"]["default"] is False
    assert item["properties"]["count"]["default"] == 0, "optional: a declared default"
    assert "default" not in item["properties"]["tags"]["items"]
    assert props["child"]["description"] == "field words win"


def test_openapi_conversion_refuses_what_it_cannot_express() -> None:
    doc = copy.deepcopy(MINI_OPENAPI)
    doc["components"]["schemas"]["Item"]["properties"]["odd"] = {"type": "string", "enum": ["a"]}
    with pytest.raises(ValueError, match=r"T\.child\.odd: keywords .*'enum'"):
        openapi.structural_schema(doc, "T")
    loop = copy.deepcopy(MINI_OPENAPI)
    loop["components"]["schemas"]["Item"]["properties"]["again"] = _ref("Item")
    with pytest.raises(ValueError, match="recursive type Item"):
        openapi.structural_schema(loop, "T")


def test_schemas_cli_regenerates_and_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "api__v1_openapi.json"
    doc = copy.deepcopy(MINI_OPENAPI)
    doc["components"]["schemas"][schemas.POD_TEMPLATE_SPEC] = _ref("T")
    source.write_text(json.dumps(doc), encoding="utf-8")
    target = tmp_path / "vendored.json"
    monkeypatch.setattr(schemas, "VENDORED", target)
    assert openapi.main(["--from-openapi", str(tmp_path / "missing.json")]) == 2
    assert openapi.main(["--check", "--from-openapi", str(source)]) == 1
    assert openapi.main(["--from-openapi", str(source)]) == 0
    assert openapi.main(["--check", "--from-openapi", str(source)]) == 0
    written = json.loads(target.read_text(encoding="utf-8"))
    assert written["source"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert written["schema"]["properties"]["port"]["x-kubernetes-int-or-string"] is True


def test_cli_check_reports_stale_and_write_fixes(tmp_path: Path) -> None:
    target = tmp_path / "crds" / "rtj.yaml"
    assert main(["crds", "--check", "--path", str(target)]) == 1
    assert main(["crds", "--write", "--path", str(target)]) == 0
    assert main(["crds", "--check", "--path", str(target)]) == 0
    target.write_text(target.read_text() + "# edited\n")
    assert main(["crds", "--check", "--path", str(target)]) == 1
