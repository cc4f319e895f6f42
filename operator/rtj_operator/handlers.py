"""kopf wiring only: settings and watch handlers that feed the controller.

Nothing here decides anything. Watch handlers update the controller's caches (pods and
JobSets labelled for a job, nodes; see cache.py for why these are not kopf indexes) and
enqueue the job an object concerns, so a reconcile makes no API call to observe the world.
Events are not watched: they are read once, when a failure is classified. No change
handlers, daemons or timers are registered, so kopf adds no finalizer and writes no
progress into the objects (the RTJ's `status` is the operator's own, written through the
status subresource); its storages are set to annotations under
the operator's group anyway, so that a handler added later never writes into `status`; and
while only watch handlers exist, kopf's per-event copy of each body for change detection is
not made (`WatchOnlyDiffBase`).

Handlers are `async`: they run on the event loop with the controller's queue, never in
kopf's thread pool.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import kopf

from rtj_operator.api import keys
from rtj_operator.controller import Controller

registry = kopf.OperatorRegistry()
_JOBSET_GROUP, _JOBSET_VERSION = keys.JOBSET_API_VERSION.split("/")
_MANAGED = {keys.JOB_LABEL: kopf.PRESENT}


@dataclass(frozen=True)
class WatchOptions:
    server_timeout: int = 300
    """`timeoutSeconds` of every watch request: the API server ends it, kopf re-lists."""
    client_timeout: float = 330.0
    """The client gives up on a watch connection this long after it opened (> server)."""
    connect_timeout: float = 10.0
    inactivity_timeout: float = 70.0
    """No event (not even a bookmark) for this long: the stream is dead, reconnect."""
    batch_window: float = 0.02
    """kopf's per-object event batching window (kopf's default 0.1 s adds latency)."""


class WatchOnlyDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds a "diff base" of every object on every watch event (a deep copy of the
    whole body, less its status) for change handlers and daemons; with only watch-event
    handlers nothing reads it. Measured in a recovery of 128 pods (issue 15), that copy was
    the largest single item of the operator's CPU (~15%), per event. The essence here is
    empty, so change detection sees nothing: `make_settings` uses this storage only while
    no change handler, daemon or timer is registered."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def watch_only(reg: kopf.OperatorRegistry) -> bool:
    """Whether `reg` registers no change handler, daemon or timer (nothing that reads a
    diff base); False when this kopf cannot say (its storage is kept then)."""
    try:
        return not reg._changing.get_all_handlers() and not reg._spawning.get_all_handlers()
    except AttributeError:
        return False


def make_settings(options: WatchOptions) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = int(options.server_timeout)  # timeoutSeconds: an integer
    settings.watching.client_timeout = options.client_timeout
    settings.watching.connect_timeout = options.connect_timeout
    settings.watching.inactivity_timeout = options.inactivity_timeout
    settings.batching.batch_window = options.batch_window
    settings.watching.chunk_size = 250  # paged initial listings: a bounded memory peak
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=keys.GROUP)
    storage = WatchOnlyDiffBase if watch_only(registry) else kopf.AnnotationsDiffBaseStorage
    settings.persistence.diffbase_storage = storage(
        prefix=keys.GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{keys.GROUP}/operator"
    settings.posting.enabled = False  # the operator posts its own decision Events
    settings.networking.request_timeout = 60.0
    settings.process.ultimate_exiting_timeout = 10.0
    return settings


def _controller(memo: Any) -> Controller:
    controller: Controller = memo.controller
    return controller


# --- lifecycle -------------------------------------------------------------------------------


@kopf.on.login(registry=registry)
def login(**_: Any) -> kopf.ConnectionInfo:
    """The credentials `kube_config.load_config` already loaded into the official client (in-cluster
    service account or the kubeconfig `rtj run` was given), so kopf and the adapter agree."""
    from kubernetes import client

    config = client.Configuration.get_default_copy()
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix(
        "authorization"
    )
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else parts
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )


@kopf.on.startup(registry=registry)
async def start_controller(memo: Any, **_: Any) -> None:
    """Workers start now and wait for the first LIST of every cached kind."""
    _controller(memo).start()


@kopf.on.cleanup(registry=registry)
async def stop_controller(memo: Any, **_: Any) -> None:
    # kopf owns SIGTERM while it runs; our own tasks waiting on the stop flag (the lease
    # holder) must hear of it now, or kopf waits out its 5 s grace for them first
    stop = getattr(memo, "stop", None)
    if stop is not None:
        stop.set()
    await _controller(memo).stop()


# --- watches: update the caches, enqueue the job an object concerns ---------------------------


@kopf.on.event(keys.GROUP, keys.VERSION, keys.PLURAL, registry=registry)
async def rtj_changed(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    _controller(memo).on_rtj(type, body)


@kopf.on.event("pods", labels=_MANAGED, registry=registry)
async def pod_changed(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    _controller(memo).on_pod(type, body)


@kopf.on.event(_JOBSET_GROUP, _JOBSET_VERSION, "jobsets", labels=_MANAGED, registry=registry)
async def jobset_changed(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    _controller(memo).on_jobset(type, body)


@kopf.on.event("nodes", registry=registry)
async def node_changed(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    _controller(memo).on_node(type, body)


def quiet_kopf_loggers() -> None:
    """kopf logs every watch reconnect at INFO; the operator's own log says what matters."""
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
