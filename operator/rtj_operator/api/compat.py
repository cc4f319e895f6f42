"""Reading objects a newer version of the CRD may have written. Pure.

The API server validates every ResilientTrainingJob against the *installed* CRD schema, and
prunes fields that schema does not know. During an upgrade (the new CRD installed before
the new operator runs) or a downgrade, an object can carry fields this operator's models
do not know; refusing the whole object would make the operator drop the job (never
reconcile it, never restart it). So an object read from the API server keeps every field
this operator knows and sets the rest aside (`without_unknown` names them), while models
built in Python (tests, the CLI) stay strict (`extra="forbid"`).
"""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (X, X | None, list[X], ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in (Union, types.UnionType, list, tuple):
        return [m for arg in get_args(annotation) for m in _models_in(arg)]
    return []


def without_unknown(
    model: type[BaseModel], data: Any, path: str = ""
) -> tuple[Any, tuple[str, ...]]:
    """`data` with the keys a strict `model` does not declare removed, recursively through
    nested models (free-form fields such as the pod template stay whole), and their paths.
    Models that ignore extra keys (metadata, status) keep them: pydantic ignores them."""
    if not isinstance(data, dict):
        return data, ()
    strict = model.model_config.get("extra") == "forbid"
    fields: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        fields[field.alias or name] = field
        fields[name] = field
    kept: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in data.items():
        info = fields.get(key)
        if info is None:
            if strict:  # a model that ignores extras (metadata, status) reads them as is
                unknown.append(f"{path}{key}")
            else:
                kept[key] = value
            continue
        nested = _models_in(info.annotation)
        if len(nested) == 1 and isinstance(value, dict):
            value, inner = without_unknown(nested[0], value, f"{path}{key}.")
            unknown += inner
        elif len(nested) == 1 and isinstance(value, list):
            items = []
            for i, item in enumerate(value):
                item, inner = without_unknown(nested[0], item, f"{path}{key}[{i}].")
                items.append(item)
                unknown += inner
            value = items
        kept[key] = value
    return kept, tuple(unknown)
