"""What a value in a pod's progress report may be: the one check of everything the operator
reads from one. Pure.

A progress report is the pod speaking: its sidecar's answer (`rtj_shim.agent.progress_report`), of
records the trainer itself writes, or anything a process listening on that port sends. JSON
lets it carry integers of any size (a 400-digit step number no float holds), NaN and
Infinity (Python's `json.loads` accepts both), negative durations and lists of any length
within the body limit. None of them is what a sidecar writes; each read here is *no report*
(`BadValue`), never an exception that escapes the pod's reading.

Bounds:

* integers (ranks, steps, counts): 0 to 2**53 - 1, the largest every JSON reader keeps exact
  (and a Kubernetes int64 status field holds);
* seconds (durations, ages): finite, 0 to `MAX_SECONDS`;
* strings: at most `MAX_TEXT` characters (a section: `MAX_SECTION`);
* lists: at most `MAX_LIST` items (a rank's recent steps: `MAX_RECENT_STEPS`);
* the parts read as plain JSON (`supervisor`, `fast_tier`, ...): numbers finite and within
  the integer bound, strings and lists as above, nested at most `MAX_DEPTH` deep.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MAX_INTEGER = 2**53 - 1
MAX_SECONDS = 1e9
"""About 31 years: longer than any record's age since its machine booted."""
MAX_TEXT = 4096
MAX_SECTION = 256
"""The shim keeps 32 bytes of a section's name (`rtj_shim.wire.progress_record.SECTION_BYTES`)."""
MAX_LIST = 4096
MAX_RANKS = 4096
"""Rank entries per pod; the shim reads at most 1,024 records (`progress_report.MAX_FILES`)."""
MAX_RECENT_STEPS = 1024
"""The shim keeps the last 16 step durations per rank (`progress_record.RING`)."""
MAX_DEPTH = 8


class BadValue(ValueError):
    """A value no progress sidecar writes: the report that holds it is no report."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def integer(entry: Mapping[str, Any], key: str, *, default: int | None = None) -> int | None:
    """`entry[key]`: absent or null is `default`; else an integer in 0..MAX_INTEGER."""
    value = entry.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INTEGER:
        raise BadValue(f"{key} {_shown(value)} is not an integer in 0..{MAX_INTEGER}")
    return value


def seconds(entry: Mapping[str, Any], key: str) -> float | None:
    """`entry[key]`: absent or null is unknown (None); else finite seconds in 0..MAX_SECONDS."""
    return _seconds(entry.get(key), key)


def _seconds(value: object, key: str) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_SECONDS  # NaN compares false; a huge int compares exactly
    ):
        raise BadValue(f"{key} {_shown(value)} is not seconds in 0..{MAX_SECONDS:g}")
    return float(value)


def seconds_list(entry: Mapping[str, Any], key: str, limit: int) -> tuple[float, ...]:
    """`entry[key]`: absent or null is empty; else a list of at most `limit` seconds."""
    value = entry.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > limit:
        raise BadValue(f"{key} is not a list of at most {limit} durations")
    found = tuple(_seconds(s, key) for s in value)
    if None in found:
        raise BadValue(f"{key} holds a null")
    return tuple(s for s in found if s is not None)


def text(entry: Mapping[str, Any], key: str, limit: int = MAX_TEXT) -> str | None:
    """`entry[key]`: absent or null is None; else a string of at most `limit` characters."""
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise BadValue(f"{key} {_shown(value)} is not a string of at most {limit} characters")
    return value


def items(body: Mapping[str, Any], key: str, limit: int) -> list[Any]:
    """`body[key]`, a list of at most `limit` items."""
    value = body.get(key)
    if not isinstance(value, list) or len(value) > limit:
        raise BadValue(f"{key} is not a list of at most {limit} items")
    return value


def plain(value: object, where: str, depth: int = 0) -> None:
    """A part read as plain JSON (`supervisor`, `fast_tier`, ...): every number finite and
    within the integer bound, every string and list bounded, nested at most MAX_DEPTH."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int | float):
        if abs(value) > MAX_INTEGER or not math.isfinite(value):
            raise BadValue(f"{where} holds the number {_shown(value)}")
    elif isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise BadValue(f"{where} holds a string of {len(value)} characters")
    elif depth >= MAX_DEPTH:
        raise BadValue(f"{where} is nested more than {MAX_DEPTH} deep")
    elif isinstance(value, list):
        if len(value) > MAX_LIST:
            raise BadValue(f"{where} holds a list of {len(value)} items")
        for item in value:
            plain(item, where, depth + 1)
    elif isinstance(value, Mapping):
        if len(value) > MAX_LIST:
            raise BadValue(f"{where} holds an object of {len(value)} keys")
        for key, item in value.items():
            plain(item, f"{where}.{key}", depth + 1)
    else:
        raise BadValue(f"{where} holds a {type(value).__name__}")
