"""Drill on real training through the pod runner (issue 43, section 2): silent data
corruption. Three worker pods (one rank each, gloo, restart in place) train the example on
four nodes. After the first durable save, one bit of rank 2's weights flips (its node's
"GPU" computes wrong: the trainer reads a file its pod was given, ``--fault-flip-file``).
At the next save every rank refuses the state: rank 2's copy differs from the majority's
bit for bit. The supervisors report the trainers' verdict; the operator names rank 2, its
pod and node, and restarts not in the same pods but the whole world, from the newest
published step (reached before the flip), on nodes other than the suspect's, tainting
none. The finished model equals the no-fault run's bit for bit.
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
STEPS, SAVE_EVERY, RANKS, SUSPECT = 120, 40, 3, 2
FLIP = "/var/log/train/flip"


def _job() -> dict[str, Any]:
    body = drills.in_place_job(JOB, SAVE_EVERY, STEPS)
    body["spec"]["replicas"] = RANKS
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [*container["command"], f"--fault-flip-file={FLIP}"]
    return body


def _events(platform: Any) -> list[str]:
    items = platform.kube.core.list_namespaced_event(story.NAMESPACE).items
    return [e.message or "" for e in items if e.involved_object.name == JOB]


def test_a_flipped_bit_is_refused_named_and_trained_again_elsewhere(tmp_path: Path) -> None:
    with drills.controlling_platform(tmp_path, "rtj-sdc", 4) as platform:
        opts, api = platform.opts, platform.api
        api.create_rtj(story.NAMESPACE, _job())
        first = drills.scheduled(api, JOB, RANKS)
        victim = drills.rank_pod(first, SUSPECT)
        log = drills.rank_log(opts, victim, SUSPECT)
        wait_for("past the first durable save", lambda: drills.trained(log) > SAVE_EVERY + 2,
                 300, 0.05)  # fmt: skip
        flip = story._pod_dir(opts, victim) / "volumes" / "train-logs" / "flip"
        flip.write_text("")
        flipped_after = drills.trained(log)
        wait_for("attempt 2", lambda: drills.status(api, JOB).get("attempt") == 2, 300, 0.5)
        status = drills.status(api, JOB)
        ended = status["attempts"][0]
        assert ended["failureClass"] == "SilentDataCorruption", ended
        assert not ended.get("inPlaceRestarts"), "never restarted in the same pods"
        suspect = ended["firstFailed"]
        assert suspect["suspect"] is True and suspect["rank"] == SUSPECT, suspect
        assert suspect["pod"] == victim["metadata"]["name"], suspect
        assert suspect["node"] == victim["spec"]["nodeName"], suspect
        assert not status.get("quarantinedNodes"), "the trainers' word taints nothing"
        second = drills.scheduled(api, JOB, RANKS, attempt=2)
        assert suspect["node"] not in {p["spec"]["nodeName"] for p in second}
        wait_for("the job to succeed",
                 lambda: drills.status(api, JOB).get("phase") == "Succeeded", 600, 1.0)  # fmt: skip
        status = drills.status(api, JOB)
        assert status["attempts"][1]["resumedFromStep"] == SAVE_EVERY, status["attempts"][1]
        assert any(suspect["node"] in m and "SilentDataCorruption" in m for m in _events(platform))
        got = {r: drills.losses(drills.rank_log(opts, drills.rank_pod(second, r), r)
                                .read_text().splitlines()) for r in range(RANKS)}  # fmt: skip
        before = drills.losses(log.read_text().splitlines())

    want = drills.no_fault_losses(tmp_path, STEPS, SAVE_EVERY, ranks=RANKS)
    for rank in range(RANKS):
        assert min(got[rank]) == SAVE_EVERY + 1 and max(got[rank]) == STEPS, sorted(got[rank])
        diff = sorted(s for s in got[rank] if got[rank][s] != want[rank][s])
        assert not diff, f"rank {rank}: {len(diff)} steps differ (first {diff[:5]})"
    assert all(before[s] == want[SUSPECT][s] for s in range(1, flipped_after + 1))
    sys.stdout.write(f"\nsdc drill: a bit of rank {SUSPECT} flipped after step "
                     f"{flipped_after}, named on node {suspect['node']}; attempt 2 resumed "
                     f"from {SAVE_EVERY} elsewhere, equal to the no-fault run\n")  # fmt: skip
