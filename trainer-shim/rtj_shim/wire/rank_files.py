"""The small JSON files a rank keeps beside its progress record (its milestones, its save
costs): each written whole and read bounded, with a schema number and the writing process's
pid, so the sidecar serves a file only while it is the record's process's. Pure but for the
file's read and write."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_whole(path: Path, body: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``body`` whole (a reader sees the old file or the new)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(body, separators=(",", ":")))
    os.replace(tmp, path)


def read_bounded(path: Path, max_bytes: int, what: str, error: type[ValueError]) -> object:
    """The file's JSON value; None when there is no file. Raises `error` naming `what` for
    one over `max_bytes` or not JSON."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    if len(raw) > max_bytes:
        raise error(f"{what}: over {max_bytes} bytes")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise error(f"{what}: not JSON ({exc})") from exc


def header(body: object, what: str, schema: int, error: type[ValueError]) -> Mapping[str, Any]:
    """`body` as an object of `schema` with a process id (`error` names the field that is
    not)."""
    if not isinstance(body, Mapping):
        raise error(f"{what}: expected an object, got {type(body).__name__}")
    if body.get("schema") != schema:
        raise error(f"{what}.schema: expected {schema}, got {body.get('schema')!r}")
    pid = body.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
        raise error(f"{what}.pid: expected a process id, got {pid!r}")
    return body
