"""What a plan may ask for beyond the watch caches: the job's checkpoint store and its Kueue
LocalQueue. Thin I/O; what the answers mean is decided in `reconcile`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from rtj_operator import reconcile as rc
from rtj_operator import selection
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import KubeError, NotFound
from rtj_operator.store_reads import Lane, StoreReads, operator_identity_refusal, store_key

log = logging.getLogger("rtj_operator.controller")
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
"""Kueue's served versions, newest first: v1beta2 is preferred from v0.15 (the pinned
v0.17 stores it), v1beta1 is what older installations serve."""
QUEUE_SHARED = timedelta(seconds=10)
"""How long one LocalQueue lookup answers every job on that queue. Each job waiting for
admission asks again every `QUEUE_RECHECK`: with 1,000 jobs waiting on one queue that was
5,000 GETs of it in six minutes, most of the operator's requests, and reconciles held up
behind them on an API server already the bottleneck (`bench.operator_scale_jobs`)."""
QUEUES_KEPT = 256
"""Past this many queues looked up, the old lookups are dropped (`_forget_old_queues`)."""


class JobReads:
    """Reads for plans: a job's store (bounded per lane, per store and in time, see
    `store_reads`) with the job's own credentials or the operator's where the platform
    allows it, and a LocalQueue lookup."""

    def __init__(
        self,
        kube: Kube,
        store_reads: StoreReads,
        io: Callable[..., Awaitable[Any]],
        clock: Callable[[], datetime],
        operator_identity_stores: tuple[str, ...],
    ) -> None:
        self.kube, self.store_reads, self._io, self.clock = kube, store_reads, io, clock
        self.operator_identity_stores = operator_identity_stores
        self._queues: dict[tuple[str, str], rc.QueueReading] = {}
        self._queue_locks: dict[tuple[str, str], threading.Lock] = {}
        self._queue_guard = threading.Lock()

    async def store(self, rtj: ResilientTrainingJob, lane: Lane = Lane.RESTART) -> rc.StoreReading:
        """Read the job's store, excluding the bad steps `rtj` records. The reading carries
        when it started and what it excluded: the plan refuses it once `badSteps` grew.
        Reads are bounded per lane, per store and in time (see `store_reads`)."""
        ckpt = rtj.spec.checkpoint
        credentials: Mapping[str, str] | None = None
        excluded = frozenset(rtj.status.bad_steps)
        name = ckpt.credentials_secret_name
        secret = f"{rtj.metadata.namespace}/{name}" if name else None
        started = self.clock()
        refused = operator_identity_refusal(ckpt.uri, secret or None, self.operator_identity_stores)
        if refused is not None:
            return rc.StoreReading(started, error=refused, excluded=excluded)
        try:
            if name:
                credentials = await self._io(self.kube.secret_data, rtj.metadata.namespace, name)
            picked = await self.store_reads.read(
                lane, store_key(ckpt.uri, secret or None), ckpt.uri, excluded, credentials
            )
        except selection.CheckpointUnreadable as exc:
            return rc.StoreReading(started, error=str(exc), excluded=excluded)
        except KubeError as exc:
            return rc.StoreReading(started, error=f"credentials secret: {exc}", excluded=excluded)
        return rc.StoreReading(started, selection=picked, excluded=excluded)

    def queue(self, namespace: str, name: str) -> rc.QueueReading:
        """The job's Kueue LocalQueue (blocking): one lookup per queue answers every job on
        it for QUEUE_SHARED, and jobs asking at once wait for the one lookup."""
        key = (namespace, name)
        with self._queue_guard:
            if len(self._queue_locks) > QUEUES_KEPT:
                self._forget_old_queues()
            lock = self._queue_locks.setdefault(key, threading.Lock())
        with lock:
            held = self._queues.get(key)
            if held is not None and (self.clock() - held.read_at) < QUEUE_SHARED:
                return held
            reading = self._look_up_queue(namespace, name)
            self._queues[key] = reading
            return reading

    def _forget_old_queues(self) -> None:
        """Drop the lookups no job may use again (older than QUEUE_SHARED) and their locks:
        a queue name is the tenant's word (spec.queueName), so the names are not a bounded
        set (called with `_queue_guard` held)."""
        now = self.clock()
        for key, reading in list(self._queues.items()):
            lock = self._queue_locks.get(key)
            if now - reading.read_at >= QUEUE_SHARED and (lock is None or not lock.locked()):
                del self._queues[key]
                self._queue_locks.pop(key, None)

    def _look_up_queue(self, namespace: str, name: str) -> rc.QueueReading:
        """Look a LocalQueue up by name, at the newest API version first (v1beta2, Kueue's
        preferred one since v0.15), then the one before. A missing LocalQueue is an answer;
        any other failure (not permitted, Kueue's API not served) is "unknown"."""
        detail = ""
        for version in KUEUE_VERSIONS:
            path = "/" + "/".join(
                quote(p, safe="")
                for p in ("apis", KUEUE_GROUP, version, "namespaces", namespace,
                          "localqueues", name)
            )  # fmt: skip
            try:
                self.kube.request(f"get localqueue {namespace}/{name}", "GET", path)
            except NotFound as exc:
                # a missing object names itself; an API version not served is a bare 404
                if f'"{name}" not found' in str(exc):
                    return rc.QueueReading(self.clock(), exists=False, detail=str(exc), name=name)
                detail = str(exc)
                continue
            except KubeError as exc:
                log.debug("LocalQueue %s/%s not looked up: %s", namespace, name, exc)
                return rc.QueueReading(self.clock(), exists=None, detail=str(exc), name=name)
            return rc.QueueReading(self.clock(), exists=True, name=name)
        return rc.QueueReading(self.clock(), exists=None, detail=detail, name=name)
