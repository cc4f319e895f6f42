"""Every random number generator of this rank, captured and restored as plain containers.

Python ``random``, NumPy's global generator, torch's CPU generator and, when CUDA is
initialized, every CUDA device's generator. The captured form holds only tuples, ints,
strings and tensors, so it loads with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)
    name, keys, pos, has_gauss, gauss = np_state
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.array(keys, dtype=np.uint32, copy=True)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
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
