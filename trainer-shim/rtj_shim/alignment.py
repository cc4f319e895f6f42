"""Did every rank resume reading its data where it stopped? Pure judgements for the data
alignment check after a resume (requirements 003, section 3.4; issue 43 section 5).

Data-parallel ranks read different batches of the same distribution, so their losses over a
few steps agree up to a spread that training itself shows. A rank that resumed at the wrong
position of its data (a loader that did not restore its offset, features and labels of a
packed file shifted against each other) trains on other data than the no-fault run would:
its loss leaves that spread while the others' stay in it.

* Before a fault: at every save (and integrity check) each rank brings its **level**, the
  mean of the natural log of its last `AlignmentCheck.window` losses (log space: a factor,
  whatever the loss's scale), and `Reference.observed` keeps the cross-rank median of the
  newest levels (the **center**), each rank's usual **offset** from it (a rank whose shard
  is harder by design is no finding), and a robust **spread** of what stays of the levels'
  differences once the offsets are taken out, over the recent gathers. The reference
  travels in the checkpoint's manifest (`encode`/`parse`).
* After a resume: once each rank has `window` new losses, the ranks gather their levels;
  `misaligned` names the ranks whose level is more than ``threshold`` spreads from the
  other ranks' (never less than ``floor`` in log units: a factor of e**floor); the center
  tells which of two ranks that disagree strayed, and judges a rank alone.

A rank with no positive loss (a loss that can be zero or negative) brings no level and is
judged by no one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from rtj_shim.wire.misaligned_resume import MisalignedRanks

MAD_SCALE = 1.4826
"""The median absolute deviation of a normal distribution, times this, is its sigma."""
HISTORY = 16
"""Gathers whose spreads the reference keeps."""
LOSS_ALIGNMENT = "loss_alignment"
"""Where a manifest records the reference (``extra.torch``)."""


class AlignmentError(ValueError):
    """A reference in a manifest that is not one; names the field."""


class MisalignedResume(RuntimeError):
    """Ranks resumed reading other data than they stopped at (`AlignmentCheck(fail=True)`)."""


@dataclass(frozen=True)
class AlignmentCheck:
    """The data alignment check after every resume. ``window``: the losses each rank's level
    averages (the check runs at the resumed step + window); ``threshold``: the spreads a
    level may stray from the center before its rank is named; ``floor``: the least distance
    (log units) that names a rank; ``fail``: raise `MisalignedResume` instead of warning."""

    window: int = 16
    threshold: float = 8.0
    floor: float = 0.4
    fail: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not 1 <= self.window <= 1024:
            raise ValueError(f"AlignmentCheck(window={self.window!r}): expected 1 to 1024 steps")
        for name in ("threshold", "floor"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"AlignmentCheck({name}={value!r}): expected a number > 0")


def level(losses: Sequence[float]) -> float | None:
    """The mean log of the positive finite losses; None when there are none."""
    logs = [math.log(x) for x in losses if math.isfinite(x) and x > 0]
    return sum(logs) / len(logs) if logs else None


@dataclass(frozen=True)
class Reference:
    """The ranks' losses as the gathers before a save saw them."""

    center: float
    """The median of the newest gather's levels."""
    offsets: tuple[float, ...] = ()
    """Per rank, its level's usual distance from the median (a rank that reads a harder
    shard by design), averaged over the last `HISTORY` gathers."""
    spreads: tuple[float, ...] = field(default=())
    """Per gather, the median distance of the ranks' levels, less their offsets, from their
    median: what stays of a rank's difference once its usual offset is taken out."""
    gathers: int = 0

    @property
    def spread(self) -> float:
        """A robust sigma of one rank's level around the others' (0 with one rank alone)."""
        return MAD_SCALE * statistics.median(self.spreads) if self.spreads else 0.0

    def adjusted(self, levels: Sequence[float | None]) -> list[float | None]:
        """The levels less each rank's offset (as they are where the world size changed)."""
        if len(levels) != len(self.offsets):
            return list(levels)
        return [None if x is None else x - o for x, o in zip(levels, self.offsets, strict=True)]

    def observed(self, levels: Sequence[float | None]) -> Reference:
        """This reference after one more gather of levels (unchanged when none came; begun
        again when the world size changed)."""
        known = [x for x in levels if x is not None]
        if not known:
            return self
        ref = self if len(levels) == len(self.offsets) else Reference(0.0, (0.0,) * len(levels))
        center = statistics.median(known)
        adjusted = [x for x in ref.adjusted(levels) if x is not None]
        middle = statistics.median(adjusted)
        spreads = ref.spreads
        if len(known) > 1:
            spreads = (*spreads, statistics.median(abs(x - middle) for x in adjusted))
        n = min(ref.gathers + 1, HISTORY)
        offsets = tuple(
            o if x is None else o + (x - center - o) / n
            for x, o in zip(levels, ref.offsets, strict=True)
        )
        return Reference(center, offsets, spreads[-HISTORY:], ref.gathers + 1)

    def encode(self) -> dict[str, Any]:
        return {"center": self.center, "offsets": list(self.offsets),
                "spreads": list(self.spreads), "gathers": self.gathers}  # fmt: skip

    @classmethod
    def parse(cls, body: object) -> Reference:
        if not isinstance(body, Mapping):
            raise AlignmentError(f"loss alignment: expected an object, got {body!r:.80}")
        center, gathers = body.get("center"), body.get("gathers", 0)
        if not _finite(center):
            raise AlignmentError(f"loss alignment: center {center!r:.40}: expected a number")
        if isinstance(gathers, bool) or not isinstance(gathers, int) or gathers < 0:
            raise AlignmentError(f"loss alignment: gathers {gathers!r:.40}: expected an int >= 0")
        offsets = _numbers(body, "offsets", least=-math.inf)
        spreads = _numbers(body, "spreads", least=0.0)
        return cls(float(center), offsets, spreads[-HISTORY:], gathers)


def _numbers(body: Mapping[str, Any], name: str, least: float) -> tuple[float, ...]:
    values = body.get(name, [])
    kept = (
        [float(v) for v in values if _finite(v) and v >= least]
        if isinstance(values, list)
        else None
    )
    if kept is None or len(kept) != len(values):
        floor = "" if least == -math.inf else f" >= {least:g}"
        raise AlignmentError(
            f"loss alignment: {name} {values!r:.80}: expected a list of numbers{floor}"
        )
    return tuple(kept)


def _finite(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def reference(first: Sequence[float | None]) -> Reference | None:
    """The reference of a first gather; None when no rank brought a level."""
    if not any(x is not None for x in first):
        return None
    return Reference(0.0, (0.0,) * len(first)).observed(first)


def misaligned(
    step: int, levels: Sequence[float | None], ref: Reference, check: AlignmentCheck
) -> MisalignedRanks | None:
    """The ranks whose level strays from the others', or None.

    With three ranks or more, each is measured against the median of the ranks' levels
    after the resume (what training did meanwhile, a falling loss, moves them all alike)
    and named when it is more than ``threshold`` pre-fault spreads (never less than
    ``floor``) away. Two ranks are measured against each other: when they disagree, the
    one farther from the reference's center is named. A rank alone is measured against the
    center. Each level is first less its rank's usual offset (`Reference.offsets`). No one
    is named when every rank strays (no level to trust), nor after a change of world size
    (the ranks' offsets no longer apply: the check is skipped)."""
    if len(levels) != len(ref.offsets):
        return None
    limit = max(check.threshold * ref.spread, check.floor)
    known = {rank: x for rank, x in enumerate(ref.adjusted(levels)) if x is not None}
    off = {r: d for r, x in known.items() if abs(d := x - _baseline(r, known, ref)) > limit}
    if len(known) == 2 and len(off) == 2:
        worst = max(off, key=lambda r: abs(known[r] - ref.center))
        off = {worst: off[worst]}
    if not off or (len(known) > 2 and len(off) == len(known)):
        return None
    return MisalignedRanks(step, tuple(off), tuple(math.exp(d) for d in off.values()), ref.spread)


def _baseline(rank: int, known: Mapping[int, float], ref: Reference) -> float:
    """The level `rank`'s is compared with (see `misaligned`)."""
    if len(known) > 2:
        return statistics.median(known.values())
    others = [x for r, x in known.items() if r != rank]
    return others[0] if others else ref.center
