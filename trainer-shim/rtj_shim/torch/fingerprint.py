"""Digests of training state: is it the same on every rank, and has it changed since then?

Two questions, two digests of a nested state (dicts, lists, tuples, tensors, plain leaves):

* ``content``: what the state holds, comparable across ranks. Tensors of up to 64 KiB are
  hashed whole; larger ones by dtype, shape and an evenly spaced sample of 4096 elements
  (a rank whose copy really differs, say per-rank data, differs everywhere). Used to check
  that an object saved *replicated* is the same on every rank.
* ``identity``: content plus, for every tensor, the memory it lives in and its version
  counter, which every in-place change (``optimizer.step()``, ``copy_``, ``add_``) bumps.
  Comparable only within one process; used to tell that nothing changed between a restore
  (or a save) of step N and a second save of step N.

Neither reads more than 64 KiB of a large tensor, so both are cheap next to a save.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rtj_shim.torch.state import USER_KINDS, Entry, state_of, unwrap

WHOLE_BYTES = 64 << 10
SAMPLES = 4096


def digest(state: Any, *, identity: bool) -> str:
    h = hashlib.sha256()
    _feed(h, state, identity)
    return h.hexdigest()


def live_state(entry: Entry) -> Any:
    """What an object's state is made of, read without collectives (a module's own
    parameters and buffers rather than a state_dict an FSDP wrapper would gather)."""
    if entry.kind == "module":
        module = unwrap(entry.obj)
        return {
            "parameters": dict(module.named_parameters()),
            "buffers": dict(module.named_buffers()),
        }
    return state_of(entry)


def entry_digests(entries: list[Entry], *, identity: bool) -> dict[str, str]:
    """Per object. ``identity`` applies to modules, optimizers and the like, whose tensors
    are the live ones; a Stateful object's state_dict() may build new tensors each call,
    so it and plain values are compared by content."""
    return {
        e.name: digest(live_state(e), identity=identity and e.kind not in USER_KINDS)
        for e in entries
    }


def _feed(h: Any, value: Any, identity: bool) -> None:
    if isinstance(value, torch.Tensor):
        _feed_tensor(h, value, identity)
    elif isinstance(value, np.ndarray):
        h.update(f"A{value.dtype.str}{value.shape}".encode())
        _feed_tensor(h, torch.from_numpy(np.ascontiguousarray(value).view(np.uint8)), identity)
    elif isinstance(value, Mapping):
        h.update(b"{")
        for key, item in value.items():
            h.update(repr(key).encode() + b":")
            _feed(h, item, identity)
        h.update(b"}")
    elif isinstance(value, list | tuple):
        h.update(b"[" if isinstance(value, list) else b"(")
        for item in value:
            _feed(h, item, identity)
        h.update(b"]")
    else:
        h.update(type(value).__qualname__.encode())
        try:
            h.update(pickle.dumps(value, protocol=4))
        except Exception:  # an object that cannot be pickled: its type must do
            h.update(b"?")


def _feed_tensor(h: Any, tensor: torch.Tensor, identity: bool) -> None:
    to_local = getattr(tensor, "to_local", None)
    t = (to_local() if callable(to_local) else tensor).detach()
    h.update(f"T{t.dtype}{tuple(t.shape)}{t.layout}".encode())
    if identity:
        h.update(repr(_where(t)).encode())
    if t.layout != torch.strided or t.device.type == "meta" or t.numel() == 0:
        return
    flat = t.reshape(-1)
    if flat.numel() * flat.element_size() > WHOLE_BYTES:
        flat = flat[:: max(1, flat.numel() // SAMPLES)][:SAMPLES]
    try:
        data = flat.contiguous().cpu().view(torch.uint8).numpy()
    except (RuntimeError, TypeError):  # a dtype without a byte view (quantized, ...)
        data = np.frombuffer(repr(flat.cpu().tolist()).encode(), dtype=np.uint8)
    h.update(data.tobytes())


def _where(t: torch.Tensor) -> tuple[Any, ...]:
    try:
        address = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        address = None
    try:
        version: int | None = t._version
    except RuntimeError:  # inference tensors have no version counter
        version = None
    return (t.device, address, t.storage_offset(), t.stride(), version)


def replica_mismatches(per_rank: list[dict[str, str]]) -> list[str]:
    """Names whose digest is not the same on every rank."""
    names = sorted({name for digests in per_rank for name in digests})
    return [n for n in names if len({digests.get(n) for digests in per_rank}) > 1]
