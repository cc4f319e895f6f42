"""rtj_shim.output: `-o yaml` reads back (with a real YAML parser) to what `-o json` prints."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rtj_shim.output import render

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@pytest.mark.parametrize("value", [1e-06, 1e20, -2.5e-12, 0.1])
def test_a_float_in_exponent_form_reads_back_as_a_float(value: float) -> None:
    assert yaml.safe_load(render({"x": value}, "yaml")) == {"x": value}


@given(JSON)
def test_yaml_reads_back_to_the_same_data(data: Any) -> None:
    assert yaml.safe_load(render(data, "yaml")) == data
    assert json.loads(render(data, "json")) == data


def test_a_result_prints_as_block_yaml() -> None:
    body = {"step": 100, "skipped": [{"step": 150, "reason": "COMMITTED is missing"}], "x": []}
    assert render(body, "yaml") == (
        '"step": 100\n"skipped":\n  - "step": 150\n    "reason": "COMMITTED is missing"\n"x": []\n'
    )


def test_another_format_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="-o: expected one of json, yaml, got 'xml'"):
        render({}, "xml")
