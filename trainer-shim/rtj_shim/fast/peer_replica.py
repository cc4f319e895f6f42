"""The fast tier's peer replica: each pod's fast steps copied into another pod (issue 16).

A pod's fast tier (``rtj_shim.fast.fast_tier``) lives in its own memory, so it is lost with its
node. With a peer replica the progress sidecar of a *holder* pod keeps a copy of another pod's
(its *source*'s) newest fast steps in its own fast-tier volume, so a pod re-created on another
node after its node was lost resumes from a fast step too: its sidecar copies the step back
from the holder before its trainers start (``Order.fast_source``).

Who holds whom is the operator's decision (a ring over the pods' completion indexes, holder
and source on different nodes where the placement allows): it sends each holder's sidecar a
signed :class:`Assignment` (``POST /replica``) naming the source's index and address, and sends
it again whenever the sidecar's report (``"replica"`` in ``GET /progress``) does not show it,
so a re-created source (a new address) is followed. The holder *pulls*: it asks the source for
the steps it holds and copies the newest one it lacks, so the holder alone decides what it
stores (``keep`` steps, like the source) and a slow holder only skips steps.

Transport: plain HTTP between the sidecars, authenticated both ways with the job's control key
(``RTJ_CONTROL_KEY``, derived per job by the operator). A request carries
``X-RTJ-Time`` and ``X-RTJ-Signature = HMAC(key, "METHOD target time")`` and is refused more
than :data:`MAX_SKEW_S` from the server's clock; a JSON answer (the holdings, a manifest)
carries ``X-RTJ-Signature = HMAC(key, target + "\\n" + body)``, and every shard is checked
against the manifest's sha256 while it is written. A sidecar of another job has another key:
it can neither read this job's steps nor hand this job a shard.

Layout, beside the pod's own rank directories::

    <fast dir>/rank-00004/...                 this pod's own steps (the trainers write them)
    <fast dir>/peer/rank-00002/steps/...      the source's steps (the sidecar writes them)
    <fast dir>/peer/source.json               {"source_index": 1, "source": "10.0.3.7:9478"}

Memory: a holder keeps ``keep`` (+1 while a new one is published) of its source's steps, as
much again as its own tier; size ``spec.checkpoint.fastTier.sizeLimit`` for both.

Pure apart from nothing: messages, signatures and names.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from rtj_shim.wire.control import (
    OrderError,
    accept_signed,
    count,
    is_address,
    json_object,
    sign,
    signature_matches,
)

PEER_DIR = "peer"
SOURCE_FILE = "source.json"
TIME_HEADER = "X-RTJ-Time"
MAX_SKEW_S = 120.0
"""A signed request older or newer than this (the server's clock) is refused: a captured
request cannot be replayed later. Generous: the pods' clocks are NTP-synced, not ours."""
MAX_ASSIGNMENT_BYTES = 1024
TIERS = ("own", "replica")


class AssignmentError(OrderError):
    """An assignment that must not be followed (the message names the field)."""


@dataclass(frozen=True)
class Assignment:
    """What the operator tells a holder's sidecar: copy the fast steps of the pod with
    completion index ``source_index``, whose progress sidecar is at ``source``."""

    job_uid: str
    source: str
    source_index: int

    def to_json(self) -> dict[str, Any]:
        return {"job_uid": self.job_uid, "source": self.source, "source_index": self.source_index}

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()


def parse_assignment(raw: bytes) -> Assignment:
    data = json_object(raw, MAX_ASSIGNMENT_BYTES, "assignment", AssignmentError)
    uid, source, index = data.get("job_uid"), data.get("source"), data.get("source_index")
    if not isinstance(uid, str) or not uid:
        raise AssignmentError(f"assignment.job_uid: expected a non-empty string, got {uid!r}")
    if not is_address(source):
        raise AssignmentError(f"assignment.source: expected HOST:PORT, got {source!r}")
    if not count(index):
        raise AssignmentError(f"assignment.source_index: expected an integer >= 0, got {index!r}")
    return Assignment(uid, source, index)


def accept_assignment(raw: bytes, signature: str | None, *, key: str, job_uid: str) -> Assignment:
    """The assignment a sidecar may follow, or AssignmentError: signed with this job's key,
    for this job."""
    return accept_signed(
        raw, signature, key=key, job_uid=job_uid, parse=parse_assignment,
        error=AssignmentError, name="assignment", off="no peer replica for its job",
    )  # fmt: skip


# --- request and answer signatures -------------------------------------------------------


def request_signature(key: str, method: str, target: str, when: str) -> str:
    """``X-RTJ-Signature`` of a request (``target``: path and query, as sent)."""
    return sign(key, f"{method} {target} {when}".encode())


def request_headers(key: str, method: str, target: str, now: float) -> dict[str, str]:
    when = f"{now:.3f}"
    return {TIME_HEADER: when, "X-RTJ-Signature": request_signature(key, method, target, when)}


def check_request(
    key: str, method: str, target: str, when: str | None, signature: str | None, now: float
) -> str | None:
    """Why a request is refused (None: it is this job's and fresh)."""
    if not key:
        return "this pod has no control key"
    try:
        at = float(when) if when is not None else None
    except ValueError:
        at = None
    if at is None or not math.isfinite(at):  # NaN is never more than MAX_SKEW_S away
        return f"{TIME_HEADER}: expected Unix seconds"
    if abs(now - at) > MAX_SKEW_S:
        return f"{TIME_HEADER}: {at:.0f} is more than {MAX_SKEW_S:.0f} s from this pod's clock"
    expected = request_signature(key, method, target, when or "")
    if not signature_matches(expected, signature):
        return "X-RTJ-Signature: missing or not this job's signature"
    return None


def answer_signature(key: str, target: str, body: bytes) -> str:
    return sign(key, target.encode() + b"\n" + body)


def check_answer(key: str, target: str, body: bytes, signature: str | None) -> bool:
    return signature_matches(answer_signature(key, target, body), signature)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
