"""Drill on real training through the pod runner (issue 15): an in-place restart that hangs
falls back to re-creating the whole world at its deadline.

A job with ``spec.recovery.inPlace`` (``inPlaceDeadlineSeconds: 20``) runs the example
trainer, 2 worker pods of one rank each, under ``rtj-shim supervise``. Rank 0's supervisor
is frozen (SIGSTOP of the supervisor process alone, as a supervisor stuck in the kernel or
a livelock would be: its trainer and its pod's progress sidecar go on), then rank 1's
training process is SIGKILLed. The operator orders both pods to stop; rank 1's supervisor
reports ``stopped``, rank 0's never does, so the barrier never opens. Past the deadline the
operator records the restart as ``FellBack``, naming the pod that held the barrier, and
re-creates the whole world without spending a second restart: no process of the old world
is left when the next attempt's JobSet is created (the frozen supervisor and its trainer
included), the next attempt resumes from the newest verified step, and the finished model
equals the no-fault run bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster.processes import pid_alive
from e2e.demo import drills, story
from e2e.operator_proc import wait_for
from e2e.podrunner.runner import descendants
from rtj_operator.policy.render import jobset_name

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]

JOB = "drill-fallback"
STEPS, SAVE_EVERY = 300, 40
"""As the in-place drill's: one no-fault run serves both."""
DEADLINE = 20
"""spec.recovery.inPlaceDeadlineSeconds (the smallest allowed is 10)."""
LATE = 10
"""How long past the deadline the fallback may come: the plan looks again every second
while a restart waits; the rest is a loaded machine's slack."""


def _trainer_processes(opts: story.Options, pod: dict[str, Any]) -> list[int]:
    """The pod's trainer container: its main process (the supervisor) and every process
    under it (torchrun, the rank)."""
    main = drills.container_pid(opts, pod)
    return [main, *descendants(main)]


def _supervisor(opts: story.Options, pod: dict[str, Any]) -> int:
    main = _trainer_processes(opts, pod)[0]
    assert b"supervise" in Path(f"/proc/{main}/cmdline").read_bytes(), "the container's main"
    return main


def _seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def test_an_in_place_restart_that_hangs_falls_back_to_the_whole_world_at_its_deadline(
    tmp_path: Path,
) -> None:
    with drills.controlling_platform(tmp_path, "rtj-fallback", 3) as platform:
        opts, api = platform.opts, platform.api
        api.create_rtj(story.NAMESPACE, drills.in_place_job(JOB, SAVE_EVERY, STEPS, DEADLINE))
        before = drills.scheduled(api, JOB, 2)
        held, victim = drills.rank_pod(before, 0), drills.rank_pod(before, 1)
        log0 = drills.rank_log(opts, held, 0)
        # past a durable save and well before the next: the next attempt resumes from it
        wait_for("training between durable saves", lambda: (
            (t := drills.trained(log0)) > SAVE_EVERY and 5 <= t % SAVE_EVERY <= SAVE_EVERY // 2
        ), 300, 0.05)  # fmt: skip
        old_world = [pid for pod in before for pid in _trainer_processes(opts, pod)]
        os.kill(_supervisor(opts, held), signal.SIGSTOP)
        os.kill(drills.trainer_pid(opts, victim), signal.SIGKILL)
        killed = time.monotonic()

        def next_world() -> dict[str, Any] | None:
            found = drills.jobset(api, JOB)
            named = found is not None and found["metadata"]["name"] == jobset_name(JOB, 2)
            return found if named else None

        wait_for("the next attempt's JobSet", next_world, DEADLINE + 240, 0.1)
        left = [pid for pid in old_world if pid_alive(pid)]
        assert not left, f"the old world's processes {left} ran when the next was created"
        sys.stdout.write(f"\nfrozen supervisor + SIGKILL -> the next attempt's JobSet: "
                         f"{time.monotonic() - killed:.1f} s\n")  # fmt: skip

        status = drills.status(api, JOB)
        record = status["attempts"][0]
        (entry,) = record["inPlaceRestarts"]
        assert entry["outcome"] == "FellBack", entry
        assert entry["firstFailed"]["pod"] == victim["metadata"]["name"], entry
        assert record["evidence"][0] == (
            f"in-place restart fell back: {held['metadata']['name']} had not stopped "
            f"generation 1 within {DEADLINE}s"
        ), record["evidence"]
        waited = _seconds(entry["detectedAt"], record["endedAt"])
        assert DEADLINE - 1 <= waited <= DEADLINE + LATE, (waited, entry, record)
        events = api.list_events(story.NAMESPACE, "reason=InPlaceRestartFellBack")
        assert events, "the fallback is an Event"

        def succeeded() -> bool:
            return drills.status(api, JOB).get("phase") == "Succeeded"

        wait_for("the job to succeed", succeeded, 600, 1.0)
        status = drills.status(api, JOB)
        assert status["attempt"] == 2 and len(status["attempts"]) == 2, status["attempts"]
        assert status["restarts"]["infrastructure"] == 1, "the fallback spent no second restart"
        resumed = status["attempts"][1]["resumedFromStep"]
        assert resumed is not None and resumed % SAVE_EVERY == 0 and resumed > 0, status
        after = drills.pods(api, JOB, 2)
        assert not {p["metadata"]["uid"] for p in after} & {p["metadata"]["uid"] for p in before}

        want = drills.no_fault_losses(tmp_path, STEPS, SAVE_EVERY)
        for rank in (0, 1):
            first = drills.rank_log(opts, drills.rank_pod(before, rank), rank).read_text()
            again = drills.rank_log(opts, drills.rank_pod(after, rank), rank).read_text()
            restores = [json.loads(x) for x in again.splitlines() if '"restore"' in x]
            assert [r["step"] for r in restores] == [resumed], (rank, restores)
            trained_again = drills.losses(again.splitlines())
            assert min(trained_again) == resumed + 1 and max(trained_again) == STEPS
            got = {**drills.losses(first.splitlines()), **trained_again}
            diff = sorted(s for s in want[rank] if got.get(s) != want[rank][s])
            assert not diff, f"rank {rank}: {len(diff)} steps differ (first {diff[:5]})"
        sys.stdout.write(f"the next attempt resumed from step {resumed}\n")
