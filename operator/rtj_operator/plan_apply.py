"""Applying a plan: the thin I/O after `reconcile.plan` decided.

Actions go out in the plan's order: the status patch that commits a decision first, then
what follows from it (deletes of the old world, the next JobSet, taints), so a crash between
two of them leaves a committed intent the next reconcile completes idempotently. Events are
posted in the background (a decision never waits for its Event) and metric records are
counted once the plan has been applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import AlreadyExists, Forbidden, Invalid, KubeError, NotFound
from rtj_operator.metrics import Metrics

log = logging.getLogger("rtj_operator.controller")
Key = tuple[str, str]
T = TypeVar("T")
EVENT_POSTS_AT_ONCE = 8


class PlanApplier:
    """Sends a plan's actions through `Kube` (blocking calls run by `io` on the API threads).

    `committed(key, body)`: the status patch landed (the returned object is the newest);
    `rejected(key, rejection)`: the API server refused the JobSet of the plan (invalid, or an
    admission webhook): the next plan reports it in a condition instead of retrying."""

    def __init__(
        self,
        kube: Kube,
        metrics: Metrics,
        io: Callable[..., Awaitable[Any]],
        *,
        identity: str,
        committed: Callable[[Key, Mapping[str, Any]], None],
        rejected: Callable[[Key, rc.Rejection], None],
    ) -> None:
        self.kube, self.metrics, self.identity = kube, metrics, identity
        self._io = io
        self._committed, self._rejected = committed, rejected
        self._event_slots = asyncio.Semaphore(EVENT_POSTS_AT_ONCE)
        self.posting: set[asyncio.Task[None]] = set()
        self._accepted: dict[Key, dict[str, rc.AcceptedDelete]] = {}

    def accepted(self, key: Key, live: Iterable[str]) -> dict[str, rc.AcceptedDelete]:
        """The pod deletes of this job the API server accepted, for the pods in `live` (the
        watch cache's); those of pods gone from it are forgotten (they need none again)."""
        known = self._accepted.get(key)
        if not known:
            return {}
        kept = {name: known[name] for name in live if name in known}
        if len(kept) < len(known):
            self._accepted[key] = kept
        return dict(kept)

    def forget(self, key: Key) -> None:
        self._accepted.pop(key, None)

    async def drain_events(self, timeout: float) -> None:
        """Let Events of decisions already committed go out (bounded)."""
        if self.posting:
            await asyncio.wait(list(self.posting), timeout=timeout)

    def _involved(self, snap: rc.Snapshot) -> dict[str, Any]:
        meta = snap.rtj.metadata
        return {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND,
            "name": meta.name,
            "namespace": meta.namespace,
            "uid": meta.uid,
        }

    async def _delete(self, key: Key, action: rc.DeleteJobSet | rc.DeletePod) -> None:
        namespace = key[0]
        if isinstance(action, rc.DeleteJobSet):
            await self._io(self.kube.delete_jobset, namespace, action.name)
            return
        await self._io(self.kube.delete_pod, namespace, action.name, action.grace_seconds)
        if action.uid:  # accepted, or already gone: the next plans need not send it again
            accepted = rc.AcceptedDelete(action.uid, action.grace_seconds)
            self._accepted.setdefault(key, {})[action.name] = accepted

    async def apply(self, key: Key, snap: rc.Snapshot, plan: rc.Plan) -> None:
        """Apply the plan's actions in order; a run of consecutive deletes (the old world's
        JobSet and pods) goes out concurrently. The plan stops at the first error, except
        that once its status patch is committed a failed delete still lets the decision's
        Events and metrics out (the next reconcile re-sends deletes, never the decision)."""
        namespace, name = key
        kube = self.kube
        actions = list(plan.actions)
        patches = any(isinstance(a, rc.PatchStatus) for a in actions)
        committed = not patches
        counted = False
        failed: BaseException | None = None
        i = 0
        while i < len(actions):
            action = actions[i]
            i += 1
            if failed is not None and not isinstance(action, rc.PostEvent):
                continue
            if isinstance(action, (rc.DeleteJobSet, rc.DeletePod)):
                batch: list[rc.DeleteJobSet | rc.DeletePod] = [action]
                while i < len(actions):
                    following = actions[i]
                    if not isinstance(following, (rc.DeleteJobSet, rc.DeletePod)):
                        break
                    batch.append(following)
                    i += 1
                results = await asyncio.gather(
                    *(self._delete(key, a) for a in batch), return_exceptions=True
                )
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors and not committed:
                    raise errors[0]
                failed = errors[0] if errors else None
            elif isinstance(action, rc.CreateKeySecret):
                with contextlib.suppress(AlreadyExists):  # made for an earlier attempt
                    await self._io(kube.create_secret, namespace, action.body)
            elif isinstance(action, rc.CreateJobSet):
                try:
                    await self._io(kube.create_jobset, namespace, action.body)
                except (Invalid, Forbidden) as exc:
                    if isinstance(exc, Forbidden) and "admission webhook" not in str(exc):
                        raise  # not permitted: the operator's RBAC, not the job's spec
                    jobset = str((action.body.get("metadata") or {}).get("name", ""))
                    generation = snap.rtj.metadata.generation
                    log.warning("%s/%s: JobSet %s refused: %s", *key, jobset, exc)
                    self._rejected(key, rc.Rejection(jobset, generation, str(exc)))
                    return
            elif isinstance(action, (rc.TaintNode, rc.UntaintNode)):
                edit = rc.claim if isinstance(action, rc.TaintNode) else rc.release
                who = rc.Claimant(action.job, action.uid)
                await self._io(
                    kube.edit_node,
                    action.node,
                    lambda t, a, x=action.taint, e=edit, w=who: e(t, a, x, w),
                    keys.QUARANTINE_OWNERS_ANNOTATION,
                )
            elif isinstance(action, rc.DeleteJob):  # ttlSecondsAfterFinished
                with contextlib.suppress(NotFound):  # already gone
                    await self._io(kube.delete_rtj, namespace, name, action.uid, action.propagation)
            elif isinstance(action, rc.SetFinalizer):
                meta = snap.rtj.metadata
                await self._io(
                    kube.set_rtj_finalizer, namespace, name, meta.uid, action.name, action.present
                )
            elif isinstance(action, rc.PatchStatus):
                try:
                    new = await self._io(
                        kube.patch_rtj_status,
                        namespace,
                        name,
                        action.patch,
                        action.resource_version,
                    )
                except NotFound:
                    return
                committed = True
                self._committed(key, new)
                # The decision's counters move with its record, not after the actions that
                # follow it: a reader who sees the status sees them, and a later action's
                # error (retried from the new status, which plans no second count) loses none.
                if not counted:
                    self._record(key, plan.metrics)
                    counted = True
            elif isinstance(action, rc.PostEvent):
                self._post_later(key, self._involved(snap), action)
        if not patches:
            self._record(key, plan.metrics)
        if failed is not None:
            raise failed

    def _post_later(self, key: Key, involved: dict[str, Any], event: rc.PostEvent) -> None:
        """Events go out in the background: a decision never waits for its Event."""

        async def post() -> None:
            async with self._event_slots:
                try:
                    await self._io(
                        lambda: self.kube.post_event(
                            involved, event.type, event.reason, event.message,
                            instance=self.identity,
                        )
                    )  # fmt: skip
                except KubeError as exc:
                    log.warning("%s/%s: event %s not posted: %s", *key, event.reason, exc)

        task = asyncio.get_running_loop().create_task(post())
        self.posting.add(task)
        task.add_done_callback(self.posting.discard)

    def _record(self, key: Key, records: Iterable[rc.MetricRecord]) -> None:
        m = self.metrics
        for r in records:
            cls = r.failure_class
            if r.kind == "failure" and cls is not None:
                m.record_failure(*key, cls)
            elif r.kind == "restart" and cls is not None:
                m.record_restart(*key, cls, in_place=r.in_place)
            elif r.kind == "detection" and cls is not None:
                m.record_detection(cls, r.value)
            elif r.kind == "recovery" and cls is not None:
                m.record_recovery(cls, r.value)
            elif r.kind == "lost_steps":
                m.record_lost_steps(*key, int(r.value))
            elif r.kind == "ledger_phase" and r.phase is not None and r.path is not None:
                m.ledger.record_phase(r.phase, r.path, r.value)
            elif r.kind == "steps_retrained" and r.path is not None:
                m.ledger.record_retrained(r.path, int(r.value))
