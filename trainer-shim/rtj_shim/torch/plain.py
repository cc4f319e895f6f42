"""Plain values as training state: what counts as one, and how a restored one is put back.

A *plain value* is a Python scalar (``bool``, ``int``, ``float``, ``complex``, ``str``,
``bytes``, ``None``), a tensor, a ``torch.dtype``/``torch.device``, or a ``dict``/``list``/
``tuple`` of plain values: what ``torch.load(weights_only=True)`` loads without
unpickling arbitrary classes. Types are checked exactly: a subclass (an ``IntEnum``, a
``str`` subclass) pickles as its own class and would not load, so it is refused at save.

A restored value goes back into the mapping the caller passed to ``restore()``; a
``dict``, ``list``, tensor of the same shape and dtype keep their identity (updated in
place), so a reference the script holds stays current (:func:`put_back`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

PLAIN_LEAVES: frozenset[type] = frozenset(
    {bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device}
)


def is_plain_leaf(value: Any) -> bool:
    return type(value) in PLAIN_LEAVES


def is_value(obj: Any) -> bool:
    """Whether ``obj`` is handled as a plain value. Shallow and lenient (a subclass of a
    plain type counts): the save checks every leaf exactly and names what it refuses."""
    return isinstance(obj, (*PLAIN_LEAVES, torch.Tensor, Mapping, list, tuple))


def put_back(current: Any, restored: Any) -> Any:
    """The object the mapping holds after restore: ``current`` updated in place where it
    is a dict, a list or a tensor of the same shape and dtype; ``restored`` otherwise."""
    if isinstance(current, torch.Tensor) and isinstance(restored, torch.Tensor):
        if current.shape == restored.shape and current.dtype == restored.dtype:
            with torch.no_grad():
                current.copy_(restored)
            return current
        return restored.to(current.device)
    if type(current) is dict and isinstance(restored, Mapping):
        current.clear()
        current.update(restored)
        return current
    if type(current) is list and isinstance(restored, list):
        current[:] = restored
        return current
    return restored
