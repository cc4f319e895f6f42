"""The node Leases in kube-node-lease, watched: when each kubelet last renewed, which
nodes are silent now, and whether so many are silent at once that it is a partition.

Thin I/O around `policy.liveness`: a LIST then a WATCH in a thread of its own (a long
poll must not hold an API thread), events handed to the event loop; a 1-second scan
notices leases that stop being renewed (a silence makes no event) and wakes the jobs
with pods on those nodes. Without the permission (or the namespace) the watch retries
every 30 s and detection falls back to the node lifecycle controller's verdict.

A watch that stopped delivering looks exactly like a partition (every renewal overdue at
once), and holding every job on its word would stall them all: a watch stream can hang
without an error (kubernetes-client/python#1402: `timeoutSeconds` is the server's; the
client waits forever on a dead connection) and an API server's watch cache can fall
behind while writes and LISTs go on. So the watch has an idle limit, and what the watch
says is a partition is confirmed by a fresh LIST first (again every `CONFIRM_SECONDS`
while it holds): the partition is declared only when the LIST agrees or fails.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from rtj_operator.kube import Kube
from rtj_operator.kube_errors import Forbidden, KubeError
from rtj_operator.policy.liveness import NodeLease, lease_of, partitioned

log = logging.getLogger("rtj_operator.node_leases")

SCAN_SECONDS = 1.0
RETRY_SECONDS = 2.0
FORBIDDEN_RETRY_SECONDS = 30.0
CONFIRM_SECONDS = 5.0
"""While the watch's view looks like a partition, a fresh LIST at most this often."""
WATCH_IDLE_SECONDS = 60.0
"""A lease watch silent this long is dropped and re-listed (every kubelet renews every
10 s: a minute without one event is a dead stream, or no node at all)."""


class NodeLeases:
    def __init__(
        self,
        touch_node: Callable[[str], None],
        touch_all: Callable[[], None],
        clock: Callable[[], datetime],
        node_exists: Callable[[str], bool] = lambda name: True,
    ) -> None:
        self._touch_node = touch_node
        self._node_exists = node_exists
        self._touch_all = touch_all
        self._clock = clock
        self.leases: dict[str, NodeLease] = {}
        self.silent: set[str] = set()
        self.partition = False
        self.confirmations = 0
        """LISTs that contradicted a watch which looked like a partition."""
        self._confirmed_at: datetime | None = None
        self._stop = threading.Event()

    def of(self, nodes: Iterable[str]) -> Mapping[str, NodeLease]:
        return {n: lease for n in nodes if (lease := self.leases.get(n)) is not None}

    def apply(self, event_type: str, body: Mapping[str, Any]) -> None:
        """One Lease event (from the watch thread, run on the event loop)."""
        parsed = lease_of(body)
        if parsed is None:
            return
        name, lease = parsed
        if event_type == "DELETED":
            self.leases.pop(name, None)
        else:
            known = self.leases.get(name)
            # a renewal goes forward: an event behind what a LIST showed changes nothing
            if known is None or lease.renewed_at >= known.renewed_at:
                self.leases[name] = lease
        self._judge(name)

    def refresh(self, items: Iterable[Mapping[str, Any]]) -> None:
        """What a LIST says: every Lease as it is now, and those gone."""
        seen = set()
        for body in items:
            seen.add((body.get("metadata") or {}).get("name"))
            self.apply("ADDED", body)
        for gone in set(self.leases) - seen:
            self.apply("DELETED", {"metadata": {"name": gone}})

    def looks_partitioned(self) -> bool:
        """Whether the Leases as known now say most nodes are overdue at once."""
        now = self._clock()
        # only the Leases of nodes that exist: a Lease its Node outlived (deleted, the
        # garbage collector not there yet, or a Lease without an owner) is no kubelet lost
        live = [lease for name, lease in self.leases.items() if self._node_exists(name)]
        return partitioned(sum(1 for lease in live if lease.overdue(now)), len(live))

    def confirm_due(self) -> bool:
        """Whether a fresh LIST should confirm a partition the watch's view shows now."""
        if not self.looks_partitioned():
            return False
        last = self._confirmed_at
        now = self._clock()
        return last is None or (now - last).total_seconds() >= CONFIRM_SECONDS

    def confirmed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A confirming LIST's answer: applied; said when it contradicts the watch."""
        self._confirmed_at = self._clock()
        self.refresh(items)
        if not self.looks_partitioned():
            self.confirmations += 1
            log.warning("the node lease watch is behind: a fresh list shows the kubelets "
                        "renewing; no partition (%d such lists)", self.confirmations)  # fmt: skip

    def _judge(self, name: str) -> None:
        lease = self.leases.get(name)
        silent = lease is not None and lease.silent_since(self._clock()) is not None
        if silent != (name in self.silent):
            (self.silent.add if silent else self.silent.discard)(name)
            log.info("node %s %s", name, "went silent (lease not renewed)" if silent else "is back")
            self._touch_node(name)

    def scan(self) -> None:
        """Judge the partition first (from overdue renewals), then every lease (time alone
        turns a lease silent): a plan woken by a node going silent already sees whether
        the others are overdue with it."""
        partition = self.looks_partitioned()
        if partition != self.partition:
            self.partition = partition
            log.warning("node Leases: %s", "most overdue at once: a partition, holding"
                        if partition else "renewed again: contact is back")  # fmt: skip
            self._touch_all()
        for name in list(self.leases):
            self._judge(name)
        self.silent &= set(self.leases)

    def _follow(self, kube: Kube, loop: asyncio.AbstractEventLoop) -> None:
        """LIST, then WATCH from its resourceVersion, forever (thread)."""
        while not self._stop.is_set():
            try:
                items, rv = kube.list_node_leases()
                loop.call_soon_threadsafe(self.refresh, items)
                for kind, body in kube.watch_node_leases(rv, idle_seconds=WATCH_IDLE_SECONDS):
                    loop.call_soon_threadsafe(self.apply, kind, body)
                    if self._stop.is_set():
                        return
            except Forbidden as exc:
                log.warning("node leases not readable (%s): silent nodes are seen only once "
                            "the node controller marks them; retrying", exc)  # fmt: skip
                self._stop.wait(FORBIDDEN_RETRY_SECONDS)
            except KubeError as exc:
                log.info("node lease watch ended (%s); listing again", exc)
                self._stop.wait(RETRY_SECONDS)
            except RuntimeError:  # the event loop closed under us: the operator is stopping
                return

    async def run(self, kube: Kube) -> None:
        loop = asyncio.get_running_loop()
        thread = threading.Thread(
            target=self._follow, args=(kube, loop), daemon=True, name="rtj-node-leases"
        )
        thread.start()
        try:
            while True:
                await asyncio.sleep(SCAN_SECONDS)
                if self.confirm_due():
                    await self._confirm(kube)
                self.scan()
        finally:
            self._stop.set()

    async def _confirm(self, kube: Kube) -> None:
        """LIST the Leases (off the event loop) before the watch's partition is believed;
        a failed LIST leaves the watch's view standing (an API server in trouble is one)."""
        try:
            items, _ = await asyncio.to_thread(kube.list_node_leases)
        except KubeError as exc:
            self._confirmed_at = self._clock()
            log.info("node leases: the confirming list failed (%s)", exc)
            return
        self.confirmed(items)
