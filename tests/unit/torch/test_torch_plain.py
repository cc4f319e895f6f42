"""Plain values and generators: encoded so that weights_only=True loads them, exactly back."""

from __future__ import annotations

import io
import random
from typing import Any

import numpy as np
import pytest
import torch

from rtj_shim.torch import UnsafeStateError
from rtj_shim.torch import serialization as ser
from rtj_shim.torch.plain import generator_state, put_back, set_generator_state


def weights_only_round_trip(state: Any, *, extract: bool) -> Any:
    """Through the skeleton + shard path (``extract``) or the rank-file path."""
    tensors: list[torch.Tensor] = []
    if extract:
        saved = ser.flatten(state, tensors, "s", allow_unsafe=False)
    else:
        saved = ser.encode(state, "s", allow_unsafe=False)
    buf = io.BytesIO()
    torch.save({"state": saved, "tensors": dict(enumerate(tensors))}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    return ser.unflatten(loaded["state"], loaded["tensors"])


ARRAYS = [
    np.arange(12, dtype=np.float64).reshape(3, 4),
    np.arange(12, dtype=np.int32).reshape(3, 4).T,  # not contiguous
    np.array([2**64 - 1, 7], dtype=np.uint64),
    np.array([True, False]),
    np.array(["ab", "cde"]),
    np.array(["2024-01-02T03:04:05"], dtype="datetime64[s]"),
    np.array([1, 2], dtype=">i4"),  # big-endian stays big-endian
    np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,))]),
    np.array(3.5),  # 0-d
    np.empty((0, 5), dtype=np.float32),
]


@pytest.mark.parametrize("extract", [True, False])
@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_numpy_arrays_come_back_with_their_dtype_shape_and_values(
    array: np.ndarray[Any, Any], extract: bool
) -> None:
    back = weights_only_round_trip({"a": array, "nested": [array]}, extract=extract)
    for got in (back["a"], back["nested"][0]):
        assert isinstance(got, np.ndarray)
        assert got.dtype == array.dtype and got.shape == array.shape
        assert np.array_equal(got, array)
        assert got.flags.writeable


@pytest.mark.parametrize(
    "scalar", [np.float64(0.1), np.float32(2.5), np.int64(-3), np.bool_(True), np.uint8(255)]
)
def test_numpy_scalars_come_back_as_the_same_numpy_type(scalar: np.generic) -> None:
    # np.float64 is a float subclass: it used to pass the save-time check and then fail
    # torch.load(weights_only=True) at resume time
    back = weights_only_round_trip({"best": scalar}, extract=True)["best"]
    assert type(back) is type(scalar) and back == scalar


def test_object_arrays_and_plain_subclasses_are_refused() -> None:
    with pytest.raises(UnsafeStateError, match=r"s\.a: a NumPy array of dtype object"):
        ser.flatten({"a": np.array([{}, 1], dtype=object)}, [], "s", allow_unsafe=False)

    class Name(str):
        pass

    with pytest.raises(UnsafeStateError, match=r"s\.n: a .*Name cannot be loaded"):
        ser.encode({"n": Name("x")}, "s", allow_unsafe=False)


def draws(obj: Any) -> list[float]:
    if isinstance(obj, np.random.Generator):
        return list(obj.random(3))
    if isinstance(obj, np.random.RandomState):
        return list(obj.rand(3))
    if isinstance(obj, torch.Generator):
        return torch.rand(3, generator=obj).tolist()
    return [obj.random() for _ in range(3)]


GENERATORS = [
    lambda: np.random.default_rng(1),  # PCG64
    lambda: np.random.Generator(np.random.MT19937(2)),
    lambda: np.random.Generator(np.random.SFC64(3)),
    lambda: np.random.Generator(np.random.Philox(4)),
    lambda: np.random.RandomState(5),
    lambda: torch.Generator().manual_seed(6),
    lambda: random.Random(7),
]


@pytest.mark.parametrize("make", GENERATORS)
def test_generators_restore_in_place_and_continue_the_same_stream(make: Any) -> None:
    gen = make()
    draws(gen)
    saved = weights_only_round_trip(generator_state(gen), extract=False)
    expected = draws(gen)
    other = make()
    draws(other)
    draws(other)  # somewhere else in its stream
    set_generator_state(other, saved)
    assert draws(other) == expected


def test_a_generator_of_another_kind_is_refused() -> None:
    saved = generator_state(np.random.default_rng(0))
    with pytest.raises(TypeError, match="PCG64 bit generator, this Generator uses MT19937"):
        set_generator_state(np.random.Generator(np.random.MT19937(0)), saved)
    with pytest.raises(TypeError, match=r"holds a numpy\.random.*Generator, this is a .*Random"):
        set_generator_state(random.Random(), saved)


def test_put_back_keeps_mutable_objects_and_replaces_the_rest() -> None:
    d: dict[str, int] = {"a": 1, "old": 2}
    assert put_back(d, {"a": 3}) is d and d == {"a": 3}
    arr = np.zeros(3)
    assert put_back(arr, np.ones(3)) is arr and arr.tolist() == [1.0, 1.0, 1.0]
    assert put_back(np.zeros(2), np.ones(3)).shape == (3,)
    t = torch.zeros(2)
    assert put_back(t, torch.ones(2)) is t and t.tolist() == [1.0, 1.0]
    assert put_back(5, 6) == 6 and put_back(None, (1, 2)) == (1, 2)
