"""What the demo watches while the job runs: the job's phase and events, node taints, pods
and the trainers' progress, told as lines on the display (``Run`` is its memory)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from e2e.cluster.kube import Kube as HarnessKube

from . import report
from .options import NAMESPACE, DemoError, Display, Options
from .rank_logs import rank_logs


@dataclass
class Run:
    """What the demo observed while the job ran (the display's memory)."""

    name: str
    events_seen: set[str] = field(default_factory=set)
    progress: dict[int, int] = field(default_factory=dict)  # attempt -> last step shown
    fault_at: float | None = None
    fault_node: str | None = None
    fault_pod: str | None = None
    new_pods_running_at: float | None = None
    tainted: set[str] = field(default_factory=set)
    old_world_gone: bool = False
    init_reported: set[str] = field(default_factory=set)


class Watcher:
    """Polls the job, its events, nodes, pods and the trainers' logs, and tells the story."""

    def __init__(self, opts: Options, kube: HarnessKube, api: Any, d: Display, run: Run) -> None:
        self.opts, self.kube, self.api, self.d, self.run = opts, kube, api, d, run
        self.phase = ""
        self.attempt = 0

    def until(self, what: str, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if done():
                return
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.25)

    def poll(self) -> None:
        rtj = self.api.get_rtj(NAMESPACE, self.run.name)
        status = rtj.get("status") or {}
        if status.get("phase") and (status["phase"], status.get("attempt")) != (
            self.phase,
            self.attempt,
        ):
            self.phase, self.attempt = status["phase"], status.get("attempt", 0)
            self.d.line(f"job {self.run.name}: phase {self.phase}, attempt {self.attempt}")
        self._events()
        self._nodes()
        pods = [
            self.kube.api.sanitize_for_serialization(p)
            for p in self.kube.core.list_namespaced_pod(
                NAMESPACE, label_selector=f"training.resilient.dev/job={self.run.name}"
            ).items
        ]
        self._pods(pods)
        self._progress(pods)

    def _events(self) -> None:
        events = self.kube.core.list_namespaced_event(NAMESPACE).items
        for e in sorted(
            events, key=lambda e: (e.last_timestamp or e.event_time or 0, e.metadata.name)
        ):
            if e.involved_object.kind != "ResilientTrainingJob":
                continue
            key = f"{e.metadata.uid}/{e.count}"
            if key in self.run.events_seen:
                continue
            self.run.events_seen.add(key)
            self.d.line(f"event {e.reason}: {e.message}")

    def _nodes(self) -> None:
        for n in self.kube.core.list_node().items:
            for t in n.spec.taints or []:
                if t.key.startswith("node.kubernetes.io/") or n.metadata.name in self.run.tainted:
                    continue
                self.run.tainted.add(n.metadata.name)
                self.d.line(f"node {n.metadata.name} tainted {t.key}={t.value}:{t.effect}")

    def _pods(self, pods: list[dict[str, Any]]) -> None:
        attempts = {p["metadata"]["labels"].get("training.resilient.dev/attempt") for p in pods}
        if self.run.fault_at is not None and not self.run.old_world_gone and "1" not in attempts:
            self.run.old_world_gone = True
            self.d.line("old world stopped: every pod of attempt 1 is gone")
        for p in pods:
            for s in (p.get("status") or {}).get("initContainerStatuses") or []:
                term = (s.get("state") or {}).get("terminated")
                key = p["metadata"]["uid"]
                if term and key not in self.run.init_reported:
                    self.run.init_reported.add(key)
                    msg = term.get("message", "").strip().replace("\n", " ")
                    self.d.line(f"pod {p['metadata']['name']}: init container {s['name']} exited "
                                f"{term['exitCode']}: {msg[:160]}")  # fmt: skip
        if self.run.fault_at is not None and self.run.new_pods_running_at is None:
            new = [
                p for p in pods
                if p["metadata"]["labels"].get("training.resilient.dev/attempt") == "2"
                and (p.get("status") or {}).get("phase") == "Running"
            ]  # fmt: skip
            if len(new) == 2:
                self.run.new_pods_running_at = time.monotonic()
                nodes = sorted(p["spec"]["nodeName"] for p in new)
                self.d.line(f"attempt 2: every pod Running, on {', '.join(nodes)}")

    def _progress(self, pods: list[dict[str, Any]]) -> None:
        for attempt in sorted({int(a) for p in pods if (a := p["metadata"]["labels"].get(
                "training.resilient.dev/attempt"))}):  # fmt: skip
            logs = rank_logs(self.opts, pods, attempt)
            if 0 not in logs:
                continue
            lines = logs[0].read_text().splitlines()
            losses = report.parse_losses(lines)
            shown = self.run.progress.get(attempt)
            if shown is None:
                restored = report.restore_step(lines)
                if restored is None:
                    continue
                self.d.line(f"attempt {attempt}: trainer restored step {restored}")
                self.run.progress[attempt] = restored
                shown = restored
            if not losses:
                continue
            step, loss = losses[-1]
            if step // 20 > shown // 20 or (attempt > 1 and shown == self._restored(lines)):
                self.d.line(f"attempt {attempt}: step {step}, loss {loss:.5f}")
            self.run.progress[attempt] = max(step, shown)

    @staticmethod
    def _restored(lines: list[str]) -> int | None:
        return report.restore_step(lines)
