"""reclassify(): a fast save's classification, reused while the objects stay the same."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from rtj_shim.torch.state import RANK, classify, reclassify


def objects() -> dict[str, Any]:
    model = nn.Linear(2, 2)
    return {
        "model": model,
        "opt": torch.optim.SGD(model.parameters(), lr=0.1),
        "seen": 0,
        "gen": torch.Generator(),
    }


def test_the_same_objects_reuse_the_entries_and_a_plain_value_follows_its_new_value() -> None:
    objs = objects()
    first = classify(objs)
    objs["seen"] = 128  # an int is replaced at every step
    again = reclassify(objs, first)
    assert [(e.name, e.kind, e.placement) for e in again] == [
        (e.name, e.kind, e.placement) for e in first
    ]
    assert next(e for e in again if e.name == "seen").obj == 128
    assert next(e for e in again if e.name == "model") is next(
        e for e in first if e.name == "model"
    )


@pytest.mark.parametrize(
    "change",
    [
        "a new model object",
        "a value turned into an object with state",
        "a name added",
        "a name gone",
    ],
)
def test_any_other_change_classifies_afresh(change: str) -> None:
    objs = objects()
    first = classify(objs, rank_local=["seen"])
    if change == "a new model object":
        objs["model"] = nn.Linear(3, 3)
    elif change == "a value turned into an object with state":
        objs["seen"] = torch.Generator()
    elif change == "a name added":
        objs["extra"] = 1
    else:
        del objs["gen"]
    again = reclassify(objs, first, rank_local=["seen"])
    expected = classify(objs, rank_local=["seen"])
    assert [(e.name, e.obj, e.kind, e.placement) for e in again] == [
        (e.name, e.obj, e.kind, e.placement) for e in expected
    ]
    if change == "a value turned into an object with state":
        assert next(e for e in again if e.name == "seen").kind == "generator"
        assert next(e for e in again if e.name == "seen").placement == RANK
