"""Plain values and generators as training state, without wrapper classes.

A *plain value* is a Python scalar (``bool``, ``int``, ``float``, ``complex``, ``str``,
``bytes``, ``None``), a tensor, a NumPy array or scalar, a ``torch.dtype``/``torch.device``,
or a ``dict``/``list``/``tuple`` of plain values. Types are checked exactly: a subclass (an
``IntEnum``, a ``str`` subclass) pickles as its own class and would not load with
``torch.load(weights_only=True)``, so it is refused at save. NumPy arrays and scalars are
saved as a marker holding dtype, shape and a byte tensor (:func:`encode_array`), so they
load without unpickling NumPy classes and come back as the same dtype (object arrays are
refused).

A restored value goes back into the mapping the caller passed to ``restore()``; a
``dict``, ``list``, tensor or array of the same shape and dtype keep their identity
(updated in place), so a reference the script holds stays current (:func:`put_back`).

A *generator* (``numpy.random.Generator``, ``numpy.random.RandomState``,
``torch.Generator``, ``random.Random``) is restored in place (:func:`generator_state`,
:func:`set_generator_state`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

NDARRAY = "__rtj_ndarray__"


class UnsafeStateError(TypeError):
    """A state holds a value that ``torch.load(weights_only=True)`` would refuse."""


PLAIN_LEAVES: frozenset[type] = frozenset(
    {bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device}
)


def all_plain_leaves(values: list[Any] | tuple[Any, ...]) -> bool:
    """Whether a list or tuple holds only plain leaves (Python's RNG state is a tuple of 625
    ints): the walkers then copy it whole instead of visiting each element, a few µs
    instead of most of a fast save's stall on a small model. The types are collected in C
    (``map``), half the time of a generator over the elements."""
    return set(map(type, values)) <= PLAIN_LEAVES


def is_value(obj: Any) -> bool:
    """Whether ``obj`` is handled as a plain value. Shallow and lenient (a subclass of a
    plain type counts): the save checks every leaf exactly and names what it refuses."""
    return isinstance(
        obj, (*PLAIN_LEAVES, torch.Tensor, np.ndarray, np.generic, Mapping, list, tuple)
    )


# --------------------------------------------------------------------- NumPy arrays


def encode_array(value: np.ndarray[Any, Any] | np.generic, where: str) -> dict[str, Any]:
    """A NumPy array or scalar as a marker of plain values and one byte tensor."""
    array = np.asarray(value)
    if array.dtype.hasobject:
        raise UnsafeStateError(
            f"{where}: a NumPy array of dtype {array.dtype} holds Python objects, which "
            "weights_only=True cannot load; convert it to a numeric dtype or a list"
        )
    dtype: Any = array.dtype.str if array.dtype.fields is None else array.dtype.descr
    data = torch.from_numpy(np.ascontiguousarray(array).reshape(-1).view(np.uint8).copy())
    body = {"dtype": dtype, "shape": list(array.shape), "scalar": isinstance(value, np.generic)}
    return {NDARRAY: {**body, "data": data}}


def is_array_marker(value: Any) -> bool:
    return isinstance(value, Mapping) and len(value) == 1 and NDARRAY in value


def decode_array(marker: Mapping[str, Any]) -> Any:
    body = marker[NDARRAY]
    data: torch.Tensor = body["data"]
    raw = bytearray(data.numpy().tobytes())  # a writable copy
    array = np.frombuffer(raw, dtype=np.dtype(body["dtype"])).reshape(body["shape"])
    return array[()] if body["scalar"] else array


# --------------------------------------------------------------------- generators


def is_generator(obj: Any) -> bool:
    if isinstance(obj, random.Random):
        return not isinstance(obj, random.SystemRandom)  # SystemRandom has no state
    return isinstance(obj, np.random.Generator | np.random.RandomState | torch.Generator)


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def generator_state(obj: Any) -> dict[str, Any]:
    """The state of a generator, as plain values (arrays encoded at save)."""
    state: Any
    if isinstance(obj, np.random.Generator):
        state = obj.bit_generator.state
    elif isinstance(obj, np.random.RandomState):
        state = obj.get_state(legacy=False)
    elif isinstance(obj, torch.Generator):
        state = obj.get_state()
    else:
        state = obj.getstate()
    return {"type": _type_name(obj), "state": state}


def set_generator_state(obj: Any, saved: Mapping[str, Any]) -> None:
    if saved.get("type") != _type_name(obj):
        raise TypeError(f"the checkpoint holds a {saved.get('type')}, this is a {_type_name(obj)}")
    state = saved["state"]
    if isinstance(obj, np.random.Generator):
        current = obj.bit_generator.state["bit_generator"]
        if state["bit_generator"] != current:
            raise TypeError(
                f"the checkpoint holds a {state['bit_generator']} bit generator, this "
                f"Generator uses {current}"
            )
        obj.bit_generator.state = state
    elif isinstance(obj, np.random.RandomState | torch.Generator):
        obj.set_state(state)
    else:
        obj.setstate(_as_tuple(state))


def _as_tuple(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_as_tuple(v) for v in value)
    return value


def put_back(current: Any, restored: Any) -> Any:
    """The object the mapping holds after restore: ``current`` updated in place where it
    is a dict, a list or a tensor of the same shape and dtype; ``restored`` otherwise."""
    if isinstance(current, torch.Tensor) and isinstance(restored, torch.Tensor):
        if current.shape == restored.shape and current.dtype == restored.dtype:
            with torch.no_grad():
                current.copy_(restored)
            return current
        return restored.to(current.device)
    if isinstance(current, np.ndarray) and isinstance(restored, np.ndarray):
        if current.flags.writeable and (current.shape, current.dtype) == (
            restored.shape,
            restored.dtype,
        ):
            current[...] = restored
            return current
        return restored
    if type(current) is dict and isinstance(restored, Mapping):
        current.clear()
        current.update(restored)
        return current
    if type(current) is list and isinstance(restored, list):
        current[:] = restored
        return current
    return restored
