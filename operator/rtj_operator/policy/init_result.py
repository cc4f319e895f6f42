"""What the resume init container reported: rtj-shim's JSON verdict, read. Pure.

`rtj-shim resolve --termination-log` writes one JSON object into the init container's
termination message: the step it verified (`step`, `uri`), the steps it passed over and why
(`skipped`), or `{"error": ...}` when the store could not be read or the arguments were
wrong. Anything else (an empty message after a crash) is no verdict at all.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InitResult:
    """What the resume init container (`rtj-shim resolve --termination-log`) reported."""

    step: int | None
    uri: str | None
    error: str | None = None
    skipped: tuple[tuple[int, str], ...] = ()
    """Steps it passed over and why (the verdict on a pinned step that failed)."""


def _skipped(body: dict[str, Any]) -> tuple[tuple[int, str], ...]:
    listed = body.get("skipped")
    return tuple(
        (item["step"], str(item.get("reason", "")))
        for item in (listed if isinstance(listed, list) else [])
        if isinstance(item, dict) and isinstance(item.get("step"), int)
    )


@functools.lru_cache(maxsize=1024)
def parse_init_result(message: str) -> InitResult | None:
    """The init container's termination message; None when it is not rtj-shim's JSON (a
    crash before it could report, an empty message): then nothing is known about the step.
    Kept per message (a plan reads every pod's, mostly the same text: ~0.05 s a plan at
    1,250 pods, on every poll round)."""
    try:
        body = json.loads(message)
    except (ValueError, TypeError):
        return None
    if not isinstance(body, dict):
        return None
    if "error" in body:
        return InitResult(None, None, str(body["error"]))
    if "step" not in body:
        return None
    step = body.get("step")
    uri = body.get("uri")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        return None
    return InitResult(step, uri if isinstance(uri, str) else None, None, _skipped(body))
