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

import functools
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (X, X | None, list[X], ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if get_origin(annotation) in (Union, types.UnionType, list, tuple):
        return [m for arg in get_args(annotation) for m in _models_in(arg)]
    return []


@functools.cache
def _nested_by_key(model: type[BaseModel]) -> dict[str, type[BaseModel] | None]:
    """Each key `model` declares (alias and field name) and the one model its value holds,
    if it holds exactly one (None: a plain value, or a choice of models); worked out once per
    model (the operator reads every job on each reconcile, and this pass was most of it)."""
    out: dict[str, type[BaseModel] | None] = {}
    for name, field in model.model_fields.items():
        nested = _models_in(field.annotation)
        one = nested[0] if len(nested) == 1 else None
        out[field.alias or name] = one
        out[name] = one
    return out


def without_unknown(
    model: type[BaseModel], data: Any, path: str = ""
) -> tuple[Any, tuple[str, ...]]:
    """`data` with the keys a strict `model` does not declare removed, recursively through
    nested models (free-form fields such as the pod template stay whole), and their paths.
    Models that ignore extra keys (metadata, status) keep them: pydantic ignores them."""
    if not isinstance(data, dict):
        return data, ()
    strict = model.model_config.get("extra") == "forbid"
    fields = _nested_by_key(model)
    kept: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in data.items():
        if key not in fields:
            if strict:  # a model that ignores extras (metadata, status) reads them as is
                unknown.append(f"{path}{key}")
            else:
                kept[key] = value
            continue
        nested = fields[key]
        if nested is not None and isinstance(value, dict):
            value, inner = without_unknown(nested, value, f"{path}{key}.")
            unknown += inner
        elif nested is not None and isinstance(value, list):
            items = []
            for i, item in enumerate(value):
                item, inner = without_unknown(nested, item, f"{path}{key}[{i}].")
                items.append(item)
                unknown += inner
            value = items
        kept[key] = value
    return kept, tuple(unknown)
