"""The preflight's verdict on one pod, and the rule that judges a world's bandwidths. Pure.

``rtj-shim preflight`` (the ``rtj-preflight`` init container, the platform's check before a
world trains, `rtj_shim.agent.preflight`) writes one JSON object into its termination
message; the operator reads it as it reads the resume init container's, and quarantines the
node of a pod that failed (the platform's container speaking, not the tenant's trainer):

    {"passed": false, "check": "collective", "reason": "...", "world": 8,
     "send_bytes_per_second": 1.2e6, "recv_bytes_per_second": 1.1e6,
     "median_send_bytes_per_second": 9.8e8, "median_recv_bytes_per_second": 9.7e8,
     "node_check": "exit 0 in 4.1 s", "notes": ["..."]}

``check`` names what failed: ``node`` (the platform's node-local command) or ``collective``
(this pod's link, slower than the world's median by the configured factor both ways).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class PreflightCheck(str, Enum):
    NODE = "node"
    """The platform's node-local command (``dcgmi diag -r 1`` on GPU nodes) failed."""
    COLLECTIVE = "collective"
    """The pod's link carried the world's test transfer slower than the median by the
    configured factor, sending and receiving both."""


class PreflightVerdictError(ValueError):
    """A termination message that is not a verdict; names the field."""


@dataclass(frozen=True)
class PreflightVerdict:
    passed: bool
    check: PreflightCheck | None = None
    reason: str = ""
    world: int | None = None
    send_bytes_per_second: float | None = None
    recv_bytes_per_second: float | None = None
    median_send_bytes_per_second: float | None = None
    median_recv_bytes_per_second: float | None = None
    node_check: str | None = None
    notes: tuple[str, ...] = field(default=())

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"passed": self.passed, "reason": self.reason}
        if self.check is not None:
            body["check"] = self.check.value
        optional = {
            "world": self.world,
            "send_bytes_per_second": self.send_bytes_per_second,
            "recv_bytes_per_second": self.recv_bytes_per_second,
            "median_send_bytes_per_second": self.median_send_bytes_per_second,
            "median_recv_bytes_per_second": self.median_recv_bytes_per_second,
            "node_check": self.node_check,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if self.notes:
            body["notes"] = list(self.notes)
        return body

    def encode_bytes(self, limit: int = 4096) -> bytes:
        """Compact JSON within the kubelet's termination-message limit (notes go first)."""
        verdict = self
        while True:
            raw = json.dumps(verdict.encode(), separators=(",", ":")).encode()
            if len(raw) <= limit or not verdict.notes:
                break
            verdict = PreflightVerdict(**{**verdict.__dict__, "notes": verdict.notes[:-1]})
        if len(raw) > limit:
            short = PreflightVerdict(self.passed, self.check, self.reason[: limit // 2])
            raw = json.dumps(short.encode(), separators=(",", ":")).encode()
        return raw

    @classmethod
    def parse(cls, raw: str | bytes) -> PreflightVerdict:
        try:
            body = json.loads(raw)
        except (ValueError, TypeError) as exc:
            raise PreflightVerdictError(f"not JSON ({exc})") from exc
        if not isinstance(body, dict):
            raise PreflightVerdictError("expected a JSON object")
        if not isinstance(body.get("passed"), bool):
            raise PreflightVerdictError("passed: expected true or false")
        try:
            check = None if body.get("check") is None else PreflightCheck(body["check"])
        except ValueError:
            raise PreflightVerdictError(
                f"check: expected node or collective, got {body['check']!r:.40}"
            ) from None
        return cls(
            passed=body["passed"],
            check=check,
            reason=str(body.get("reason") or ""),
            world=_number(body, "world", int),
            send_bytes_per_second=_number(body, "send_bytes_per_second", float),
            recv_bytes_per_second=_number(body, "recv_bytes_per_second", float),
            median_send_bytes_per_second=_number(body, "median_send_bytes_per_second", float),
            median_recv_bytes_per_second=_number(body, "median_recv_bytes_per_second", float),
            node_check=body["node_check"] if isinstance(body.get("node_check"), str) else None,
            notes=tuple(str(n) for n in body.get("notes") or () if isinstance(n, str)),
        )


def _number(body: Mapping[str, Any], key: str, kind: type[int] | type[float]) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise PreflightVerdictError(f"{key}: expected a number >= 0, got {value!r:.40}")
    return kind(value)


@dataclass(frozen=True)
class LinkRate:
    """One rank's measured rates: sending to its ring successor, receiving from its
    predecessor (bytes per second)."""

    rank: int
    send: float
    recv: float


MIN_WORLD_TO_JUDGE = 4
"""Below this a slow NIC cannot be put on one pod: it slows two of the world's sends and two
of its receives, which with three pods are the median too (with two, both pods alike)."""


def slow_ranks(rates: Sequence[LinkRate], factor: float) -> dict[int, str]:
    """The ranks whose own link is slow, and why: slower than the median by `factor` both
    sending and receiving. In a ring a slow NIC slows its own rank both ways and each
    neighbour one way only, so the neighbours are not blamed. Nothing is judged below
    `MIN_WORLD_TO_JUDGE` ranks."""
    if len(rates) < MIN_WORLD_TO_JUDGE or factor <= 1:
        return {}
    send = statistics.median(r.send for r in rates)
    recv = statistics.median(r.recv for r in rates)
    return {
        r.rank: (
            f"rank {r.rank} sent at {_rate(r.send)} and received at {_rate(r.recv)}; the "
            f"world's medians are {_rate(send)} and {_rate(recv)} (allowed: {factor:g}x slower)"
        )
        for r in rates
        if r.send * factor < send and r.recv * factor < recv
    }


def medians(rates: Sequence[LinkRate]) -> tuple[float | None, float | None]:
    if not rates:
        return None, None
    return statistics.median(r.send for r in rates), statistics.median(r.recv for r in rates)


def _rate(bps: float) -> str:
    return f"{bps / 1e6:.1f} MB/s"
