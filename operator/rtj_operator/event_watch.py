"""The Events the classifier reads, watched: a failure reads them from memory, not by LISTs.

Why a watch: the API server answers an Event LIST by name by scanning every Event of the
namespace (field selectors on Events are not indexed), so with many jobs in a namespace each
failure's reads grew with all of them: about 100 ms a LIST at 12,000 Events, and at 1,000
jobs with a fault a second the reads queued for 25 s (`bench/results/operator-scale-jobs.md`).
A watch is one stream; only the few Events the classifier reads are kept
(`event_reads.relevant_event`, filtered in the watch's thread before the event loop sees
them), bounded per object and per namespace (`event_cache`).

Thin I/O around `EventCache`: per scope (the whole cluster, or each watched namespace and
`default` for Node Events), a thread LISTs, then WATCHes from the list's resourceVersion,
and hands what it keeps to the event loop. A kept Event that arrives wakes the jobs it is
about (an Event can land after the pod change that started a classification). While a
scope is not synced (before its first LIST, after a broken watch, without the `watch`
permission) a failure's Events are read by LISTs as before (`event_reads.read_events`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rtj_operator import reconcile as rc
from rtj_operator.event_cache import EventCache
from rtj_operator.event_reads import EventKey, relevant_event
from rtj_operator.kube import Kube
from rtj_operator.kube_errors import Forbidden, KubeError
from rtj_operator.policy.node_event_sources import NODE_EVENT_NAMESPACE

log = logging.getLogger("rtj_operator.event_watch")

RETRY_SECONDS = 2.0
FORBIDDEN_RETRY_SECONDS = 60.0
WATCH_SECONDS = 60
"""`timeoutSeconds` of each watch request; the next one resumes from the last version seen.
Shorter than the idle limit, so a scope where nothing is written ends each watch on the
server's word, not as a dead stream. kube-apiserver keeps no watch cache for Events
(`DefaultWatchCacheSizes`, pkg/kubeapiserver/default_storage_factory_builder.go: events 0),
so an Event watch is served from etcd: no bookmarks (none in 90 s in the 1,000-job bench),
and a quiet scope's last version is compacted away within minutes: 410, list again at once."""
GONE = 410
WATCH_IDLE_SECONDS = 90.0
"""Nothing for this long, and the server has not ended the watch: the stream is dead; not
synced until a LIST again."""


def scopes_of(namespaces: list[str] | None) -> list[str | None]:
    """Where to watch: the whole cluster, or each watched namespace and `default` (where
    the node's own reporters write about nodes)."""
    if not namespaces:
        return [None]
    return list(dict.fromkeys([*namespaces, NODE_EVENT_NAMESPACE]))


def kept(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The trimmed Event if the classifier reads it, else None."""
    return rc.trim_event(body) if relevant_event(body) else None


class EventWatch:
    def __init__(self, scopes: list[str | None], touch: Callable[[EventKey, str], None]) -> None:
        self.caches = {scope: EventCache() for scope in scopes}
        self._touch = touch
        """Told of each kept Event that arrives: (what it is about, the object's uid)."""
        self._stop = threading.Event()

    @property
    def synced(self) -> bool:
        return all(cache.synced for cache in self.caches.values())

    def about(self, key: EventKey) -> list[dict[str, Any]]:
        return [e for cache in self.caches.values() for e in cache.about(key)]

    def __len__(self) -> int:
        return sum(len(cache) for cache in self.caches.values())

    def apply(self, scope: str | None, event_type: str, body: Mapping[str, Any]) -> None:
        """A kept Event from the watch (on the event loop)."""
        key = self.caches[scope].apply(event_type, body)
        if key is not None and event_type != "DELETED":
            obj = body.get("involvedObject") or body.get("regarding") or {}
            self._touch(key, str(obj.get("uid") or ""))

    def _unsynced(self, scope: str | None) -> None:
        self.caches[scope].synced = False

    def _follow(self, kube: Kube, scope: str | None, loop: asyncio.AbstractEventLoop) -> None:
        """LIST, then WATCH from its resourceVersion, resuming each watch where the last
        ended; any error: not synced, list again (thread)."""
        where = scope or "every namespace"
        while not self._stop.is_set():
            try:
                items, listed = kube.list_kind(
                    "events", scope, trim=rc.trim_event, keep=relevant_event
                )
                loop.call_soon_threadsafe(self.caches[scope].replace, items)
                version = None if listed is None else str(listed)
                while not self._stop.is_set():
                    version = self._watch_once(kube, scope, version, loop)
            except Forbidden as exc:
                loop.call_soon_threadsafe(self._unsynced, scope)
                log.warning("Events in %s not watchable (%s): a failure reads them by LIST; "
                            "retrying", where, exc)  # fmt: skip
                self._stop.wait(FORBIDDEN_RETRY_SECONDS)
            except KubeError as exc:
                loop.call_soon_threadsafe(self._unsynced, scope)
                if exc.status == GONE:  # the last version seen is compacted: list now
                    log.debug("Event watch in %s: %s; listing again", where, exc)
                    continue
                log.info("Event watch in %s ended (%s); listing again", where, exc)
                self._stop.wait(RETRY_SECONDS)
            except RuntimeError:  # the event loop closed under us: the operator is stopping
                return

    def _watch_once(
        self, kube: Kube, scope: str | None, version: str | None, loop: asyncio.AbstractEventLoop
    ) -> str | None:
        """One watch request; returns the last resourceVersion it delivered."""
        for event_type, body in kube.watch_kind(
            "events", scope, version, WATCH_SECONDS, WATCH_IDLE_SECONDS
        ):
            version = (body.get("metadata") or {}).get("resourceVersion") or version
            if event_type != "BOOKMARK" and (trimmed := kept(body)) is not None:
                loop.call_soon_threadsafe(self.apply, scope, event_type, trimmed)
            if self._stop.is_set():
                break
        return version

    async def run(self, kube: Kube) -> None:
        loop = asyncio.get_running_loop()
        for scope in self.caches:
            threading.Thread(
                target=self._follow,
                args=(kube, scope, loop),
                daemon=True,
                name=f"rtj-events-{scope or 'all'}",
            ).start()
        try:
            await asyncio.Event().wait()  # until cancelled with the operator
        finally:
            self._stop.set()
