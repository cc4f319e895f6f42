"""The Events the classifier reads, kept in memory by the object they are about. Pure data;
fed by `event_watch` (a LIST, then a WATCH), read by `event_reads.cached_events`.

Only Events `event_reads.relevant_event` keeps are offered here (the few reasons the
classifier reads, and Node Events only from the node's own reporters), trimmed. What a
tenant writes is bounded where it can only cost itself: at most `per_object` Events per
object (the newest written), at most `per_namespace` objects per namespace (the one written
longest ago goes first). A namespace's Events are its own tenant's and the cluster's
controllers'; Node Events are keyed under namespace "" and count only from `default`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from rtj_operator.event_reads import EventKey, event_key

MAX_EVENTS_PER_OBJECT = 16
"""Newest Events kept about one pod, JobSet, Workload or node (a classification reads a
handful; the API server's own dedup keeps repeats in one Event's `count`)."""
MAX_OBJECTS_PER_NAMESPACE = 4096
"""Objects with Events kept per namespace: a tenant writing Events about made-up names
evicts only its own namespace's oldest."""

Json = Mapping[str, Any]


def _uid(body: Json) -> str:
    meta = body.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


class EventCache:
    """Events by the object they are about, bounded (see the module). Not thread-safe: one
    thread (the event loop) applies and reads."""

    def __init__(
        self,
        per_object: int = MAX_EVENTS_PER_OBJECT,
        per_namespace: int = MAX_OBJECTS_PER_NAMESPACE,
    ) -> None:
        self.per_object = per_object
        self.per_namespace = per_namespace
        self.synced = False
        """Whether this holds every kept Event the API server has (a LIST applied and its
        watch unbroken since); readers LIST instead while it does not."""
        self._events: dict[EventKey, OrderedDict[str, dict[str, Any]]] = {}
        self._key_of: dict[str, EventKey] = {}
        self._objects: dict[str, OrderedDict[EventKey, None]] = {}

    def __len__(self) -> int:
        return len(self._key_of)

    def about(self, key: EventKey) -> list[dict[str, Any]]:
        """The Events kept about one object, oldest written first."""
        return list(self._events.get(key, {}).values())

    def apply(self, event_type: str, body: Json) -> EventKey | None:
        """One watch event (an Event kept by the reader's filter); returns the object it is
        about, None when it changed nothing kept."""
        uid = _uid(body)
        if event_type == "DELETED":
            return self._drop(uid)
        key = event_key(body)
        if key is None:
            return None
        held = self._key_of.get(uid)
        if held is not None and held != key:
            self._drop(uid)
        events = self._events.setdefault(key, OrderedDict())
        events[uid] = dict(body)
        events.move_to_end(uid)
        self._key_of[uid] = key
        while len(events) > self.per_object:
            self._key_of.pop(events.popitem(last=False)[0], None)
        objects = self._objects.setdefault(key[0], OrderedDict())
        objects[key] = None
        objects.move_to_end(key)
        while len(objects) > self.per_namespace:
            self._forget(objects.popitem(last=False)[0])
        return key

    def replace(self, bodies: Iterable[Json]) -> None:
        """What a LIST says: every kept Event as it is now (the old ones dropped); synced."""
        self._events.clear()
        self._key_of.clear()
        self._objects.clear()
        for body in bodies:
            self.apply("ADDED", body)
        self.synced = True

    def _drop(self, uid: str) -> EventKey | None:
        key = self._key_of.pop(uid, None)
        if key is None:
            return None
        events = self._events.get(key)
        if events is not None:
            events.pop(uid, None)
            if not events:
                self._forget(key)
        return key

    def _forget(self, key: EventKey) -> None:
        for uid in self._events.pop(key, {}):
            self._key_of.pop(uid, None)
        objects = self._objects.get(key[0])
        if objects is not None:
            objects.pop(key, None)
            if not objects:
                del self._objects[key[0]]
