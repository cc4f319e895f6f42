"""Exact checksums of the replicated training state, for the silent-corruption check.

`fingerprint.digest` samples large tensors (cheap, enough to catch per-rank data saved as
replicated); a flipped bit in one element of a large tensor escapes a sample. Here every
element counts: each tensor's bytes are read as integers of its element width and summed
at that width, wrapping (exact modulo 2**width, whatever the order), so one flipped bit
anywhere changes the sum. One vectorized pass over each parameter and optimizer tensor, on
the device it lives on (25 M float32 values: 3.5 ms on 2 CPU threads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from rtj_shim.torch.fingerprint import live_state
from rtj_shim.torch.state import COMMON, Entry

_AS_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
CHECKED_KINDS = frozenset({"module", "optimizer"})


def checksums(entries: Iterable[Entry]) -> dict[str, int]:
    """Per replicated module and optimizer: the exact sum of its tensors' bits (one device
    sync per object, not one per tensor)."""
    return {
        e.name: _total(_sums(live_state(e)))
        for e in entries
        if e.placement == COMMON and e.kind in CHECKED_KINDS
    }


def _sums(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        one = _tensor_sum(value)
        return [] if one is None else [one]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _sums(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _sums(v)]
    return []


def _total(sums: list[torch.Tensor]) -> int:
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for s in sums:
        by_device.setdefault(s.device, []).append(s)
    return sum(int(torch.stack(group).sum().item()) for group in by_device.values()) % (1 << 64)


def _tensor_sum(tensor: torch.Tensor) -> torch.Tensor | None:
    to_local = getattr(tensor, "to_local", None)
    t = (to_local() if callable(to_local) else tensor).detach()
    width = _AS_INT.get(t.element_size())
    if width is None or t.layout != torch.strided or t.device.type == "meta" or t.numel() == 0:
        return None
    try:
        bits = t.contiguous().view(width)
    except RuntimeError:  # a dtype without a same-width integer view
        return None
    # summed at its own width, wrapping (exact modulo 2**bits whatever the order: a flipped
    # bit changes it by a power of two below the modulus); a wider accumulator would
    # convert every element first, ten times slower on a CPU
    return bits.sum(dtype=width).to(torch.int64)
