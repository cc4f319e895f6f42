"""Drill on real training through the pod runner (issue 48): `plannedIntervalSeconds: auto` and
`fastTier.everySteps: auto`.

The example trainer (2 worker pods, one rank each, restart in place, a fast tier) saves
durably only by time, ``Checkpointer(every_seconds="auto")``. The operator starts from the
platform's prior (set here so that one failure in a two-minute job weighs: the prior is
worth one and a half failures), measures the trainers' durable save cost from their
reports, and hands its interval to every pod's sidecar; the trainers save at it. Then one
rank is SIGKILLed: the in-place restart is a failure the job has seen, the rate it plans
for rises, the interval shortens, and the restarted trainers save at the new one. Checked
against the trainers' own logs: the gaps between their saves are the interval in status,
before and after. The fast tier starts at `AUTO_FAST_EVERY_START` steps (no step time
measured when the pods were made) and the in-place restart's run order carries the interval
chosen from the measured step time and fast-save cost: the restarted trainers' fast steps
are its multiples.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from e2e.demo import drills, story
from e2e.operator_proc import wait_for
from rtj_operator.policy.intervals import AUTO_FAST_EVERY_START

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]

JOB = "drill-intervals"
PLATFORM = """\
checkpointIntervals:
  priorFailuresPerNodeHour: 15     # a 2-pod job: 30 an hour before its own evidence
  priorWeightHours: 0.05           # worth 3 minutes of running: one and a half failures
  assumedSaveSeconds: 0.2
  minSeconds: 2
  maxSeconds: 120
  fastTierCovers: 0.3              # the durable interval against 70% of the failures
"""
SLACK_S = 4.0
"""A save comes after its interval by up to the agreement's period, a step and a save, on a
loaded 2-core machine: a gap may exceed the interval by this."""


def _intervals(api: Any) -> dict[str, Any]:
    return drills.status(api, JOB).get("checkpointIntervals") or {}


def _save_times(log: Path, generation: int, after: float) -> list[float]:
    """When the rank's durable saves in `generation` after `after` were published (its log's
    clock: the example trainer logs each save once published)."""
    times = []
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        saved = record.get("event") == "save" and record.get("generation") == generation
        if saved and float(record["time"]) > after:
            times.append(float(record["time"]))
    return times


def _fast_steps(log: Path, generation: int) -> list[int]:
    """The fast-tier steps the rank wrote in `generation` (the example logs each once)."""
    steps = []
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "fast_save" and record.get("generation") == generation:
            steps.append(int(record["step"]))
    return steps


HANDOFF_S = 7.0
"""From a choice in status to every trainer saving by it: the poller's next round (1 s), the
trainers' next look at the file (`interval_order.RECHECK_S`, 5 s), and a step."""


class Choices:
    """The intervals status held, as the drill saw them (each `chosenAt` with its seconds):
    the exposure moves the rate as the job runs and the measured cost moves too, so the
    interval in force changes now and then, and a gap between two saves is checked against
    every value in force while it ran."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.seen: dict[float, float] = {}

    def poll(self) -> dict[str, Any]:
        chosen = _intervals(self.api)
        if chosen.get("chosenAt"):
            self.seen[_t(chosen["chosenAt"])] = float(chosen["durableSeconds"])
        return chosen

    def bounds(self, start: float, end: float) -> tuple[float, float]:
        """The least and the most seconds in force between `start` and `end` (a choice
        reaches the trainers `HANDOFF_S` after it is made)."""
        times = sorted(self.seen)
        before = [t for t in times if t + HANDOFF_S <= start]
        during = [t for t in times if start < t + HANDOFF_S <= end]
        values = [self.seen[t] for t in ([before[-1]] if before else []) + during]
        return min(values), max(values)

    def followed(self, log: Path, generation: int, since: float) -> list[float] | None:
        """Every gap between the rank's saves in `generation` after `since` within what was in
        force while it ran (at least 0.75 of the least, at most the most plus `SLACK_S`), once
        there are two; None before."""
        self.poll()
        times = _save_times(log, generation, since)
        if len(times) < 3:
            return None
        gaps = []
        for a, b in itertools.pairwise(times):
            lo, hi = self.bounds(a, b)
            assert 0.75 * lo <= b - a <= hi + SLACK_S, (generation, a, b, lo, hi, self.seen)
            gaps.append(b - a)
        return gaps


def test_the_interval_follows_the_failure_rate_and_the_trainers_follow_it(tmp_path: Path) -> None:
    platform_file = tmp_path / "platform.yaml"
    platform_file.write_text(PLATFORM)
    with drills.controlling_platform(
        tmp_path, "rtj-intervals", 2, "--platform-config", str(platform_file)
    ) as platform:
        opts, api = platform.opts, platform.api
        body = drills.in_place_job(JOB, 0, 100_000)
        body["spec"]["checkpoint"]["plannedIntervalSeconds"] = "auto"
        body["spec"]["checkpoint"]["fastTier"] = {"everySteps": "auto"}
        container = body["spec"]["template"]["spec"]["containers"][0]
        container["command"] = [*container["command"], "--save-seconds=auto"]
        api.create_rtj(story.NAMESPACE, body)
        pods = drills.scheduled(api, JOB, 2)
        log = drills.rank_log(opts, drills.rank_pod(pods, 0), 0)

        choices = Choices(api)
        measured = wait_for("an interval from a measured save cost", lambda: (
            (c := choices.poll()).get("saveCostMeasured") and c), 240, 0.5)  # fmt: skip
        assert measured["failures"] == 0, measured
        assert 2 <= float(measured["durableSeconds"]) <= 120, measured
        since = _t(measured["chosenAt"]) + HANDOFF_S
        gaps0 = wait_for("two gaps between saves at the intervals in force",
                         lambda: choices.followed(log, 0, since), 300, 1.0)  # fmt: skip
        stable = choices.poll()

        victim = drills.rank_pod(pods, 1)
        os.kill(drills.trainer_pid(opts, victim), signal.SIGKILL)
        after_failure = wait_for("the failure counted", lambda: (
            (c := choices.poll()).get("failures") == 1 and c), 180, 0.5)  # fmt: skip
        # the rate rose and the interval was chosen again (shorter at the same save cost;
        # the cost is measured again too, so on a loaded machine it may move either way)
        assert after_failure["failuresPerHour"] > stable["failuresPerHour"], (
            stable, after_failure)  # fmt: skip
        assert after_failure["chosenAt"] != stable["chosenAt"], (stable, after_failure)
        entry = wait_for("the in-place restart", lambda: drills.first_restart(api, JOB), 180, 0.2)
        assert entry["outcome"] == "Running", entry
        gaps1 = wait_for("two gaps between the restarted world's saves at the intervals in force",
                         lambda: choices.followed(log, 1, 0.0), 300, 1.0)  # fmt: skip
        now = choices.poll()
        assert now["failures"] == 1, now
        # the fast tier: the first world at the start value, the restarted one at the choice
        every = entry.get("fastEverySteps")
        assert every is not None and every >= 1, entry
        wait_for("a fast step of the restarted world", lambda: _fast_steps(log, 1), 300, 1.0)
        fast0, fast1 = _fast_steps(log, 0), _fast_steps(log, 1)
        assert fast0 and all(s % AUTO_FAST_EVERY_START == 0 for s in fast0), fast0
        assert fast1 and all(s % every == 0 for s in fast1), (every, fast1)
        sys.stdout.write(
            f"\ninterval {stable['durableSeconds']} s at {stable['failuresPerHour']:.1f}/h "
            f"(saves every {statistics.median(gaps0):.1f} s) -> {now['durableSeconds']} s at "
            f"{now['failuresPerHour']:.1f}/h after one failure (every "
            f"{statistics.median(gaps1):.1f} s); save cost {now['durableSaveSeconds']:.3f} s; "
            f"fast tier every {AUTO_FAST_EVERY_START} -> {every} steps (step "
            f"{drills.status(api, JOB)['progress']['stepSeconds']:.3f} s, fast save "
            f"{now['fastSaveSeconds']:.3f} s)\n"
        )
        api.delete_rtj(story.NAMESPACE, JOB)


def _t(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
