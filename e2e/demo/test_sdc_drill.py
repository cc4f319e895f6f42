"""Drill on real training through the pod runner (issue 43, section 2): silent data
corruption, twice in one job. Three worker pods (one rank each, gloo, restart in place,
the example's ``--anomaly-guard``: an AnomalyGuard over the losses and each rank's own
gradient norm before DDP's all-reduce, checked every 10 steps) train on five nodes.

1. After the first durable save, one bit of rank 2's weights flips (its node's "GPU"
   computes wrong: the trainer reads a file its pod was given, ``--fault-flip-file``). At
   the next check every rank refuses the state: rank 2's copy differs from the majority's
   bit for bit.
2. In the attempt after, past its next save, rank 0's gradient is scaled ten thousand
   times before the all-reduce (``--fault-scale-file``): every replica applies the same
   average, so no copy differs; rank 0's own norm is far off its recent values.

Each time the supervisors report the trainers' verdict; the operator names the rank, its
pod and node, and restarts not in the same pods but the whole world, from the newest
published step (reached before the symptom), on nodes other than every suspect's so far,
tainting none. The finished model equals the no-fault run's bit for bit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.demo import drills, story
from e2e.operator_proc import wait_for

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]

JOB = "drill-sdc"
STEPS, SAVE_EVERY, RANKS, FLIPPED, SCALED = 120, 40, 3, 2, 0
FLIP, SCALE = "/var/log/train/flip", "/var/log/train/scale"
GUARD = ("--anomaly-guard",)


def _job() -> dict[str, Any]:
    body = drills.in_place_job(JOB, SAVE_EVERY, STEPS)
    body["spec"]["replicas"] = RANKS
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [*container["command"], *GUARD, f"--fault-flip-file={FLIP}",
                            f"--fault-scale-file={SCALE}"]  # fmt: skip
    return body


def _events(platform: Any) -> list[str]:
    items = platform.kube.core.list_namespaced_event(story.NAMESPACE).items
    return [e.message or "" for e in items if e.involved_object.name == JOB]


def _fault(opts: Any, api: Any, attempt: int, rank: int, name: str) -> tuple[Any, Path, int]:
    """Once `rank` of `attempt` trained past that attempt's next durable save, give its pod
    the file `name` (the trainer acts on it at its next step): the pod, the rank's log and
    the last step it logged before."""
    pods = drills.scheduled(api, JOB, RANKS, attempt=attempt)
    victim = drills.rank_pod(pods, rank)
    log = drills.rank_log(opts, victim, rank)
    past = attempt * SAVE_EVERY + 2
    wait_for(f"attempt {attempt} past step {past}", lambda: drills.trained(log) > past,
             300, 0.05)  # fmt: skip
    (story._pod_dir(opts, victim) / "volumes" / "train-logs" / name).write_text("")
    return victim, log, drills.trained(log)


def _judged(api: Any, attempt: int, rank: int, victim: Any, earlier: set[str]) -> dict[str, Any]:
    """The ended attempt's record: SilentDataCorruption naming `rank`, its pod and node,
    the whole world restarted on none of the suspect nodes; the suspect's record."""
    wait_for(f"attempt {attempt + 1}",
             lambda: drills.status(api, JOB).get("attempt") == attempt + 1, 300, 0.5)  # fmt: skip
    status = drills.status(api, JOB)
    ended = status["attempts"][attempt - 1]
    assert ended["failureClass"] == "SilentDataCorruption", ended
    assert not ended.get("inPlaceRestarts"), "never restarted in the same pods"
    suspect: dict[str, Any] = ended["firstFailed"]
    assert suspect["suspect"] is True and suspect["rank"] == rank, suspect
    assert suspect["pod"] == victim["metadata"]["name"], suspect
    assert suspect["node"] == victim["spec"]["nodeName"], suspect
    assert not status.get("quarantinedNodes"), "the trainers' word taints nothing"
    nodes = {p["spec"]["nodeName"] for p in drills.scheduled(api, JOB, RANKS, attempt=attempt + 1)}
    assert not nodes & (earlier | {suspect["node"]}), (nodes, earlier, suspect)
    return suspect


def test_a_flipped_bit_and_a_scaled_gradient_are_refused_named_and_trained_elsewhere(
    tmp_path: Path,
) -> None:
    with drills.controlling_platform(tmp_path, "rtj-sdc", 5) as platform:
        opts, api = platform.opts, platform.api
        api.create_rtj(story.NAMESPACE, _job())
        flipped, flip_log, flipped_after = _fault(opts, api, 1, FLIPPED, "flip")
        first = _judged(api, 1, FLIPPED, flipped, set())
        scaled, scale_log, scaled_after = _fault(opts, api, 2, SCALED, "scale")
        second = _judged(api, 2, SCALED, scaled, {first["node"]})
        wait_for("the job to succeed",
                 lambda: drills.status(api, JOB).get("phase") == "Succeeded", 600, 1.0)  # fmt: skip
        status = drills.status(api, JOB)
        resumed = [a.get("resumedFromStep") for a in status["attempts"]]
        assert resumed[1:] == [SAVE_EVERY, 2 * SAVE_EVERY], status["attempts"]
        messages = _events(platform)
        for suspect in (first, second):
            assert any(suspect["node"] in m and "SilentDataCorruption" in m for m in messages)
        third = drills.scheduled(api, JOB, RANKS, attempt=3)
        got = {r: drills.losses(drills.rank_log(opts, drills.rank_pod(third, r), r)
                                .read_text().splitlines()) for r in range(RANKS)}  # fmt: skip
        before = {FLIPPED: drills.losses(flip_log.read_text().splitlines()),
                  SCALED: drills.losses(scale_log.read_text().splitlines())}  # fmt: skip

    want = drills.no_fault_losses(tmp_path, STEPS, SAVE_EVERY, ranks=RANKS, extra=GUARD)
    for rank in range(RANKS):
        assert min(got[rank]) == 2 * SAVE_EVERY + 1 and max(got[rank]) == STEPS, sorted(got[rank])
        diff = sorted(s for s in got[rank] if got[rank][s] != want[rank][s])
        assert not diff, f"rank {rank}: {len(diff)} steps differ (first {diff[:5]})"
    assert all(before[FLIPPED][s] == want[FLIPPED][s] for s in range(1, flipped_after + 1))
    assert all(before[SCALED][s] == want[SCALED][s]
               for s in range(SAVE_EVERY + 1, scaled_after + 1))  # fmt: skip
    sys.stdout.write(f"\nsdc drill: a bit of rank {FLIPPED} flipped after step {flipped_after}, "
                     f"named on node {first['node']}; rank {SCALED}'s gradient scaled after "
                     f"step {scaled_after}, named on node {second['node']}; attempt 3 resumed "
                     f"from {2 * SAVE_EVERY} elsewhere, equal to the no-fault run\n")  # fmt: skip
