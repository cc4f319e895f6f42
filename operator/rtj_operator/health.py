"""`/healthz` and `/readyz`: is this process alive, and is it doing its job.

The verdicts are pure functions of a few facts the event loop records (`HealthFacts`); a
small HTTP server on a thread of its own answers the kubelet's probes from them, so a probe
is answered even while the loop is blocked, and says so.

- **Live** (`/healthz`; failing it restarts the container): the asyncio loop ran its
  heartbeat within `LOOP_STALL_SECONDS`, and none of the controller's loops (workers, the
  resync, node leases, progress polls) died. A standby replica waiting for the Lease is live.
- **Ready** (`/readyz`): live, and either a standby (ready to take over) or a leader whose
  caches are filled from a first LIST and whose last LIST succeeded within
  `list_stale_after(resync)`. Kopf's watch streams reconnect on their own; a watch that
  cannot reach the API server shows here as the periodic LIST failing too, which the
  process cannot fix by restarting, so it is a readiness failure, not a liveness one.

The metrics endpoint stays separate (`--metrics-port`): a scrape is no health check.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("rtj_operator.health")

LOOP_STALL_SECONDS = 30.0
"""A loop that has not run its 1 s heartbeat for this long is stuck (a blocking call, a
deadlock): not live."""
HEARTBEAT_SECONDS = 1.0


def list_stale_after(resync_seconds: float) -> float:
    """How old the last successful LIST may be before the leader is not ready: two missed
    resyncs and a minute of slack (a LIST of a large cluster takes time)."""
    return 2 * resync_seconds + 60.0


@dataclass
class HealthFacts:
    """What the event loop records (monotonic seconds; None: not yet)."""

    started_at: float = field(default_factory=time.monotonic)
    beat_at: float | None = None
    electing: bool = False  # leader election in use
    leading: bool = False
    synced: bool = False
    listed_at: float | None = None
    dead_loops: tuple[str, ...] = ()
    resync_seconds: float = 300.0


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str


def liveness(facts: HealthFacts, now: float) -> Verdict:
    if facts.dead_loops:
        return Verdict(False, f"controller loops died: {', '.join(facts.dead_loops)}")
    beat = facts.beat_at if facts.beat_at is not None else facts.started_at
    if now - beat > LOOP_STALL_SECONDS:
        return Verdict(False, f"event loop has not run for {now - beat:.0f}s")
    return Verdict(True, "event loop running")


def readiness(facts: HealthFacts, now: float) -> Verdict:
    live = liveness(facts, now)
    if not live.ok:
        return live
    if facts.electing and not facts.leading:
        return Verdict(True, "standby: waiting for the leader-election Lease")
    if not facts.synced or facts.listed_at is None:
        return Verdict(False, "leading; caches not filled yet (first LIST pending)")
    age = now - facts.listed_at
    if age > list_stale_after(facts.resync_seconds):
        return Verdict(False, f"leading; no successful LIST from the API server for {age:.0f}s")
    return Verdict(True, "leading; caches synced")


class HealthServer:
    """Answers GET /healthz and /readyz on a thread: 200 with the reason, or 503."""

    def __init__(self, facts: Callable[[], HealthFacts], port: int, addr: str = "0.0.0.0") -> None:  # noqa: S104
        routes: dict[str, Callable[[HealthFacts, float], Verdict]] = {
            "/healthz": liveness,
            "/readyz": readiness,
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                judge = routes.get(self.path.split("?", 1)[0])
                if judge is None:
                    self.send_error(404)
                    return
                verdict = judge(facts(), time.monotonic())
                body = f"{'ok' if verdict.ok else 'failed'}: {verdict.reason}\n".encode()
                self.send_response(200 if verdict.ok else 503)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # probes every few seconds: not worth a log line each

        self.server = ThreadingHTTPServer((addr, port), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="rtj-health", daemon=True
        )

    def start(self) -> HealthServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
