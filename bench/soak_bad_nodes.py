"""The goodput soak's bad nodes: a `bad_node` fault breaks its rank's node for good.

A node goes bad as a GPU with failing memory does where nothing reports it (no XID, no
node condition, the agent sees nothing): every process that touches it dies. On the pod
runner that is a watcher killing, every `EVERY` seconds, each trainer running on a broken
node, whichever job's and whichever attempt's (a restart in place on that node, a pod
created there again, a warm spare that takes a rank there: each dies before it trains
much), and a file per broken node in `folder`, where the platform's preflight node check
looks (`bench.soak_training.preflight_config`: it fails there as `dcgmi diag -r 1` would).
The operator's runs and the JobSet baseline's get the same watcher; only the operator's
platform has a preflight.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

EVERY = 0.5
"""Seconds between the watcher's rounds: a trainer started on a bad node dies within it."""


class BadNodes:
    """The nodes broken so far, and the watcher that kills what trains on them."""

    def __init__(
        self,
        folder: Path | None,
        pods: Callable[[], list[dict[str, Any]]],
        trainer: Callable[[dict[str, Any]], int | None],
    ) -> None:
        """`pods`: the namespace's pods now; `trainer`: a pod's training process, if any."""
        self.folder, self._pods, self._trainer = folder, pods, trainer
        self.nodes: set[str] = set()
        self.kills: list[dict[str, Any]] = []
        """Each trainer the watcher killed: Unix time, node, pod."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> BadNodes:
        self._thread = threading.Thread(target=self._watch, name="bad-nodes", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def add(self, node: str) -> None:
        """Break `node` from now on (its preflight check fails, its trainers die)."""
        if self.folder is None:
            raise ValueError("a bad_node fault needs the folder the preflight check reads")
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / node).write_text("")
        with self._lock:
            self.nodes.add(node)

    def _watch(self) -> None:
        while not self._stop.wait(EVERY):
            with self._lock:
                broken = set(self.nodes)
            if broken:
                with contextlib.suppress(Exception):  # an API hiccup: the next round
                    self.sweep(broken)

    def sweep(self, broken: set[str]) -> None:
        """Kill each trainer running on a node of `broken`."""
        for pod in self._pods():
            node = (pod.get("spec") or {}).get("nodeName")
            if node not in broken or (pod.get("status") or {}).get("phase") != "Running":
                continue
            pid = self._trainer(pod)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                self.kills.append({"at": time.time(), "node": node,
                                   "pod": pod["metadata"]["name"]})  # fmt: skip
