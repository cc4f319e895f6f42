"""The drain in the progress sidecar of the pod holding rank 0: every M-th fast step published
as a durable step (`rtj_shim.fast.drain`), beside the trainers, so a hung trainer does not stop it.

It runs once the operator's signed order (`rtj_shim.wire.drain_order`, ``POST /drain``) says as
which writer attempt and where the other pods' sidecars are. Every second it looks at the
fast steps this pod holds; the newest that is a multiple of ``every_steps`` and newer than
the last one drained, it drains. A step the trainers publish themselves (a multiple of
their own ``every_steps``, which their fast steps record) is left to them, and a step already
published counts as drained: one writer per step. A failure is reported (``error``) and
tried again the next second; the durable step is never half made
(`drain_step` publishes or not). The store comes from the pod's environment as the
trainer's does (``RTJ_CHECKPOINT_URI``, its credentials), the run from ``RTJ_RUN_ID``, the
retention from ``RTJ_KEEP_LAST``/... (applied after each publish, as after a trainer's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.storage.base import CheckpointStore
from rtj_shim.checkpoint.storage.throttle import throttled
from rtj_shim.errors import StepAlreadyPublished
from rtj_shim.fast import fast_tier
from rtj_shim.fast.drain import LeftToTheTrainers, drain_step
from rtj_shim.wire import pod_env
from rtj_shim.wire.drain_order import DrainOrder, peers_digest

log = logging.getLogger("rtj_shim.fast.drain")

ENV_CHECKPOINT_URI = "RTJ_CHECKPOINT_URI"
ENV_RUN_ID = "RTJ_RUN_ID"
DRAIN_INTERVAL_S = 1.0


def due_step(held: list[int], every_steps: int, drained: int | None) -> int | None:
    """Pure: the fast step to drain now: the newest held that is a multiple of
    ``every_steps`` and newer than the last drained (None: nothing to do)."""
    due = [s for s in held if s % every_steps == 0 and (drained is None or s > drained)]
    return max(due) if due else None


class Drainer:
    """Drains this pod's fast tier (``fast_dir``) into the durable store at ``uri``."""

    def __init__(
        self,
        fast_dir: Path,
        key: str,
        uri: str,
        run_id: str,
        open_root: Callable[[str], CheckpointStore] = open_store,
    ) -> None:
        self.fast_dir = fast_dir
        self._key, self._uri, self._run_id = key, uri, run_id
        self._open = open_root
        self._store: CheckpointStore | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._order: DrainOrder | None = None
        self._drained: int | None = None
        self._last: dict[str, Any] | None = None
        self._error: str | None = None

    @classmethod
    def from_env(cls, fast_dir: Path | None, key: str, env: Mapping[str, str]) -> Drainer | None:
        """A drainer when the pod has a fast tier, a control key, a store and a run."""
        uri, run_id = env.get(ENV_CHECKPOINT_URI) or "", env.get(ENV_RUN_ID) or ""
        if fast_dir is None or not key or not uri or not run_id:
            return None
        return cls(fast_dir, key, uri, run_id)

    def follow(self, order: DrainOrder) -> None:
        with self._lock:
            if order == self._order:
                return
            self._order, self._error = order, None
        self.start()
        self._wake.set()

    def report(self) -> dict[str, Any] | None:
        """``"drain"`` in ``GET /progress``: the order followed and the last step drained."""
        with self._lock:
            if self._order is None:
                return None
            return {
                "attempt": self._order.attempt,
                "every_steps": self._order.every_steps,
                "peers": len(self._order.peers),
                "peers_digest": peers_digest(self._order.peers),
                "step": self._drained,
                "last": self._last,
                "error": self._error,
            }

    def _durable(self) -> CheckpointStore:
        """The durable store, opened at the first drain and kept: an S3 store's client is
        made once, not for every drained step (making one parses botocore's service model,
        tens of milliseconds of CPU beside the trainers). A failed open is tried again at
        the next drain."""
        if self._store is None:  # paced as the trainers' own durable saves are
            limit = pod_env.max_write_bytes_per_second()
            self._store = throttled(self._open(self._uri), limit, lambda: False)
        return self._store

    def drain_once(self) -> int | None:
        """Drain the due fast step, if any; the step drained."""
        with self._lock:
            order, drained = self._order, self._drained
        if order is None:
            return None
        step = due_step(fast_tier.holdings(self.fast_dir), order.every_steps, drained)
        if step is None:
            return None
        protocol = CommitProtocol(self._durable(), run_id=self._run_id,
                                  attempt=order.attempt)  # fmt: skip
        try:
            done = drain_step(self.fast_dir, protocol, step, order.peers, self._key)
            last: dict[str, Any] = {"step": step, "seconds": done.seconds, "bytes": done.bytes,
                                    "published_at": round(time.time(), 3)}  # fmt: skip
        except StepAlreadyPublished:
            last = {"step": step, "already_published": True}
        except LeftToTheTrainers:
            last = {"step": step, "left_to_trainers": True}
        with self._lock:
            self._drained, self._last = step, last
        log.info("drain: fast step %d is durable in %s (%s)", step, self._uri, last)
        return step

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.drain_once()
                error = None
            except Exception as exc:  # reported, and tried again: the thread never ends
                error = f"{type(exc).__name__}: {exc}"[:500]
                log.info("drain: %s", error)
            with self._lock:
                self._error = error
            self._wake.wait(DRAIN_INTERVAL_S)
            self._wake.clear()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name="rtj-drain", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
