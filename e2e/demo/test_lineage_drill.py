"""Drill on real training through the pod runner (issue 43, section 1): two histories of the
same fast step numbers never mix.

A job restarting in place with the fast tier and no peer replica trains past a durable
save with fast steps after it (history A). Rank 1's node is lost: its pod is created
again with an empty fast tier, so no fast step is held for every rank and the world
resumes from the durable step (history B), re-saving fast steps of the numbers A already
saved on rank 0's pod. Rank 0's trainer is then killed while the newest fast step every
pod holds is such a number: the operator pins it in B's lineage (`status.inPlace` and the
run order name it), rank 0 has discarded A's copies on its restore, and both ranks resume
from B's copies. Before lineages, rank 0 kept A's copies (B's re-save of the number was
refused as already published), the pin was a bare number, and the world restored rank 0
from A and rank 1 from B. The finished model equals the no-fault run's bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.demo import drills, story
from e2e.operator_proc import wait_for
from rtj_operator.api import keys
from rtj_shim.wire.control import ORDER_FILE

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]

JOB = "drill-lineage"
STEPS, SAVE_EVERY, FAST_EVERY = 200, 40, 5


def _job() -> dict[str, Any]:
    body = drills.in_place_job(JOB, SAVE_EVERY, STEPS)
    body["spec"]["checkpoint"]["fastTier"] = {"everySteps": FAST_EVERY, "keep": 8,
                                              "peerReplicas": 0}  # fmt: skip
    return body


def _restarts(api: Any) -> list[dict[str, Any]]:
    record = (drills.status(api, JOB).get("attempts") or [{}])[0]
    return [e for e in record.get("inPlaceRestarts") or [] if e.get("outcome")]


def _trained_since_restore(log: Path) -> int:
    """The newest step the rank trained since its last restore (0: none yet)."""
    lines = log.read_text().splitlines() if log.exists() else []
    last = max((i for i, x in enumerate(lines) if '"restore"' in x), default=-1)
    return max(drills.losses(lines[last + 1 :]), default=0)


def _restores(log: Path) -> list[tuple[int, str]]:
    lines = [json.loads(x) for x in log.read_text().splitlines() if '"restore"' in x]
    return [(r["step"], r["source"]) for r in lines]


def _order(opts: story.Options, pod: dict[str, Any]) -> dict[str, Any]:
    path = story._pod_dir(opts, pod) / "volumes" / keys.CONTROL_VOLUME / ORDER_FILE
    order: dict[str, Any] = json.loads(path.read_text())
    return order


def test_a_fast_step_number_two_histories_saved_is_restored_from_one(tmp_path: Path) -> None:
    with drills.controlling_platform(tmp_path, "rtj-lineage", 3) as platform:
        opts, api = platform.opts, platform.api
        api.create_rtj(story.NAMESPACE, _job())
        before = drills.scheduled(api, JOB, 2)
        survivor, victim = drills.rank_pod(before, 0), drills.rank_pod(before, 1)
        log0 = drills.rank_log(opts, survivor, 0)
        # history A: well past a durable save, with fast steps after it on both pods
        wait_for("history A past a durable save", lambda: (
            (t := drills.trained(log0)) > SAVE_EVERY and 25 <= t % SAVE_EVERY <= 33
        ), 300, 0.05)  # fmt: skip
        lost = victim["spec"]["nodeName"]
        (cut,) = drills.cut_off(opts, [victim])
        trained_in_a = drills.trained(log0)
        try:
            wait_for("the lost node's restart", lambda: _restarts(api), 240, 0.2)
        finally:
            cut.unlink(missing_ok=True)
        (first,) = _restarts(api)
        assert first["failureClass"] == "NodeLost" and first["outcome"] == "Running", first
        durable = first["resumedFromStep"]
        assert first.get("resumedFromFastStep") is None, "the replacement holds no fast step"
        assert durable < trained_in_a < durable + SAVE_EVERY, (durable, trained_in_a)
        # history B re-saves fast steps A saved too: kill rank 0 while the newest one every
        # pod holds is such a number
        wait_for("history B past two of A's fast step numbers", lambda: (
            durable + 2 * FAST_EVERY + 1 <= _trained_since_restore(log0) < trained_in_a
        ), 240, 0.02)  # fmt: skip
        os.kill(drills.trainer_pid(opts, survivor), signal.SIGKILL)
        wait_for("the second in-place restart", lambda: len(_restarts(api)) == 2, 240, 0.2)
        second = _restarts(api)[1]
        assert second["outcome"] == "Running", second
        fast = second.get("resumedFromFastStep")
        assert fast is not None and durable < fast < trained_in_a, (durable, fast, trained_in_a)
        after = drills.pods(api, JOB, 1)
        replacement = drills.rank_pod(after, 1)
        orders = [_order(opts, p) for p in (survivor, replacement)]
        pinned = {o.get("fast_lineage") for o in orders}
        assert len(pinned) == 1 and None not in pinned, orders  # one history, named

        wait_for("the job to succeed",
                 lambda: drills.status(api, JOB).get("phase") == "Succeeded", 600, 1.0)  # fmt: skip
        log1 = drills.rank_log(opts, replacement, 1)
        restores0, restores1 = _restores(log0), _restores(log1)
        assert [r[0] for r in restores0[1:]] == [durable, fast], restores0
        assert restores0[1][1] != "fast-tier", restores0
        assert restores0[-1] == (fast, "fast-tier") == restores1[-1], (restores0, restores1)
        status = drills.status(api, JOB)
        assert status["attempt"] == 1 and [q["node"] for q in status["quarantinedNodes"]] == [lost]
        got = {0: drills.losses(log0.read_text().splitlines()),
               1: drills.losses(log1.read_text().splitlines())}  # fmt: skip
        want = drills.no_fault_losses(tmp_path, STEPS, SAVE_EVERY)
        for rank in (0, 1):
            diff = sorted(s for s in got[rank] if got[rank][s] != want[rank][s])
            assert not diff, f"rank {rank}: {len(diff)} steps differ (first {diff[:5]})"
            assert max(got[rank]) == STEPS
        sys.stdout.write(f"\nhistory A trained to {trained_in_a}; B resumed from durable "
                         f"{durable}; both ranks restored B's fast step {fast} (lineage "
                         f"{pinned.pop()}), the model equal to the no-fault run\n")  # fmt: skip
