"""The operator's signed order to drain the fast tier into the durable store (issue 16).

The operator sends it to the progress sidecar of the pod holding rank 0 (completion index
0), ``POST /drain``, signed with the job's control key like a restart order, and again
whenever that sidecar's report (``"drain"`` in ``GET /progress``) does not show it: a new
attempt or in-place generation (the writer ``attempt`` label the trainers use, ``a`` or
``a.g``), another interval, or pods at new addresses. The sidecar then publishes every fast
step that is a multiple of ``every_steps`` as a durable step (`rtj_shim.fast.drain`), reading the
other pods' rank files from their sidecars at ``peers``.

Pure: the message, its checks and its encoding.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rtj_shim.checkpoint.layout import validate_attempt
from rtj_shim.wire.control import OrderError, accept_signed, count, is_address, json_object

MAX_DRAIN_ORDER_BYTES = 128 * 1024
"""Room for the addresses of a few thousand pods."""
MAX_PEERS = 4096


class DrainOrderError(OrderError):
    """A drain order that must not be followed (the message names the field)."""


@dataclass(frozen=True)
class DrainOrder:
    job_uid: str
    attempt: str  # the writer attempt of the world whose fast steps are drained
    every_steps: int
    peers: tuple[str, ...]  # the sidecars of every other pod of the attempt

    def to_json(self) -> dict[str, Any]:
        return {
            "job_uid": self.job_uid,
            "attempt": self.attempt,
            "every_steps": self.every_steps,
            "peers": list(self.peers),
        }

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()


def peers_digest(peers: Sequence[str]) -> str:
    """What the sidecar reports of the peers it follows (the operator compares it with the
    order it would send: a pod re-created at a new address changes it)."""
    return hashlib.sha256("\n".join(peers).encode()).hexdigest()[:16]


def parse_drain_order(raw: bytes) -> DrainOrder:
    data = json_object(raw, MAX_DRAIN_ORDER_BYTES, "drain order", DrainOrderError)
    uid, attempt = data.get("job_uid"), data.get("attempt")
    every, peers = data.get("every_steps"), data.get("peers")
    if not isinstance(uid, str) or not uid:
        raise DrainOrderError(f"drain.job_uid: expected a non-empty string, got {uid!r}")
    if not isinstance(attempt, str):
        raise DrainOrderError(f"drain.attempt: expected a string, got {attempt!r}")
    try:
        validate_attempt(attempt)
    except ValueError as exc:
        raise DrainOrderError(f"drain.attempt: {exc}") from None
    if not count(every) or every < 1:
        raise DrainOrderError(f"drain.every_steps: expected an integer >= 1, got {every!r}")
    if not isinstance(peers, list) or len(peers) > MAX_PEERS:
        raise DrainOrderError(f"drain.peers: expected a list of at most {MAX_PEERS} addresses")
    bad = [p for p in peers if not is_address(p)]
    if bad:
        raise DrainOrderError(f"drain.peers: expected HOST:PORT entries, got {bad[0]!r}")
    return DrainOrder(uid, attempt, every, tuple(peers))


def accept_drain_order(raw: bytes, signature: str | None, *, key: str, job_uid: str) -> DrainOrder:
    """The drain order a sidecar may follow, or DrainOrderError: signed with this job's
    key, for this job."""
    return accept_signed(
        raw, signature, key=key, job_uid=job_uid, parse=parse_drain_order,
        error=DrainOrderError, name="drain", off="no drain for its job",
    )  # fmt: skip
