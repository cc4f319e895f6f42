"""The controller's runtime: watch caches in, a work queue, reconcile workers, periodic loops.

kopf handlers (handlers.py) feed this object: every RTJ event stores the newest body and
enqueues its key; pod, JobSet, node and event changes enqueue the jobs they concern, found
through kopf indexes (no API call per event). Workers take keys from a `WorkQueue` (one
reconcile per key at a time, coalesced, delayed requeues for backoffs and TTLs, rate-limited
retries on errors; a change ahead of routine looks), build a `Snapshot` from the caches, call
`reconcile.plan` and apply the plan through `kube.Kube` in a thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from pydantic import ValidationError

from rtj_operator import reconcile as rc
from rtj_operator import selection
from rtj_operator.api.reasons import Phase
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.cache import WatchCache, job_key_of, newer_or_same, rv_of
from rtj_operator.claim_sweep import ClaimSweep
from rtj_operator.controller_loops import ControllerLoops
from rtj_operator.event_reads import read_events
from rtj_operator.event_watch import EventWatch, scopes_of
from rtj_operator.job_models import JobModels
from rtj_operator.job_reads import JobReads
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import AlreadyExists, Conflict
from rtj_operator.metrics import Metrics
from rtj_operator.node_leases import NodeLeases
from rtj_operator.plan_apply import PlanApplier
from rtj_operator.policy.observed import ReadOnce
from rtj_operator.rank_polls import RankPolls
from rtj_operator.settings import Settings
from rtj_operator.store_reads import (
    Lane,
    StoreReader,
    StoreReads,
)
from rtj_operator.work_queue import WorkQueue
from rtj_shim.wire.control import job_key

MAX_RTJ_TOMBSTONES = 10_000
"""Deleted jobs remembered (by uid) so a late LIST cannot bring one back."""
log = logging.getLogger("rtj_operator.controller")

Key = tuple[str, str]
EVENT_READERS = 8
"""Threads reading a failure's Events at once (`event_reads.read_events`): a pool of their
own, as the reading thread is one of `executor`'s and the reads must not wait behind it."""
T = TypeVar("T")
CONFLICT_RETRY_SECONDS = 0.2
EXISTS_RETRY_SECONDS = 0.5
CONFLICT_RETRY_MAX_SECONDS = 10.0
WORLD_BATCH_SECONDS = 0.25
"""Pod and node changes of a job are planned at most once per this interval once its burst
(WORLD_BURST) is spent; changes in between are planned together. A world of N pods starting
or failing sends ~3N pod events, and each plan reads all N pods."""
WORLD_BATCH_FACTOR = 4.0
"""... or per this many times as long as the job's last plan took, if longer: in a storm
one job's plans take at most a fifth of the event loop, however many pods it has."""
WORLD_BURST = 3
"""Plans a job gets at once for changes after a quiet spell, before its changes are batched:
a failure that follows another change by milliseconds (a node condition, a first rank) is
not held back."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _pod_keys(body: Mapping[str, Any]) -> list[Any]:
    key, node = job_key_of(body), (body.get("spec") or {}).get("nodeName")
    attempt = rc.attempt_of(body)
    out: list[Any] = [("job", key)] if key else []
    if key and attempt is not None:  # how many of an attempt's pods remain: O(1)
        out.append(("attempt", key, attempt))
    return out + ([("node", node)] if node else [])


_TEARDOWN_PHASES = frozenset({Phase.RESTARTING.value, Phase.SUSPENDED.value})


# --- the controller ------------------------------------------------------------------------


class Controller(ControllerLoops):
    def __init__(
        self,
        kube: Kube,
        metrics: Metrics,
        settings: Settings | None = None,
        *,
        clock: Callable[[], datetime] = utcnow,
        store_reader: StoreReader = selection.read_store,
        namespaces: Iterable[str] | None = None,
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.settings = settings or Settings()
        self.clock = clock
        self.store_reader = store_reader
        self.namespaces = list(namespaces) if namespaces else None
        self.rtjs: dict[Key, dict[str, Any]] = {}
        self.job_models = JobModels()
        self.pods = WatchCache(_pod_keys, rc.trim_pod)
        self.jobsets = WatchCache(
            lambda b: [job_key_of(b)] if job_key_of(b) else [], rc.trim_jobset
        )
        self.nodes = WatchCache(lambda b: [(b.get("metadata") or {}).get("name")], rc.trim_node)
        self.deleted_nodes: set[str] = set()
        self.gone: dict[Key, dict[str, dict[str, Any]]] = {}
        self.gone_jobsets: dict[Key, dict[str, dict[str, Any]]] = {}
        self._conflicts: dict[Key, int] = {}
        self.rejections: dict[Key, rc.Rejection] = {}
        self.event_watch = EventWatch(scopes_of(self.namespaces), self._touch_event)
        self.node_leases = NodeLeases(
            self._touch_node, self._touch_all, self.clock, node_exists=self._node_exists
        )
        self.rank_polls = RankPolls(
            self.clock,
            self._progress_round,
            interval=self.settings.progress_poll_seconds,
            timeout=self.settings.progress_poll_timeout,
            concurrency=self.settings.progress_poll_concurrency,
        )
        self._rtj_tombstones: dict[str, int | None] = {}
        """uid -> resourceVersion of jobs seen deleted (bounded, oldest dropped first)."""
        self.synced = asyncio.Event()
        self.store_readings: dict[Key, rc.StoreReading] = {}
        self.queue_readings: dict[Key, rc.QueueReading] = {}
        self.queue = WorkQueue(on_wait=metrics.queue_wait.observe)
        self.listed_at: float | None = None
        """When the last LIST of every watched kind succeeded (monotonic; /readyz)."""
        self.executor = ThreadPoolExecutor(self.settings.api_threads, thread_name_prefix="rtj-api")
        self.event_readers = ThreadPoolExecutor(EVENT_READERS, thread_name_prefix="rtj-events")
        self.store_reads = StoreReads(
            store_reader,
            timeout=self.settings.store_read_timeout,
            per_store=self.settings.store_readers_per_store,
            threads=self.settings.store_readers,
        )
        self.reads = JobReads(
            kube,
            self.store_reads,
            self._io,
            self.clock,
            tuple(self.settings.operator_identity_stores),
        )
        self._tasks: list[asyncio.Task[None]] = []
        grace = timedelta(seconds=self.settings.claim_sweep_grace_seconds)
        self.claim_sweep = ClaimSweep(kube, self.namespaces, grace, self.clock)
        self.applier = PlanApplier(
            kube,
            metrics,
            self._io,
            identity=self.settings.identity,
            committed=self._remember,
            rejected=self._rejected,
        )
        self.reconciles = 0
        self._read_once = ReadOnce()
        """Pod and node views kept across plans (the caches never edit an object in place)."""
        self._plan_seconds: dict[Key, float] = {}
        """How long each job's last plan took."""
        self._next_plan: dict[Key, float] = {}
        self._held: dict[Key, float] = {}
        """Per job: when its next change may be planned (a rate limit with a burst, GCRA),
        and when a batched plan is already due (monotonic)."""
        self._managed_elsewhere: set[Key] = set()
        """Jobs whose spec.managedBy names another controller (said once in the log)."""
        self.planned_rounds: dict[Key, rc.PlannedRound] = {}
        """Per job: the progress reading its last plan was made from, and when (a poll round
        that tells nothing new costs no plan, `ControllerLoops._progress_round`)."""

    # --- inputs from the watches -----------------------------------------------------------

    def on_rtj(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key: Key = (meta.get("namespace", ""), meta.get("name", ""))
        uid = str(meta.get("uid") or "")
        if event_type == "DELETED":
            if uid:
                self._rtj_tombstones[uid] = rv_of(body)
            while len(self._rtj_tombstones) > MAX_RTJ_TOMBSTONES:
                self._rtj_tombstones.pop(next(iter(self._rtj_tombstones)))
            held = self.rtjs.get(key)
            if held is None or str((held.get("metadata") or {}).get("uid") or "") == uid:
                self._forget_job(key)
            return
        if uid and uid in self._rtj_tombstones:
            return  # a late LIST or event of a job already deleted never brings it back
        plain = rc.plain(body)
        held = self.rtjs.get(key)
        if held is not None and str((held.get("metadata") or {}).get("uid") or "") != uid:
            if not newer_or_same(plain, held):
                return
            self._forget_job(key)  # the same name, another job: it inherits nothing
            held = None
        if newer_or_same(plain, held):
            self.rtjs[key] = plain
        self.queue.add(key)

    def _forget_job(self, key: Key) -> None:
        """Drop everything remembered about a job (deleted, or replaced by a new uid)."""
        self.rtjs.pop(key, None)
        self.job_models.forget(key)
        self.planned_rounds.pop(key, None)
        self.gone.pop(key, None)
        self.gone_jobsets.pop(key, None)
        self.applier.forget(key)
        self.store_readings.pop(key, None)
        self.queue_readings.pop(key, None)
        self.queue.forget(key)
        self._conflicts.pop(key, None)
        self.rejections.pop(key, None)
        self.rank_polls.forget(key)
        self.metrics.forget_job(*key)
        for per_job in (self._plan_seconds, self._next_plan, self._held):
            per_job.pop(key, None)
        self._managed_elsewhere.discard(key)

    def on_pod(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        key = job_key_of(body)
        if key is None:
            return
        known = self.pods.holds(body)
        self.pods.apply(event_type, body)
        if event_type == "DELETED":
            name = (body.get("metadata") or {}).get("name", "")
            self.gone.setdefault(key, {})[name] = rc.trim_pod(body)
        if known and event_type not in (None, "ADDED"):
            left = self._old_world_left(key, body)
            if left is not None:  # the old world going: only its last pod gone counts
                if left == 0 and event_type == "DELETED":
                    self.queue.add(key)  # at once: the next attempt waits for it
                return
        self._world_changed(key)

    def _world_changed(self, key: Key) -> None:
        """Enqueue a job for a change of its pods or nodes: at once while its burst lasts (a
        quiet job plans a failure at once), else together with the changes that follow, at
        most once per WORLD_BATCH_SECONDS (or WORLD_BATCH_FACTOR plans' time)."""
        now = time.monotonic()
        if now < self._held.get(key, 0.0):
            return  # a plan is due already: it reads this change too
        interval = max(WORLD_BATCH_SECONDS, WORLD_BATCH_FACTOR * self._plan_seconds.get(key, 0.0))
        due = max(self._next_plan.get(key, now), now)
        self._next_plan[key] = due + interval
        early = due - (WORLD_BURST - 1) * interval
        if early <= now:
            self.queue.add(key)
        else:
            self._held[key] = early
            self.queue.add_after(key, early - now)

    def _old_world_left(self, key: Key, body: Mapping[str, Any]) -> int | None:
        """While a job waits for its old world to go (Restarting or Suspended), for a pod of
        that world (an attempt up to `status.attempt`): how many pods of its attempt remain;
        None otherwise. An update of such a pod (a deletionTimestamp, a kubelet's status) or
        its deletion while others remain changes no decision: the plan waits for the last
        one, and re-sends lost deletes and reports stuck ones on its own requeues (node
        events still enqueue). A teardown of N pods is then a few plans instead of 2N, each
        reading all N. A pod not seen before is planned as any change is: converge deletes
        one that appears late."""
        status = (self.rtjs.get(key) or {}).get("status") or {}
        current, attempt = status.get("attempt"), rc.attempt_of(body)
        if status.get("phase") not in _TEARDOWN_PHASES or not isinstance(current, int):
            return None
        if attempt is None or attempt > current:
            return None
        return self.pods.count(("attempt", key, attempt))

    def on_jobset(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        key = job_key_of(body)
        if key is not None:
            self.jobsets.apply(event_type, body)
            if event_type == "DELETED":
                name = (body.get("metadata") or {}).get("name", "")
                self.gone_jobsets.setdefault(key, {})[name] = rc.trim_jobset(body)
            self.queue.add(key)

    def on_node(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        name = (body.get("metadata") or {}).get("name", "")
        if self.nodes.apply(event_type, body):
            # only a Node seen deleted proves the machine gone (not one the cache lacks)
            if event_type == "DELETED":
                self.deleted_nodes.add(name)
            else:
                self.deleted_nodes.discard(name)
        self._touch_node(name)

    def _node_exists(self, name: str) -> bool:
        return bool(self.nodes.get(name)) and name not in self.deleted_nodes

    def _touch_all(self) -> None:
        for key in list(self.rtjs):
            self.queue.add(key)

    def _touch_node(self, name: str) -> None:
        for pod in self.pods.get(("node", name)):
            key = job_key_of(pod)
            if key is not None:
                self._world_changed(key)

    # --- observe ---------------------------------------------------------------------------

    def snapshot(self, key: Key) -> rc.Snapshot | None:
        raw = self.rtjs.get(key)
        if raw is None:
            return None
        try:
            rtj, parsed_now = self.job_models.parse(key, raw)
        except ValidationError as exc:
            log.warning("%s/%s: cannot read the job: %s", *key, exc)
            return None
        if rtj.spec.managed_elsewhere:  # nothing planned, polled, read or exported for it
            if key not in self._managed_elsewhere:
                self._managed_elsewhere.add(key)
                log.info("%s/%s: spec.managedBy is %s: left to that controller",
                         *key, rtj.spec.managed_by)  # fmt: skip
            return None
        if parsed_now:
            self.metrics.observe_job(rtj)
        pods = tuple(self.pods.get(("job", key)))
        gone = self.gone.get(key, {})
        current = rtj.status.attempt
        for name in [n for n, p in gone.items() if (rc.attempt_of(p) or 0) < current]:
            del gone[name]
        gone_pods = tuple(gone.values())
        gone_sets = self.gone_jobsets.get(key, {})
        for name in [n for n, js in gone_sets.items() if (rc.attempt_of(js) or 0) < current]:
            del gone_sets[name]
        node_names = {
            n for p in (*pods, *gone_pods) if (n := (p.get("spec") or {}).get("nodeName"))
        }
        node_names |= {q.node for q in rtj.status.quarantined_nodes}  # claims to keep holding
        nodes = {}
        for name in node_names:
            found = self.nodes.get(name)
            if found:
                nodes[name] = found[0]
        jobsets = tuple(self.jobsets.get(key))
        return rc.Snapshot(
            rtj=rtj,
            resource_version=str((raw.get("metadata") or {}).get("resourceVersion", "")),
            jobsets=jobsets,
            pods=pods,
            gone_pods=gone_pods,
            gone_jobsets=tuple(gone_sets.values()),
            nodes=nodes,
            deleted_nodes=frozenset(node_names & self.deleted_nodes),
            events=None,
            now=self.clock(),
            store=self.store_readings.get(key),
            stored_status=raw.get("status") or {},
            queue=self.queue_readings.get(key),
            node_health=self.settings.node_health,
            node_leases=self.node_leases.of(node_names),
            rejection=self.rejections.get(key),
            partition=self.node_leases.partition,
            ranks=self.rank_polls.reading(key),
            resolver_image=self.settings.resolver_image,
            preflight=self.settings.preflight,
            intervals=self.settings.intervals,
            control_key=self._control_key(rtj.metadata.uid),
            read_once=self._read_once,
            accepted_deletes=self.applier.accepted(key, (rc.pod_name(p) for p in pods)),
        )

    def _control_key(self, uid: str) -> str | None:
        secret = self.settings.control_secret
        return job_key(secret, uid) if secret and uid else None

    # --- reconcile -------------------------------------------------------------------------

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def read_store(
        self, rtj: ResilientTrainingJob, lane: Lane = Lane.RESTART
    ) -> rc.StoreReading:
        return await self.reads.store(rtj, lane)

    def _keep_reading(self, key: Key, reading: rc.StoreReading) -> None:
        """Keep the newest reading of a job's store (by when it started): a slow background
        refresh finishing after a restart's own read never replaces it with older news."""
        held = self.store_readings.get(key)
        if held is None or reading.read_at >= held.read_at:
            self.store_readings[key] = reading

    def read_queue(self, namespace: str, name: str) -> rc.QueueReading:
        return self.reads.queue(namespace, name)

    async def reconcile(self, key: Key) -> float | None:
        """One reconcile; returns seconds until the key should be looked at again."""
        started = time.monotonic()
        result = "ok"
        try:
            snap = self.snapshot(key)
            if snap is None:
                return None
            plan = rc.plan(snap)
            self._plan_seconds[key] = time.monotonic() - started
            for _ in range(3):  # at most one store reading, one events read, one queue lookup
                if plan.needs_events:
                    events = await self.failure_events(snap)
                    # the failure is decided now, not when the first look began: the reads
                    # can take seconds on a busy API server, and detectionSeconds shows them
                    # (a store or queue reading keeps the look's time: its age is judged
                    # from it, and a slow read is not stale on arrival)
                    snap = replace(snap, events=events, now=self.clock())
                elif plan.needs_store:
                    reading = await self.read_store(snap.rtj)
                    self._keep_reading(key, reading)
                    snap = rc.with_store(snap, reading)
                elif plan.needs_queue:
                    looked_up = await self._io(
                        self.read_queue, snap.rtj.metadata.namespace, plan.needs_queue
                    )
                    self.queue_readings[key] = looked_up
                    snap = rc.with_queue(snap, looked_up)
                else:
                    break
                plan = rc.plan(snap)
            if plan.summary:
                log.info("%s/%s: %s", *key, plan.summary)
            try:
                await self.apply(key, snap, plan)
            except (Conflict, AlreadyExists) as exc:
                # decided from a stale read: the watch brings the newer object (and enqueues
                # the job at once); this retry is the fallback, backing off per job
                result = "conflict"
                first = (
                    CONFLICT_RETRY_SECONDS if isinstance(exc, Conflict) else EXISTS_RETRY_SECONDS
                )
                return self._conflict_delay(key, first)
            if plan.status_patch is not None:
                self._conflicts.pop(key, None)  # a decision committed: progress
            self.planned_rounds[key] = rc.planned_round(snap)
            return plan.requeue_after
        except Exception:
            result = "error"
            raise
        finally:
            self.reconciles += 1
            self.metrics.record_reconcile(result, time.monotonic() - started)

    def _conflict_delay(self, key: Key, first: float) -> float:
        """`first`, doubling with each conflict in a row for this job, up to
        CONFLICT_RETRY_MAX_SECONDS; reset once one of its decisions is committed."""
        n = self._conflicts.get(key, 0)
        self._conflicts[key] = n + 1
        return float(min(first * 2.0**n, CONFLICT_RETRY_MAX_SECONDS))

    async def apply(self, key: Key, snap: rc.Snapshot, plan: rc.Plan) -> None:
        await self.applier.apply(key, snap, plan)
        patch = plan.status_patch
        if patch is not None and "inPlace" in patch.patch:
            self.rank_polls.poke()  # an in-place restart moved on: its orders go out now

    @property
    def _posting(self) -> set[asyncio.Task[None]]:
        return self.applier.posting

    def _rejected(self, key: Key, rejection: rc.Rejection) -> None:
        self.rejections[key] = rejection
        self.queue.add(key)  # the next plan says so in a condition

    def _remember(self, key: Key, body: Mapping[str, Any]) -> None:
        if body and newer_or_same(body, self.rtjs.get(key)):
            self.rtjs[key] = raw = dict(body)
            with contextlib.suppress(ValidationError):
                self.metrics.observe_job(self.job_models.parse(key, raw)[0])

    def read_events(self, snap: rc.Snapshot) -> list[dict[str, Any]]:
        """Events about the failed attempt (blocking; see `event_reads.read_events`)."""
        return read_events(self.kube, snap, self.event_readers.map)
