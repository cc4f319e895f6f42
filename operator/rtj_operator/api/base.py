"""The base every API model shares: camelCase on the wire, frozen in memory."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; the message is what `kubectl apply` shows."""
    entry = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """`json_schema_extra` carrying CEL rules into the generated CRD."""
    return {"x-kubernetes-validations": list(rules)}


class ApiModel(BaseModel):
    """Spec and status objects: immutable values, camelCase JSON, unknown fields refused."""

    model_config = ConfigDict(
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
    )

    def to_json(self) -> dict[str, Any]:
        """The object as the API server stores it (camelCase, unset optionals omitted)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
