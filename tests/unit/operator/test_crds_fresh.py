"""The committed CRD is exactly what the models generate, and the API server would accept it."""

from __future__ import annotations

from pathlib import Path

import yaml

from rtj_operator import crdgen
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
    assert columns == ["Phase", "Attempt", "Step", "Steps/s", "Checkpoint", "Checkpoint Age", "Age"]


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


def test_template_preserves_unknown_fields_under_an_object() -> None:
    spec = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = spec["properties"]["template"]
    assert template["type"] == "object"
    assert template["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["properties"]["replicas"]["minimum"] == 1


def test_cli_check_reports_stale_and_write_fixes(tmp_path: Path) -> None:
    target = tmp_path / "crds" / "rtj.yaml"
    assert main(["crds", "--check", "--path", str(target)]) == 1
    assert main(["crds", "--write", "--path", str(target)]) == 0
    assert main(["crds", "--check", "--path", str(target)]) == 0
    target.write_text(target.read_text() + "# edited\n")
    assert main(["crds", "--check", "--path", str(target)]) == 1
