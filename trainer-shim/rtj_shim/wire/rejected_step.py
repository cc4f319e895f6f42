"""A pinned step the restarted trainers refused, as it leaves the process. Pure.

An in-place restart's trainers restore the step the operator pinned; one that does not
verify (or cannot be loaded) is refused, and the verdict is left beside the pod's resume
file (``<resume file>.rejected``, written by `rtj_shim.torch.restore.reject`). The pod's
supervisor reports it (`SupervisorReport.rejected`), so the operator marks the step bad
instead of pinning it again:

    {"step": 30, "reason": "sha256 mismatch in model/shard-00000.pt"}

It is the tenant's word: it can only make the operator distrust the job's own step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rtj_shim.wire.json_body import json_object, step_field

SUFFIX = ".rejected"
"""The file beside the resume file the trainers write the verdict to."""
MAX_REASON = 500
"""Characters of the reason kept (a longer one is cut, never refused)."""


class RejectedStepError(ValueError):
    """A text that is not a rejected step; names the field."""


@dataclass(frozen=True)
class RejectedStep:
    step: int
    reason: str = ""

    def encode(self) -> dict[str, Any]:
        return {"step": self.step, "reason": self.reason[:MAX_REASON]}

    @classmethod
    def parse(cls, body: Any) -> RejectedStep:
        body = json_object(body, "rejected step", RejectedStepError)
        step = step_field(body, "rejected step", RejectedStepError)
        reason = body.get("reason", "")
        if not isinstance(reason, str):
            raise RejectedStepError(f"rejected step: reason {reason!r:.40}: expected a string")
        return cls(step, reason[:MAX_REASON])
