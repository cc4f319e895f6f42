"""The trainers' verdict on a suspect state (silent data corruption), as it leaves the
process. Pure.

Every rank raises `rtj_shim.integrity.SuspectState` with the same verdict (they judged the
same gathered rows). It travels two ways, both read by the operator:

* in the exception's message, so the container's termination message (its log's last line:
  ``rtj_shim.integrity.SuspectState: <detail> [rtj-suspect-verdict={...}]``) carries it;
* beside the pod's resume file (``<resume file>.suspect``), which an in-place restart's
  supervisor reports (`SupervisorReport.suspect`).

    {"step": 1800, "kind": "diverged", "ranks": [13], "pods": [3]}

``ranks``: the suspect global ranks (empty: the ranks disagree with no strict majority, so
none can be named); ``pods``: the node ranks (pod indices, as the operator numbers them)
those ranks ran in. It is the tenant's word: it may name the job's own pods, never a node;
the operator looks the node up itself and only avoids it for this job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rtj_shim.wire.json_body import json_object, step_field

MARK = "rtj-suspect-verdict="
SUFFIX = ".suspect"
"""The file beside the resume file the trainers write the verdict to."""
MAX_RANKS = 64
"""Ranks (and pods) a verdict names at most: more is no culprit but a broken world."""


class SuspectKind(str, Enum):
    DIVERGED = "diverged"
    """Replicated state that differs bit for bit between ranks (the odd ones are named)."""
    ANOMALY = "anomaly"
    """A loss or gradient norm far outside its recent distribution on the ranks named."""


class SuspectVerdictError(ValueError):
    """A text that is not a verdict; names the field."""


@dataclass(frozen=True)
class SuspectVerdict:
    step: int
    kind: SuspectKind
    ranks: tuple[int, ...] = ()
    pods: tuple[int, ...] = ()

    def encode(self) -> dict[str, Any]:
        return {"step": self.step, "kind": self.kind.value, "ranks": list(self.ranks),
                "pods": list(self.pods)}  # fmt: skip

    def encode_text(self) -> str:
        """The marked, compact form a message ends with."""
        return MARK + json.dumps(self.encode(), separators=(",", ":"))

    @classmethod
    def parse(cls, body: Any) -> SuspectVerdict:
        body = json_object(body, "suspect verdict", SuspectVerdictError)
        step = step_field(body, "suspect verdict", SuspectVerdictError)
        try:
            kind = SuspectKind(body.get("kind"))
        except ValueError:
            raise SuspectVerdictError(
                f"suspect verdict: kind {body.get('kind')!r}: expected one of "
                f"{[k.value for k in SuspectKind]}"
            ) from None
        return cls(step, kind, _indexes(body, "ranks"), _indexes(body, "pods"))

    @classmethod
    def find(cls, text: str) -> SuspectVerdict | None:
        """The last verdict a text carries (None: none, or none that parses)."""
        at = text.rfind(MARK)
        if at < 0:
            return None
        try:
            body, _ = json.JSONDecoder().raw_decode(text, at + len(MARK))
            return cls.parse(body)
        except (ValueError, SuspectVerdictError):
            return None


def _indexes(body: Mapping[str, Any], name: str) -> tuple[int, ...]:
    values = body.get(name, [])
    if not isinstance(values, list) or len(values) > MAX_RANKS:
        raise SuspectVerdictError(
            f"suspect verdict: {name}: expected a list of at most {MAX_RANKS} indexes"
        )
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise SuspectVerdictError(f"suspect verdict: {name} {values!r}: expected ints >= 0")
    return tuple(sorted(set(values)))
