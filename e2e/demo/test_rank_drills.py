"""Drills on real training through the pod runner (issue 12): a rank frozen with SIGSTOP
is a Hang that names it, and a rank slower than the others is a straggler.

Both jobs run the example trainer (examples/ddp_train.py, which reports its sections to
`rtj_shim.progress`) on one local cluster with pod-runner nodes: every worker pod gets the
progress sidecar the operator renders, and the operator polls it each second. Nothing in
Kubernetes sees either fault: every pod stays Running.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.demo import drills, story
from e2e.operator_proc import wait_for
from rtj_operator.api import keys
from rtj_shim.wire.progress_record import read_file

pytestmark = [pytest.mark.demo, pytest.mark.timeout(600)]

HANG_TIMEOUT = 10
POLL = 1.0


def _freeze_in_training(opts: story.Options, pod: dict[str, Any], pid: int) -> tuple[float, str]:
    """SIGSTOP the rank once it trains (any section but ``start``/``restore``): stop, read
    the now still record, and let it go on and try again if it has not started. The time
    of the freeze that held and the section it holds the rank in. Wherever it lands, the
    verdict must name it: where rank 0 goes on to a later phase or step, by position;
    where rank 0 waits in the same section (``barrier``, ``backward`` with DDP's allreduce
    inside it, a save's collectives), by the pulse: rank 0's record keeps being updated
    while it waits, rank 1's went silent."""
    records = story._pod_dir(opts, pod) / "volumes" / keys.PROGRESS_VOLUME
    for _ in range(100):
        os.kill(pid, signal.SIGSTOP)
        at = time.time()
        time.sleep(0.05)
        found = sorted(records.glob("rank-*.progress"))
        section = read_file(found[0]).section if found else ""
        if section not in ("", "start", "restore"):
            return at, section
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.013)
    raise AssertionError("rank 1 never trained at a try")


def test_a_frozen_rank_is_a_hang_and_a_slow_one_a_straggler(tmp_path: Path) -> None:
    with drills.running_platform(
        tmp_path, "rtj-drill", 4, "--progress-poll-seconds", str(POLL)
    ) as platform:
        opts, api = platform.opts, platform.api
        hang = drills.job("drill-hang", progress={"hangTimeoutSeconds": HANG_TIMEOUT})
        slow = drills.job(
            "drill-slow",
            "--straggle-rank=1",
            "--straggle-seconds=0.25",
            progress={"stragglers": {"windows": 3}},
        )
        for body in (hang, slow):
            api.create_rtj(story.NAMESPACE, body)

        # 1. the hang: freeze rank 1's training process once it trains past a checkpoint
        def trained(name: str, step: int) -> bool:
            progress = drills.status(api, name).get("progress") or {}
            return progress.get("attempt") == 1 and (progress.get("step") or 0) >= step

        wait_for("drill-hang to train past step 45", lambda: trained("drill-hang", 45), 240, 0.5)
        victim = drills.rank_pod(drills.pods(api, "drill-hang", 1), 1)
        pid = drills.trainer_pid(opts, victim)
        frozen, section = _freeze_in_training(opts, victim, pid)

        def recorded() -> dict[str, Any] | None:
            attempts = drills.status(api, "drill-hang").get("attempts") or []
            return attempts[0] if attempts and attempts[0].get("failureClass") else None

        record = wait_for("the Hang record", recorded, 120, 0.2)
        seen = time.time() - frozen
        assert record["failureClass"] == "Hang" and record["failureCategory"] == "unknown"
        assert record["firstFailed"]["rank"] == 1, (section, record)
        assert record["firstFailed"]["pod"] == victim["metadata"]["name"]
        evidence = " ".join(record["evidence"])
        assert "rank 1" in evidence and "(> 10s)" in evidence, evidence
        # the allowance, plus a poll period and a reconcile (a loaded CI machine: slack)
        assert HANG_TIMEOUT <= record["detectionSeconds"] <= HANG_TIMEOUT + POLL + 15
        sys.stdout.write(
            f"\nfreeze in '{section}' -> Hang record: {seen:.1f} s (detectionSeconds "
            f"{record['detectionSeconds']}; evidence: {evidence})\n"
        )

        def resumed() -> dict[str, Any] | None:
            status = drills.status(api, "drill-hang")
            attempts = status.get("attempts") or []
            progress = status.get("progress") or {}
            if len(attempts) < 2 or progress.get("attempt") != 2:
                return None
            pinned = attempts[1].get("resumedFromStep")
            return status if pinned and (progress.get("step") or 0) > pinned else None

        status = wait_for("attempt 2 training past its pinned step", resumed, 240, 0.5)
        assert status["attempts"][1]["resumedFromStep"] % 40 == 0  # a verified checkpoint
        assert not status.get("quarantinedNodes"), "a hang blames no node"

        # 2. the straggler: rank 1 spends 0.25 s more per step than rank 0
        def straggling() -> dict[str, Any] | None:
            found_all = drills.status(api, "drill-slow").get("conditions", [])
            conditions = {c["type"]: c for c in found_all}
            found = conditions.get("Straggling")
            return found if found and found["status"] == "True" else None

        condition = wait_for("the Straggling condition", straggling, 240, 0.5)
        assert "rank 1 " in condition["message"] and "rank 0 " not in condition["message"]
        stragglers = drills.status(api, "drill-slow")["progress"]["stragglers"]
        assert [s["rank"] for s in stragglers] == [1] and stragglers[0]["ratio"] > 1.43
        events = api.list_events(story.NAMESPACE, "reason=StragglerDetected")
        assert any("rank 1 " in e.get("message", "") for e in events)
        table = story.kubectl(platform.kubeconfig, "get", "rtj", "-n", story.NAMESPACE)
        header = table.splitlines()[0].split()
        assert header[:6] == ["NAME", "PHASE", "ATTEMPT", "WORKERS", "STEP", "STEPS/S"], table
        sys.stdout.write(f"\n{table}\n{json.dumps(stragglers)}\n")
