"""Drill on real training through the pod runner (issue 43 section 5): a rank that resumes
reading its data at the wrong position is named. The example trainer (2 worker pods, one
rank each, under ``rtj-shim supervise`` with ``spec.recovery.inPlace``) runs with
``--fault-misalign-rank=1``: after any resume, rank 1 reads its labels one record off its
features (a packed file read from the wrong offset). Rank 1's training process is
SIGKILLed; the in-place restart resumes both ranks from the durable step, and 16 steps
later the trainers' data alignment check (`rtj_shim.alignment`) names rank 1 alone: its
supervisor reports the finding, the operator shows it in status.progress.misalignedResume
with one Warning Event, and training goes on (a warning unless the user opts in to fail).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from e2e.demo import drills, story
from e2e.operator_proc import wait_for

pytestmark = [pytest.mark.demo, pytest.mark.timeout(600)]

JOB = "drill-misaligned"
SAVE_EVERY = 20
WINDOW = 16  # AlignmentCheck().window: the check runs WINDOW steps after the resume


def test_a_rank_that_resumed_at_the_wrong_data_position_is_named(tmp_path: Path) -> None:
    with drills.controlling_platform(tmp_path, "rtj-misalign", 2) as platform:
        opts, api = platform.opts, platform.api
        body = drills.in_place_job(JOB, SAVE_EVERY, 100000)
        body["spec"]["template"]["spec"]["containers"][0]["command"].append(
            "--fault-misalign-rank=1"
        )
        api.create_rtj(story.NAMESPACE, body)
        wait_for("both pods running", lambda: len(drills.pods(api, JOB, 1)) == 2, 300, 0.5)
        pods = drills.pods(api, JOB, 1)
        victim = drills.rank_pod(pods, 1)
        log = drills.rank_log(opts, victim, 1)

        def trained() -> int:
            try:
                return max(drills.losses(log.read_text().splitlines()), default=0)
            except FileNotFoundError:
                return 0

        wait_for("training past a durable save", lambda: trained() >= SAVE_EVERY + 5, 300, 0.5)
        os.kill(drills.trainer_pid(opts, victim), signal.SIGKILL)
        entry = wait_for("the in-place restart", lambda: drills.first_restart(api, JOB), 180, 0.5)
        assert entry["outcome"] == "Running", entry
        resumed = entry["resumedFromStep"]
        assert resumed is not None and resumed % SAVE_EVERY == 0, entry

        def shown() -> dict[str, object] | None:
            progress = drills.status(api, JOB).get("progress") or {}
            found: dict[str, object] | None = progress.get("misalignedResume")
            return found

        found = wait_for("the finding in status.progress", shown, 180, 0.5)
        assert found["ranks"] == [1], found
        assert (found["attempt"], found["generation"]) == (1, 1), found
        assert found["step"] == resumed + WINDOW, (found, resumed)
        factors = found["factors"]
        assert isinstance(factors, list) and factors[0] > 1.5, found
        events = api.list_events(story.NAMESPACE, "reason=ResumeMisaligned")
        assert len(events) == 1 and events[0]["type"] == "Warning", events
        assert "rank 1 (" in events[0]["message"] and "rank 0" not in events[0]["message"]
        status = drills.status(api, JOB)
        assert status["phase"] == "Running" and status["trainerGeneration"] == 1, status
        api.delete_rtj(story.NAMESPACE, JOB)
