"""The first checks every small wire record's ``parse`` takes. Pure.

A record arrives as text (a file beside the resume file, a message) or already decoded (a
field of a larger report); either way it must be one JSON object, and a step number is an
int of 0 or more (``True`` is no step). Errors name the record and the field, raised as the
caller's own error type.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def json_object(body: Any, what: str, error: type[ValueError]) -> Mapping[str, Any]:
    """`body` (text, bytes or decoded) as a JSON object, else `error` naming `what`."""
    if isinstance(body, (bytes, str)):
        try:
            body = json.loads(body)
        except ValueError as exc:
            raise error(f"{what}: not JSON ({exc})") from None
    if not isinstance(body, Mapping):
        raise error(f"{what}: expected a JSON object")
    return body


def step_field(body: Mapping[str, Any], what: str, error: type[ValueError]) -> int:
    """The object's ``step``: an int of 0 or more, else `error` naming it."""
    step = body.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise error(f"{what}: step {step!r}: expected an int >= 0")
    return step
