"""The trainers' finding that ranks resumed reading other data than they stopped at (the data
alignment check after a resume, `rtj_shim.alignment`), as it leaves the process. Pure.

Every rank reaches the same finding (they judged the same gathered levels) and leaves it
beside the pod's resume file (``<resume file>.misaligned``); with ``fail`` it is also the
message of the `MisalignedResume` the trainers raise.

    {"step": 1216, "ranks": [1], "factors": [9.7], "spread": 0.031}

``ranks``: the global ranks named; ``factors``: per rank named, its mean loss over the
window after the resume as a factor of the other ranks' (of the ranks' before the fault
for a rank alone); ``spread``: the ranks' usual
spread before the fault (log units). The tenant's word about its own ranks: it names no node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rtj_shim.wire.json_body import json_object, step_field

SUFFIX = ".misaligned"
"""The file beside the resume file the trainers write the finding to."""
MAX_RANKS = 64


class MisalignedResumeError(ValueError):
    """A text that is not a finding; names the field."""


@dataclass(frozen=True)
class MisalignedRanks:
    """The ranks named, and what each one's losses were against the reference."""

    step: int
    ranks: tuple[int, ...]
    factors: tuple[float, ...]
    spread: float

    def describe(self) -> str:
        ranks = ", ".join(
            f"rank {r} ({f:.3g}x the other ranks' loss)"
            for r, f in zip(self.ranks, self.factors, strict=True)
        )
        return (
            f"data alignment after the resume: by step {self.step}, {ranks}, outside the "
            f"ranks' spread before the fault (a factor of {math.exp(self.spread):.3g}): "
            "the rank may have resumed reading its data at the wrong position"
        )

    def encode(self) -> dict[str, Any]:
        return {"step": self.step, "ranks": list(self.ranks),
                "factors": [round(f, 6) for f in self.factors], "spread": self.spread}  # fmt: skip

    @classmethod
    def parse(cls, body: Any) -> MisalignedRanks:
        what = "misaligned resume"
        body = json_object(body, what, MisalignedResumeError)
        step = step_field(body, what, MisalignedResumeError)
        ranks, factors, spread = body.get("ranks"), body.get("factors"), body.get("spread")
        if not (isinstance(ranks, list) and 0 < len(ranks) <= MAX_RANKS) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks
        ):
            raise MisalignedResumeError(
                f"{what}: ranks {ranks!r:.80}: expected 1 to {MAX_RANKS} ints >= 0"
            )
        if not (isinstance(factors, list) and len(factors) == len(ranks)) or not all(
            _positive(f) for f in factors
        ):
            raise MisalignedResumeError(
                f"{what}: factors {factors!r:.80}: expected a number > 0 per rank"
            )
        if not (_positive(spread) or spread == 0):
            raise MisalignedResumeError(f"{what}: spread {spread!r:.40}: expected a number >= 0")
        return cls(step, tuple(ranks), tuple(float(f) for f in factors), float(spread))


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
