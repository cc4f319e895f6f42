"""Every random number generator of this rank, captured and restored as plain containers.

Python ``random``, NumPy's global generator, torch's CPU generator and, when CUDA is
initialized, every CUDA device's generator. The captured form holds only tuples, ints,
strings and tensors, so it loads with ``weights_only=True``.

Python's Mersenne Twister state (625 ints) is kept as one int64 tensor: as a tuple it was
625 objects for the pickler, each a call into ``torch.save``'s Python ``persistent_id``,
about 40% of a small model's objects in every save. Steps saved with the tuple form
restore as before.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    return encoded(read())


def read() -> dict[str, Any]:
    """Every generator's state as its own API returns it: fresh objects, nothing shared
    with a generator (NumPy's and torch's copy theirs, Python's is a tuple), so a fast save
    reads it on the training thread and leaves :func:`encoded` to its writer thread."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(legacy=True),
        "torch_cpu": torch.get_rng_state(),
    }
    # is_initialized() first: is_available() asks the driver (µs on every fast save)
    if torch.cuda.is_initialized() and torch.cuda.is_available():  # type: ignore[no-untyped-call]
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def encoded(raw: dict[str, Any]) -> dict[str, Any]:
    """:func:`read`'s state in the saved form (plain containers, ints and tensors)."""
    name, keys, pos, has_gauss, gauss = raw["numpy"]
    version, internal, gauss_next = raw["python"]
    state: dict[str, Any] = {
        "python": {
            "version": int(version),
            "internal": torch.from_numpy(np.array(internal, dtype=np.int64)),
            "gauss_next": gauss_next,
        },
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.uint32)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch_cpu": raw["torch_cpu"],
    }
    if "torch_cuda" in raw:
        state["torch_cuda"] = raw["torch_cuda"]
    return state


def restore(state: dict[str, Any]) -> None:
    random.setstate(python_state(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["name"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["gauss"],
        )
    )
    torch.set_rng_state(state["torch_cpu"])
    cuda = state.get("torch_cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            raise ValueError(
                f"the checkpoint holds CUDA RNG state for {len(cuda)} devices, "
                f"this process sees {torch.cuda.device_count()}"
            )
        torch.cuda.set_rng_state_all(cuda)


def python_state(value: Any) -> Any:
    """The argument to ``random.setstate``: from the tensor form, or the tuple form of steps
    saved before it (a round trip may have turned their tuples into lists)."""
    if isinstance(value, dict):
        internal = value["internal"]
        return (value["version"], tuple(internal.tolist()), value["gauss_next"])
    return _as_tuple(value)


def _as_tuple(value: Any) -> Any:
    """``random.setstate`` needs tuples; a round trip may have turned them into lists."""
    if isinstance(value, list | tuple):
        return tuple(_as_tuple(v) for v in value)
    return value


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Run a block without moving any generator (used around validation probes)."""
    saved = capture()
    try:
        yield
    finally:
        restore(saved)
