"""The resume file: the resume decision handed to a pod's trainers. Pure.

The same JSON object travels three ways:

- the resume init container (``rtj-shim resolve --write FILE --termination-log PATH``) writes
  its `Resolution` to ``/var/run/rtj/resume.json`` (``RTJ_RESUME_FILE``) and, compacted, into
  its termination message, which the operator reads (``policy.init_result``);
- the supervisor writes an in-place restart's pin (``resume-<generation>.json``): the durable
  step and/or the fast step the operator's order names;
- the trainers read it at their first restore: the durable pin
  (``wire.resume_pin.pinned_step``) and the fast pin (``torch.fast_save.pinned_fast_step``).

``{"step": N | null, "uri": ..., "verification": "deep" | "shallow" | null, "skipped":
[{"step": S, "reason": R}, ...], "source": ..., "fast_step": F, "fast_lineage": L}``, or
``{"error": "..."}`` when the init container could not decide. Without ``"step"`` the file
pins no durable step (an in-place restart that pinned only a fast one: the trainers resolve
the durable fallback themselves); ``"step": null`` is a decision: nothing verifies, start
fresh. Unknown keys are ignored (a newer writer); a known key of the wrong kind is an error
naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rtj_shim.checkpoint.selection import Resolution

DEEP = "deep"
VERIFICATIONS = ("deep", "shallow")
DEFAULT_PATH = "/var/run/rtj/resume.json"
"""Where the resume init container writes it (``RTJ_RESUME_FILE`` says so in the pod)."""


class ResumeFileError(ValueError):
    """A resume file (or termination message) that is not one: names the field."""


@dataclass(frozen=True)
class ResumeFile:
    step: int | None = None
    """The durable step to restore; None: nothing verified (a fresh start) or no durable pin."""
    uri: str | None = None
    error: str | None = None
    """The init container could not decide (the store could not be read, bad arguments)."""
    skipped: tuple[tuple[int, str], ...] = ()
    """Steps passed over, newest first, and why."""
    verification: str | None = None
    """How deeply the writer verified `step` (``deep``: the trainers check it shallowly)."""
    pins_step: bool = True
    """False: an in-place restart that pinned only a fast step (no ``"step"`` key)."""
    source: str | None = None
    fast_step: int | None = None
    fast_lineage: str | None = None

    @classmethod
    def of_resolution(cls, resolution: Resolution) -> ResumeFile:
        """The init container's decision (``rtj-shim resolve``)."""
        depth = resolution.verification
        return cls(
            step=resolution.step,
            uri=resolution.uri,
            skipped=tuple((s.step, s.reason) for s in resolution.skipped),
            verification=None if depth is None else depth.value,
        )

    @property
    def verified_deeply(self) -> bool:
        return self.verification == DEEP

    def encode(self) -> dict[str, object]:
        if self.error is not None:
            return {"error": self.error}
        body: dict[str, object] = {}
        if self.pins_step:
            body.update(step=self.step, uri=self.uri, verification=self.verification)
        body["skipped"] = [{"step": step, "reason": reason} for step, reason in self.skipped]
        optional = {"source": self.source, "fast_step": self.fast_step}
        optional["fast_lineage"] = self.fast_lineage
        body.update({key: value for key, value in optional.items() if value is not None})
        return body

    def encode_bytes(self) -> bytes:
        return (json.dumps(self.encode(), indent=2) + "\n").encode()

    @classmethod
    def parse(cls, raw: bytes | str) -> ResumeFile:
        try:
            body = json.loads(raw)
        except (ValueError, TypeError) as exc:
            raise ResumeFileError(f"not JSON ({exc})") from exc
        if not isinstance(body, dict):
            raise ResumeFileError(f"expected a JSON object, got {type(body).__name__}")
        return cls.from_json(body)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ResumeFile:
        if "error" in body:
            return cls(error=str(body["error"]))
        verification = _optional(body, "verification", str)
        if verification is not None and verification not in VERIFICATIONS:
            raise ResumeFileError(f"verification: expected one of {VERIFICATIONS}")
        return cls(
            step=_step(body, "step"),
            uri=_optional(body, "uri", str),
            skipped=_skipped(body.get("skipped", [])),
            verification=verification,
            pins_step="step" in body,
            source=_optional(body, "source", str),
            fast_step=_step(body, "fast_step"),
            fast_lineage=_optional(body, "fast_lineage", str),
        )


def _optional(body: Mapping[str, Any], key: str, kind: type[str]) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise ResumeFileError(f"{key}: expected a string or null, got {value!r}")
    return value


def _step(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ResumeFileError(f"{key}: expected a step number (an integer >= 0), got {value!r}")
    return value


def _skipped(listed: object) -> tuple[tuple[int, str], ...]:
    if not isinstance(listed, list):
        raise ResumeFileError(f"skipped: expected a list, got {listed!r}")
    entries = []
    for i, item in enumerate(listed):
        if not isinstance(item, dict):
            raise ResumeFileError(f"skipped[{i}]: expected an object with step and reason")
        step = _step(item, "step")
        if step is None:
            raise ResumeFileError(f"skipped[{i}].step: expected a step number")
        entries.append((step, str(item.get("reason", ""))))
    return tuple(entries)
