"""Leader election on a coordination.k8s.io/v1 Lease, so two replicas are safe.

client-go's algorithm: a candidate takes the Lease when it is free or when the record has
not changed for `leaseDurationSeconds` *as observed by the candidate's own clock* (no
trust in other machines' clocks); the leader renews every `retry` seconds and, when it
cannot renew within `renew_deadline`, stops leading (the process exits, so no stale
leader keeps writing). Every write is conditional on the Lease's resourceVersion.

`lease_decision` is the pure part; `LeaderElector` does the I/O through `kube.Kube`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from rtj_operator.kube import Kube
from rtj_operator.kube_errors import Conflict, KubeError

log = logging.getLogger("rtj_operator.leader")


class Move(str, Enum):
    CREATE = "create"
    TAKE = "take"
    RENEW = "renew"
    FOLLOW = "follow"


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    duration: int
    transitions: int
    renew_time: str
    resource_version: str

    @property
    def fingerprint(self) -> tuple[str, str, str]:
        return (self.holder, self.renew_time, self.resource_version)


def read_lease(body: Mapping[str, Any] | None) -> LeaseRecord | None:
    if body is None:
        return None
    spec = body.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration=int(spec.get("leaseDurationSeconds") or 0),
        transitions=int(spec.get("leaseTransitions") or 0),
        renew_time=str(spec.get("renewTime") or ""),
        resource_version=str((body.get("metadata") or {}).get("resourceVersion", "")),
    )


def lease_decision(
    record: LeaseRecord | None, observed_at: float, now: float, me: str, duration: float
) -> Move:
    """What a candidate does, given the record and when (monotonic) it last saw it change."""
    if record is None:
        return Move.CREATE
    if record.holder == me:
        return Move.RENEW
    if not record.holder:
        return Move.TAKE
    expiry = record.duration if record.duration > 0 else duration
    return Move.TAKE if now - observed_at > expiry else Move.FOLLOW


def micro_time(at: datetime | None = None) -> str:
    return (at or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        *,
        duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.duration, self.renew_deadline, self.retry = duration, renew_deadline, retry
        self.monotonic = monotonic
        self._seen: tuple[str, str, str] | None = None
        self._seen_at = 0.0
        self.leading = False

    def _body(self, record: LeaseRecord | None, take: bool) -> dict[str, Any]:
        now = micro_time()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "renewTime": now,
        }
        if record is None or take:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = (record.transitions + 1) if record is not None else 0
        else:
            spec["leaseTransitions"] = record.transitions
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if record is not None:
            meta["resourceVersion"] = record.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    def try_once(self) -> bool:
        """One blocking round: True when this candidate holds the Lease afterwards."""
        record = read_lease(self.kube.get_lease(self.namespace, self.name))
        now = self.monotonic()
        if record is not None and record.fingerprint != self._seen:
            self._seen, self._seen_at = record.fingerprint, now
        move = lease_decision(record, self._seen_at, now, self.identity, self.duration)
        try:
            if move is Move.CREATE:
                self.kube.create_lease(self.namespace, self._body(None, take=True))
            elif move in (Move.TAKE, Move.RENEW):
                body = self._body(record, take=move is Move.TAKE)
                self.kube.replace_lease(self.namespace, self.name, body)
            else:
                return False
        except Conflict:
            return False
        except KubeError as exc:
            if exc.status == 409:  # AlreadyExists: another candidate created it first
                return False
            raise
        if move is Move.TAKE:
            log.info(
                "took the lease %s/%s from %r",
                self.namespace,
                self.name,
                record.holder if record else "",
            )
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until leading (True) or until `stop` is set (False)."""
        while not stop.is_set():
            try:
                if await asyncio.to_thread(self.try_once):
                    self.leading = True
                    log.info(
                        "leading as %s (lease %s/%s)", self.identity, self.namespace, self.name
                    )
                    return True
            except KubeError as exc:
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.retry)
        return False

    async def hold(self, stop: asyncio.Event) -> bool:
        """Renew until `stop` is set (True) or a renewal deadline passes (False: lost).

        The deadline counts from the start of the last renewal that succeeded (the
        renewTime it wrote is no earlier), and bounds every renewal call too: one hung
        request cannot keep a deposed leader acting past it. It is shorter than the lease
        duration, so the leader stops before any standby may take the lease over. A loop
        that wakes past the deadline (a stalled event loop) still tries once, bounded to
        end a retry period before the lease could lapse: no standby can hold it before
        that, and a leader that renews in time need not step down."""
        last = self.monotonic()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.retry)
                break
            except asyncio.TimeoutError:
                pass
            started = self.monotonic()
            remaining = self.renew_deadline - (started - last)
            if remaining <= 0:  # the loop woke late: the Lease is ours until `duration`
                remaining = self.duration - self.retry - (started - last)  # one try, in time
            try:
                renewed = await asyncio.wait_for(asyncio.to_thread(self.try_once), remaining)
                if renewed:
                    last = started
                    continue
                log.error("lease %s/%s is held by someone else", self.namespace, self.name)
                self.leading = False
                return False
            except asyncio.TimeoutError:
                log.warning("lease %s/%s: renewal did not answer within %.1fs",
                            self.namespace, self.name, max(remaining, 0.0))  # fmt: skip
            except KubeError as exc:
                log.warning("lease %s/%s: renewal failed: %s", self.namespace, self.name, exc)
            if self.monotonic() - last >= self.renew_deadline:
                log.error("lease %s/%s: not renewed for %.0fs; stepping down",
                          self.namespace, self.name, self.renew_deadline)  # fmt: skip
                self.leading = False
                return False
        return True

    def release(self) -> None:
        """Give the Lease up at a clean exit, so a standby takes over at once."""
        if not self.leading:
            return
        try:
            record = read_lease(self.kube.get_lease(self.namespace, self.name))
            if record is None or record.holder != self.identity:
                return
            body = self._body(record, take=False)
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            self.kube.replace_lease(self.namespace, self.name, body)
        except KubeError as exc:
            log.warning("lease %s/%s: release failed: %s", self.namespace, self.name, exc)
        self.leading = False
