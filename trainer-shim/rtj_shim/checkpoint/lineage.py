"""Lineage: which history a published step continues (issue 43). Pure.

A step number alone does not say which history it belongs to: after a world falls back
from its fast tier to an older durable step, it saves the same step numbers again, in a
new history. Every published step therefore carries its lineage, a short hex id chained
from the history it continues::

    fresh run:          derive(None, None, "fresh", run_id)
    resumed from step:  derive(<that step's lineage>, <its step>, <its origin>, run_id)

(`origin`: the durable manifest's digest, or ``"fast"`` for a fast step, whose manifest
differs from rank to rank.) Every rank of one world restores the same step, so every rank
computes the same id without talking. A manifest written before lineages has
:data:`LEGACY`, which never matches a pin.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

LEGACY = "legacy"
"""The lineage of a manifest written without one: never pinned, never matched."""
FRESH = "fresh"
FAST_ORIGIN = "fast"
ID_HEX = 16
_HEX = frozenset("0123456789abcdef")


def derive(parent: str | None, step: int | None, origin: str, run_id: str) -> str:
    """The lineage of a history that continues `parent` from `step` (None: a fresh run)."""
    text = "\n".join(["rtj-lineage-1", run_id, parent or "-", "-" if step is None else str(step),
                      origin])  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:ID_HEX]


def valid(lineage: str) -> bool:
    """A derived id (LEGACY is not one)."""
    return len(lineage) == ID_HEX and set(lineage) <= _HEX


def of(lineage: object) -> str:
    """A manifest's lineage field as a lineage: LEGACY when absent or malformed."""
    return lineage if isinstance(lineage, str) and valid(lineage) else LEGACY


@dataclass(frozen=True, order=True)
class Held:
    """One fast step a pod holds, and the history it belongs to (``<lineage>@<step>``)."""

    step: int
    lineage: str

    def encode(self) -> str:
        return f"{self.lineage}@{self.step}"

    @classmethod
    def parse(cls, raw: object) -> Held:
        """Strict: a ValueError names what is wrong."""
        if not isinstance(raw, str) or raw.count("@") != 1:
            raise ValueError(f"expected '<lineage>@<step>', got {raw!r}")
        lineage, step = raw.split("@")
        if lineage != LEGACY and not valid(lineage):
            raise ValueError(f"{raw!r}: lineage must be {ID_HEX} hex digits or {LEGACY!r}")
        if not step.isdigit() or step != str(int(step)):
            raise ValueError(f"{raw!r}: step must be a non-negative integer")
        return cls(int(step), lineage)

    @property
    def pinnable(self) -> bool:
        return self.lineage != LEGACY


def parse_all(value: object) -> frozenset[Held]:
    """The holdings in a reported list; entries that do not parse are ignored."""
    if not isinstance(value, list):
        return frozenset()
    out = set()
    for raw in value:
        try:
            out.add(Held.parse(raw))
        except ValueError:
            continue
    return frozenset(out)


def mismatch(step: int, pinned: str | None, held: list[str]) -> str | None:
    """Why the ranks' copies of `step` (their lineages, by rank) are not one history, or
    not the pinned one (None: they are). Pure."""
    want = pinned if pinned is not None else held[0] if held else None
    wrong = [f"rank {r} holds lineage {h}" for r, h in enumerate(held)
             if h == LEGACY or h != want]  # fmt: skip
    if not wrong:
        return None
    what = f"pinned lineage {pinned}" if pinned is not None else f"rank 0's lineage {want}"
    return f"step {step} is not one history on every rank ({what}; {', '.join(wrong[:4])})"
