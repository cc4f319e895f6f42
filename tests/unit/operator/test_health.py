"""/healthz and /readyz: the verdicts over the facts the event loop records, and the
server that answers the kubelet's probes from a thread of its own."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from rtj_operator.health import (
    LOOP_STALL_SECONDS,
    HealthFacts,
    HealthServer,
    list_stale_after,
    liveness,
    readiness,
)

T0 = 1000.0


def _leader(**overrides: object) -> HealthFacts:
    facts = HealthFacts(started_at=T0, beat_at=T0, electing=True, leading=True, synced=True,
                        listed_at=T0, resync_seconds=300.0)  # fmt: skip
    for name, value in overrides.items():
        setattr(facts, name, value)
    return facts


def test_a_running_leader_with_synced_caches_is_live_and_ready() -> None:
    assert liveness(_leader(), T0 + 1).ok
    verdict = readiness(_leader(), T0 + 1)
    assert verdict.ok and "synced" in verdict.reason


def test_a_blocked_event_loop_is_not_live_and_so_not_ready() -> None:
    later = T0 + LOOP_STALL_SECONDS + 5
    live, ready = liveness(_leader(), later), readiness(_leader(listed_at=later), later)
    assert not live.ok and "has not run for 35s" in live.reason
    assert not ready.ok and ready.reason == live.reason


def test_a_process_whose_loop_never_beat_is_judged_from_its_start() -> None:
    facts = _leader(beat_at=None)
    assert liveness(facts, T0 + 5).ok
    assert not liveness(facts, T0 + LOOP_STALL_SECONDS + 1).ok


def test_a_dead_controller_loop_fails_liveness_naming_it() -> None:
    verdict = liveness(_leader(dead_loops=("rtj-worker-3", "rtj-resync")), T0)
    assert not verdict.ok and "rtj-worker-3, rtj-resync" in verdict.reason


def test_a_standby_is_ready_to_take_over_without_caches() -> None:
    facts = _leader(leading=False, synced=False, listed_at=None)
    verdict = readiness(facts, T0 + 1)
    assert verdict.ok and verdict.reason.startswith("standby")


def test_a_leader_is_not_ready_before_its_first_list_or_when_listing_fails_for_long() -> None:
    assert not readiness(_leader(synced=False, listed_at=None), T0).ok
    stale = T0 + list_stale_after(300.0) + 1
    verdict = readiness(_leader(beat_at=stale), stale)
    assert not verdict.ok and "no successful LIST" in verdict.reason
    assert readiness(_leader(beat_at=stale - 2), stale - 2).ok


def test_without_leader_election_the_process_is_judged_as_a_leader() -> None:
    facts = _leader(electing=False, leading=True, synced=False, listed_at=None)
    assert not readiness(facts, T0).ok


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_server_answers_200_or_503_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    facts = _leader(synced=False, listed_at=None)
    monkeypatch.setattr("rtj_operator.health.time.monotonic", lambda: T0 + 1)
    server = HealthServer(lambda: facts, 0, "127.0.0.1").start()
    try:
        assert _get(server.port, "/healthz") == (200, "ok: event loop running\n")
        status, body = _get(server.port, "/readyz")
        assert status == 503 and body.startswith("failed: leading; caches not filled")
        facts.synced, facts.listed_at = True, T0
        assert _get(server.port, "/readyz")[0] == 200
        assert _get(server.port, "/metrics")[0] == 404
    finally:
        server.close()
