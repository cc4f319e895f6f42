"""Every field of the CRD's spec and status has a description (issue 44): `kubectl explain
rtj.status.attempts` and the API reference read them; 68 were empty."""

from __future__ import annotations

from typing import Any

from rtj_operator import crdgen


def _undescribed(node: dict[str, Any], path: str) -> list[str]:
    found: list[str] = []
    for name, field in (node.get("properties") or {}).items():
        where = f"{path}.{name}"
        if not field.get("description"):
            found.append(where)
        found += _undescribed(field, where)
    if isinstance(node.get("items"), dict):
        found += _undescribed(node["items"], f"{path}[]")
    return found


def test_every_spec_and_status_field_is_described() -> None:
    version = crdgen.crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    assert _undescribed(schema["spec"], "spec") + _undescribed(schema["status"], "status") == []
