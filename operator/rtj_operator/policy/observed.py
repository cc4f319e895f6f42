"""Plain Kubernetes JSON (pods, nodes, events) read into small frozen views.

The classifier reasons over these views, never over raw dicts, so every field it relies on
is named once, here, with the path the API server writes it at. Missing or malformed fields
read as "unknown" (None / empty), never as an exception: a half-written pod status must not
crash the classifier.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from rtj_operator.api.keys import JOB_COMPLETION_INDEX

Json = Mapping[str, Any]


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 timestamp as the API server writes it, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _get(obj: object, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _list(value: object) -> list[Json]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


@dataclass(frozen=True)
class ConditionView:
    type: str
    status: str
    reason: str
    message: str
    since: datetime | None
    heartbeat: datetime | None = None
    """`lastHeartbeatTime` (node conditions): when its reporter last wrote it."""

    @classmethod
    def read(cls, raw: Json) -> ConditionView:
        return cls(
            _str(raw.get("type")),
            _str(raw.get("status")),
            _str(raw.get("reason")),
            _str(raw.get("message")),
            parse_time(raw.get("lastTransitionTime")),
            parse_time(raw.get("lastHeartbeatTime")),
        )


@dataclass(frozen=True)
class Termination:
    """`state.terminated` of one container (the current state: pods never restart in place)."""

    container: str
    init: bool
    exit_code: int | None
    reason: str
    message: str
    finished_at: datetime | None
    image: str = ""
    """The image the kubelet reports it ran (`status.*ContainerStatuses[].image`)."""


@dataclass(frozen=True)
class Waiting:
    """`state.waiting` of one container: it never started, and says why."""

    container: str
    init: bool
    reason: str
    message: str
    image: str = ""


@dataclass(frozen=True)
class UnhealthyDevice:
    """An allocated device the kubelet reports Unhealthy (`allocatedResourcesStatus`)."""

    container: str
    resource: str
    device: str
    message: str


@dataclass(frozen=True)
class PodView:
    name: str
    node: str | None
    node_rank: int | None
    phase: str
    reason: str
    message: str
    deletion_onset: datetime | None
    scheduled_at: datetime | None
    conditions: tuple[ConditionView, ...]
    terminations: tuple[Termination, ...]
    waiting: tuple[Waiting, ...]
    unhealthy_devices: tuple[UnhealthyDevice, ...]
    started_images: frozenset[str] = frozenset()
    """Images of containers that started (running, or terminated after a start): pulled."""

    def condition(self, type_: str) -> ConditionView | None:
        return next((c for c in self.conditions if c.type == type_ and c.status == "True"), None)


def _node_rank(meta: Json) -> int | None:
    for source in ("annotations", "labels"):
        value = _get(meta, source, JOB_COMPLETION_INDEX)
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def _deletion_onset(meta: Json) -> datetime | None:
    """When deletion was requested: deletionTimestamp is that moment plus the grace period."""
    deadline = parse_time(meta.get("deletionTimestamp"))
    grace = meta.get("deletionGracePeriodSeconds")
    if deadline is None:
        return None
    return deadline - timedelta(seconds=grace if isinstance(grace, int) else 0)


def _container_states(status: Json) -> Iterable[tuple[Json, bool]]:
    for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
        for raw in _list(status.get(key)):
            yield raw, init


def _termination(raw: Json, init: bool) -> Termination | None:
    term = _get(raw, "state", "terminated")
    if not isinstance(term, Mapping):
        return None
    code = term.get("exitCode")
    return Termination(
        _str(raw.get("name")),
        init,
        code if isinstance(code, int) else None,
        _str(term.get("reason")),
        _str(term.get("message")),
        parse_time(term.get("finishedAt")),
        _str(raw.get("image")),
    )


def _waiting(raw: Json, init: bool) -> Waiting | None:
    wait = _get(raw, "state", "waiting")
    if not isinstance(wait, Mapping):
        return None
    return Waiting(
        _str(raw.get("name")), init, _str(wait.get("reason")), _str(wait.get("message")),
        _str(raw.get("image")),
    )  # fmt: skip


def _started_image(raw: Json) -> str | None:
    state = raw.get("state")
    if not isinstance(state, Mapping):
        return None
    term = state.get("terminated")
    started = "running" in state or (isinstance(term, Mapping) and bool(term.get("startedAt")))
    return _str(raw.get("image")) or None if started else None


def _unhealthy(raw: Json) -> list[UnhealthyDevice]:
    return [
        UnhealthyDevice(
            _str(raw.get("name")), _str(res.get("name")), _str(dev.get("resourceID")),
            _str(dev.get("message")),
        )
        for res in _list(raw.get("allocatedResourcesStatus"))
        for dev in _list(res.get("resources"))
        if dev.get("health") == "Unhealthy"
    ]  # fmt: skip


def read_pod(raw: Json) -> PodView:
    meta, spec, status = (raw.get(k) or {} for k in ("metadata", "spec", "status"))
    conditions = tuple(ConditionView.read(c) for c in _list(status.get("conditions")))
    scheduled = next((c.since for c in conditions if c.type == "PodScheduled"), None)
    states = list(_container_states(status))
    return PodView(
        name=_str(meta.get("name")),
        node=_str(spec.get("nodeName")) or None,
        node_rank=_node_rank(meta),
        phase=_str(status.get("phase")),
        reason=_str(status.get("reason")),
        message=_str(status.get("message")),
        deletion_onset=_deletion_onset(meta),
        scheduled_at=scheduled or parse_time(status.get("startTime")),
        conditions=conditions,
        terminations=tuple(t for raw_, init in states if (t := _termination(raw_, init))),
        waiting=tuple(w for raw_, init in states if (w := _waiting(raw_, init))),
        unhealthy_devices=tuple(d for raw_, init in states if not init for d in _unhealthy(raw_)),
        started_images=frozenset(i for raw_, _ in states if (i := _started_image(raw_))),
    )


@dataclass(frozen=True)
class NodeView:
    name: str
    ready: ConditionView | None
    unreachable_since: datetime | None
    conditions: tuple[ConditionView, ...]
    labels: Mapping[str, str]

    @property
    def lost(self) -> bool:
        """NotReady or unreachable: the kubelet is gone or the node is failing."""
        not_ready = self.ready is not None and self.ready.status != "True"
        return not_ready or self.unreachable_since is not None

    @property
    def declared_lost_at(self) -> datetime | None:
        """When the control plane (or the kubelet) declared it: taint or Ready transition."""
        if not self.lost:
            return None
        return self.unreachable_since or (self.ready.since if self.ready else None)

    @property
    def last_heartbeat(self) -> datetime | None:
        """The Ready condition's `lastHeartbeatTime`: the kubelet's last status post."""
        return self.ready.heartbeat if self.ready else None

    def condition(self, type_: str) -> ConditionView | None:
        return next((c for c in self.conditions if c.type == type_), None)


_UNREACHABLE_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")


def read_node(raw: Json) -> NodeView:
    meta, spec, status = (raw.get(k) or {} for k in ("metadata", "spec", "status"))
    conditions = tuple(ConditionView.read(c) for c in _list(status.get("conditions")))
    taints = [t for t in _list(spec.get("taints")) if t.get("key") in _UNREACHABLE_TAINTS]
    raw_labels = meta.get("labels")
    labels: Mapping[str, object] = raw_labels if isinstance(raw_labels, Mapping) else {}
    return NodeView(
        name=_str(meta.get("name")),
        ready=next((c for c in conditions if c.type == "Ready"), None),
        unreachable_since=min(
            (t for x in taints if (t := parse_time(x.get("timeAdded")))), default=None
        )
        if taints
        else None,
        conditions=conditions,
        labels={k: v for k, v in labels.items() if isinstance(v, str)},
    )


@dataclass(frozen=True)
class EventView:
    kind: str
    name: str
    reason: str
    message: str
    at: datetime | None
    type: str = ""
    reporter: str = ""
    api: str = "v1"
    """`v1` (core) or `events.k8s.io/v1`: the same event reads the same either way."""
    namespace: str = ""
    """Where the Event is stored (its metadata.namespace), not the namespace it names."""


_EVENT_TIMES = (
    ("eventTime",),
    ("firstTimestamp",),
    ("deprecatedFirstTimestamp",),
    ("series", "lastObservedTime"),
    ("lastTimestamp",),
    ("deprecatedLastTimestamp",),
    ("metadata", "creationTimestamp"),
)


def read_event(raw: Json) -> EventView:
    """core/v1 Event (involvedObject, message, source) or events.k8s.io/v1 Event (regarding,
    note, reportingController), as `kubectl get events` / `get events.events.k8s.io` print
    them; the time is when it was first seen (eventTime, then firstTimestamp)."""
    obj = raw.get("involvedObject") or raw.get("regarding") or {}
    at = next((t for path in _EVENT_TIMES if (t := parse_time(_get(raw, *path)))), None)
    reporter = _str(_get(raw, "source", "component")) or _str(raw.get("reportingController"))
    reporter = reporter or _str(raw.get("reportingComponent"))
    api = _str(raw.get("apiVersion")) or "v1"
    return EventView(
        _str(_get(obj, "kind")),
        _str(_get(obj, "name")),
        _str(raw.get("reason")),
        _str(raw.get("message") or raw.get("note")),
        at,
        _str(raw.get("type")),
        reporter,
        "events.k8s.io/v1" if api.startswith("events.k8s.io") else "v1",
        _str(_get(raw, "metadata", "namespace")),
    )


def first_line(text: str, limit: int = 200) -> str:
    """The most telling single line of a termination message, for evidence."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    telling = [ln for ln in lines if not ln.endswith(":")]  # "Last error:" heads its detail
    picked = next((ln for ln in reversed(telling) if re.search(r"error|fail|xid", ln, re.I)), "")
    line = picked or (lines[-1] if lines else "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


_View = TypeVar("_View")


class ReadOnce:
    """Pod and node views read once per object, for a caller whose objects are never edited
    in place: the operator's watch cache stores a new object on every change, so a view read
    from an object stays true while that object is held. Keyed by identity, each entry
    holding its object (an id is not reused while its object lives); emptied past `limit`
    entries. At 1,250 pods and nodes, reading them all again cost a plan ~0.1 s of CPU on
    every progress round."""

    def __init__(self, limit: int = 16384) -> None:
        self.limit = limit
        self._pods: dict[int, tuple[Json, PodView]] = {}
        self._nodes: dict[int, tuple[Json, NodeView]] = {}

    def pod(self, raw: Json) -> PodView:
        return self._once(self._pods, raw, read_pod)

    def node(self, raw: Json) -> NodeView:
        return self._once(self._nodes, raw, read_node)

    def _once(self, views: dict[int, tuple[Json, _View]], raw: Json,
              read: Callable[[Json], _View]) -> _View:  # fmt: skip
        held = views.get(id(raw))
        if held is not None and held[0] is raw:
            return held[1]
        view = read(raw)
        if len(views) >= self.limit:
            views.clear()
        views[id(raw)] = (raw, view)
        return view
