"""The controller's runtime loops: list then watch (the startup LIST and every resync), the
reconcile workers, the checkpoint refresh, the progress poller and the sweep of orphaned
quarantine claims, and how they start and stop. A base of `controller.Controller`, which
holds the caches, the queue and the reconcile these loops drive (declared below for the type
checker)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from pydantic import ValidationError

from rtj_operator import reconcile as rc
from rtj_operator import selection
from rtj_operator.api.reasons import Phase
from rtj_operator.api.resource import ResilientTrainingJob
from rtj_operator.cache import WatchCache, job_key_of, rv_of, uid_of
from rtj_operator.claim_sweep import ClaimSweep
from rtj_operator.event_reads import EventKey, cached_events
from rtj_operator.event_watch import EventWatch
from rtj_operator.job_models import JobModels
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import KubeError
from rtj_operator.metrics import Metrics
from rtj_operator.node_leases import NodeLeases
from rtj_operator.plan_apply import PlanApplier
from rtj_operator.rank_polls import JobTargets, RankPolls
from rtj_operator.reconcile.world import REPLICA_PATH
from rtj_operator.settings import Settings
from rtj_operator.store_reads import Lane, StoreReads, store_key
from rtj_operator.work_queue import WorkQueue

log = logging.getLogger("rtj_operator.controller")

Key = tuple[str, str]
T = TypeVar("T")
STARTUP_RESYNC_SECONDS = 30.0
"""A second LIST soon after startup drops objects deleted while the watches started."""


class ControllerLoops:
    """The loops of a `Controller` (see the module's docstring)."""

    kube: Kube
    settings: Settings
    namespaces: list[str] | None
    rtjs: dict[Key, dict[str, Any]]
    job_models: JobModels
    pods: WatchCache
    jobsets: WatchCache
    nodes: WatchCache
    deleted_nodes: set[str]
    queue: WorkQueue
    synced: asyncio.Event
    listed_at: float | None
    node_leases: NodeLeases
    event_watch: EventWatch
    rank_polls: RankPolls
    store_reads: StoreReads
    applier: PlanApplier
    claim_sweep: ClaimSweep
    metrics: Metrics
    clock: Callable[[], datetime]
    planned_rounds: dict[Key, rc.PlannedRound]
    executor: ThreadPoolExecutor
    event_readers: ThreadPoolExecutor
    _tasks: list[asyncio.Task[None]]

    def on_rtj(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        raise NotImplementedError

    async def reconcile(self, key: Key) -> float | None:
        raise NotImplementedError

    def snapshot(self, key: Key) -> rc.Snapshot | None:
        raise NotImplementedError

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    async def read_store(
        self, rtj: ResilientTrainingJob, lane: Lane = Lane.RESTART
    ) -> rc.StoreReading:
        raise NotImplementedError

    def _keep_reading(self, key: Key, reading: rc.StoreReading) -> None:
        raise NotImplementedError

    def read_events(self, snap: rc.Snapshot) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _world_changed(self, key: Key) -> None:
        raise NotImplementedError

    def _touch_node(self, name: str) -> None:
        raise NotImplementedError

    # --- the Events a failure reads ----------------------------------------------------------

    async def failure_events(self, snap: rc.Snapshot) -> tuple[dict[str, Any], ...]:
        """The Events about a failed attempt: from the watch's cache when it is synced (no
        API call), else by LISTs in a thread."""
        if self.settings.watch_events and self.event_watch.synced:
            return tuple(cached_events(self.event_watch.about, snap))
        return tuple(await self._io(self.read_events, snap))

    def _touch_event(self, about: EventKey, uid: str) -> None:
        """A kept Event arrived: plan the job whose pod or JobSet (by uid), or whose pods'
        node, it is about; it may have landed after the change that began a classification."""
        namespace, kind, name = about
        if kind == "Node":
            self._touch_node(name)
            return
        cache = {"Pod": self.pods, "JobSet": self.jobsets}.get(kind)
        cached = cache.by_uid(uid) if cache is not None and uid else None
        key = job_key_of(cached) if cached is not None else None
        if key is not None and key[0] == namespace:
            self._world_changed(key)

    # --- list, then watch --------------------------------------------------------------------

    def _list(self, kind: str) -> tuple[list[dict[str, Any]], int | None]:
        """Every object of `kind` the operator watches, and the oldest list resourceVersion."""
        items: list[dict[str, Any]] = []
        versions: list[int] = []
        scopes: list[str | None] = list(self.namespaces) if self.namespaces else [None]
        trim = {"pods": rc.trim_pod, "jobsets": rc.trim_jobset, "nodes": rc.trim_node}.get(kind)
        for namespace in scopes:
            found, rv = self.kube.list_kind(kind, namespace, trim)
            items += found
            if rv is not None:
                versions.append(rv)
        return items, min(versions) if versions else None

    async def sync(self) -> None:
        """LIST pods, JobSets, nodes and jobs into the caches (startup and resync)."""
        results = await asyncio.gather(
            *(self._io(self._list, kind) for kind in ("pods", "jobsets", "nodes", "rtjs"))
        )
        (pods, pods_rv), (jobsets, js_rv), (nodes, nodes_rv), (rtjs, rtjs_rv) = results
        for pod in self.pods.replace(pods, pods_rv):
            key = job_key_of(pod)
            if key is not None:
                self.queue.add(key)
        for js in self.jobsets.replace(jobsets, js_rv):
            key = job_key_of(js)
            if key is not None:
                self.queue.add(key)
        listed_nodes = {(n.get("metadata") or {}).get("name", "") for n in nodes}
        for gone_node in self.nodes.replace(nodes, nodes_rv):
            self.deleted_nodes.add((gone_node.get("metadata") or {}).get("name", ""))
        self.deleted_nodes -= listed_nodes
        listed = set()
        for body in rtjs:
            meta = body.get("metadata") or {}
            listed.add((meta.get("namespace", ""), meta.get("name", "")))
            self.on_rtj(None, body)
        for key in [k for k in self.rtjs if k not in listed]:
            cached_rv = rv_of(self.rtjs[key])
            # a job created after the LIST's snapshot is not gone: its watch event was newer
            if rtjs_rv is None or cached_rv is None or cached_rv <= rtjs_rv:
                self.on_rtj("DELETED", self.rtjs[key])
        self.listed_at = time.monotonic()
        self.synced.set()

    # --- loops -----------------------------------------------------------------------------

    async def _worker(self) -> None:
        await self.synced.wait()
        while True:
            key = await self.queue.get()
            try:
                again = await self.reconcile(key)
                self.queue.forget_failures(key)
                if again is not None:
                    self.queue.add_after(key, again)
            except asyncio.CancelledError:
                raise
            except Exception:
                delay = self.queue.add_rate_limited(key)
                log.exception("%s/%s: reconcile failed; retrying in %.1fs", *key, delay)
            finally:
                self.queue.done(key)

    async def _resync(self) -> None:
        """List everything again: heals missed watch events; first soon after startup."""
        while not self.synced.is_set():
            try:
                await self.sync()
            except KubeError as exc:
                log.warning("initial listing failed (%s); retrying", exc)
                await asyncio.sleep(2.0)
        delay = min(self.settings.resync_seconds, STARTUP_RESYNC_SECONDS)
        while True:
            await asyncio.sleep(delay)
            delay = self.settings.resync_seconds
            try:
                await self.sync()
            except KubeError as exc:
                log.warning("resync listing failed: %s", exc)
            for key in list(self.rtjs):
                self.queue.add_routine(key)

    async def _refresh_checkpoints(self) -> None:
        """Periodically read s3:// stores of running jobs: checkpoint age and metrics."""
        while True:
            await asyncio.sleep(self.settings.checkpoint_refresh_seconds)
            jobs = []
            for key, raw in list(self.rtjs.items()):
                try:
                    rtj, _ = self.job_models.parse(key, raw)
                except ValidationError:
                    continue
                active = rtj.status.phase in (Phase.RUNNING, Phase.ADMITTED)
                if rtj.spec.managed_elsewhere:
                    continue  # its status is another controller's (MultiKueue's copy)
                if active and selection.operator_reads_store(rtj.spec.checkpoint.uri):
                    jobs.append((key, rtj))

            async def refresh(key: Key, rtj: ResilientTrainingJob) -> None:
                ckpt = rtj.spec.checkpoint
                name = ckpt.credentials_secret_name
                secret = name and f"{key[0]}/{name}"
                if self.store_reads.resting(store_key(ckpt.uri, secret or None)):
                    return  # failed recently: the restart lane still reads it when needed
                self._keep_reading(key, await self.read_store(rtj, Lane.REFRESH))
                self.queue.add_routine(key)

            await asyncio.gather(*(refresh(k, r) for k, r in jobs), return_exceptions=True)

    async def _sweep_claims(self) -> None:
        """Periodically release the quarantine claims of jobs that are gone without releasing
        them (`claim_sweep`): the nodes as cached now, the jobs listed afresh after."""
        await self.synced.wait()
        while True:
            await asyncio.sleep(self.settings.claim_sweep_seconds)
            nodes = self.nodes.all()
            known = {uid_of(raw) for raw in list(self.rtjs.values())}
            try:
                await self._io(self.claim_sweep.run, nodes, known)
            except KubeError as exc:
                log.warning("quarantine claim sweep failed: %s", exc)

    def start(self) -> None:
        """Start the workers and loops on the running event loop."""
        if self._tasks:
            return
        for i in range(self.settings.workers):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"rtj-worker-{i}"))
        self._tasks.append(asyncio.create_task(self._resync(), name="rtj-resync"))
        if self.settings.watch_events:
            self._tasks.append(
                asyncio.create_task(self.event_watch.run(self.kube), name="rtj-event-watch")
            )
        if self.settings.watch_node_leases:
            self._tasks.append(
                asyncio.create_task(self.node_leases.run(self.kube), name="rtj-node-leases")
            )
        if self.settings.checkpoint_refresh_seconds > 0:
            self._tasks.append(
                asyncio.create_task(self._refresh_checkpoints(), name="rtj-checkpoints")
            )
        if self.settings.progress_poll_seconds > 0:
            self._tasks.append(
                asyncio.create_task(self._poll_progress(), name="rtj-progress-polls")
            )
        if self.settings.claim_sweep_seconds > 0:
            self._tasks.append(asyncio.create_task(self._sweep_claims(), name="rtj-claim-sweep"))

    async def _poll_progress(self) -> None:
        await self.synced.wait()
        await self.rank_polls.run(self.progress_targets)

    def progress_targets(self) -> list[JobTargets]:
        """What the progress poller reads this round: per job, its running worker pods."""
        out = []
        for key in list(self.rtjs):
            snap = self.snapshot(key)
            if snap is None:
                continue
            targets = rc.poll_targets(snap)
            if targets:
                stragglers = snap.rtj.spec.progress.stragglers
                sent = rc.pod_messages(snap, targets)
                if sent.ring_note and any(
                    m.path == REPLICA_PATH for ms in sent.messages.values() for m in ms
                ):  # said when assignments go out, not every round
                    log.info("%s/%s: peer replica: %s", *key, sent.ring_note)
                out.append(JobTargets(key, targets, stragglers.ratio, stragglers.windows,
                                      sent.messages, snap.control_key))  # fmt: skip
        return out

    def _progress_round(self, key: Key) -> None:
        """A poll round read this job's ranks: export what they said, and judge it, unless
        the round tells its last plan nothing new (`reconcile.round_has_news`: steps that
        only advanced, no rank near its allowance, no pod newly silent or answering). A job
        whose pods never answer costs one plan, one whose ranks train one per 30 s."""
        reading = self.rank_polls.reading(key)
        now = self.clock()
        facts = rc.progress_facts(reading, now) if reading is not None else None
        self.metrics.observe_progress(*key, facts)
        planned = self.planned_rounds.get(key)
        if (
            reading is not None
            and planned is not None
            and not rc.round_has_news(planned, reading, now)
        ):
            return
        self.queue.add_routine(key)  # judged after every change in any job's world

    def dead_loops(self) -> tuple[str, ...]:
        """The workers and loops that ended with an error (a cancelled one is stopping)."""
        return tuple(
            t.get_name() for t in self._tasks
            if t.done() and not t.cancelled() and t.exception() is not None
        )  # fmt: skip

    def halt(self) -> None:
        """Stop acting at once (the lease is lost): cancel every worker and loop."""
        for task in self._tasks:
            task.cancel()

    async def stop(self) -> None:
        """Cancel the workers first (nothing new is decided or applied), then let Events of
        decisions already committed go out (bounded), then close."""
        self.halt()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.applier.drain_events(timeout=5)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.event_readers.shutdown(wait=False, cancel_futures=True)
        self.store_reads.shutdown()
        self.rank_polls.close()
