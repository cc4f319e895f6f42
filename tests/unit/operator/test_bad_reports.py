"""A pod's progress report is the pod speaking (issue 42): a value no sidecar writes makes that
pod's report no report, never an exception that stops the poller for every other job.

Reports are JSON text as a sidecar would send it (`rtj_shim.agent.progress_report`, through
`progress_reports.rank`), read with `json.loads` as `pod_http.read_progress` reads it: it
accepts integers of any size, NaN and Infinity.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from progress_reports import NOW, rank
from rtj_test_support import NOW as WALL_NOW

from rtj_operator import reconcile as rc
from rtj_operator.policy.progress import (
    PodReport,
    auto_timeout,
    hang_verdict,
    job_progress,
    parse_reports,
    report_problem,
)
from rtj_operator.policy.stragglers import stragglers
from rtj_operator.rank_polls import JobTargets, RankPolls

HUGE = "1" + "0" * 400  # a 400-digit integer: no float holds it
GOOD = json.dumps(rank(0, 5, "forward", 1.0, steps=[0.05] * 8))


def _entry(**raw: str) -> str:
    """The good rank entry with `raw` fields replaced by raw JSON text."""
    entry = json.loads(GOOD)
    for key in raw:
        entry[key] = f"@{key}@"
    text = json.dumps(entry)
    for key, value in raw.items():
        text = text.replace(f'"@{key}@"', value)
    return text


def _body(*entries: str, **parts: str) -> dict[str, Any]:
    extra = "".join(f', "{k}": {v}' for k, v in parts.items())
    text = f'{{"schema": 1, "hostname": "w", "ranks": [{", ".join(entries)}]{extra}}}'
    body = json.loads(text)  # as pod_http reads an answer
    assert isinstance(body, dict)
    return body


BAD_BODIES = {
    "a 400-digit step": _body(_entry(step=HUGE)),
    "a 400-digit step count": _body(_entry(steps_completed=HUGE)),
    "a 400-digit rank": _body(_entry(rank=HUGE)),
    "a 400-digit recent step": _body(_entry(recent_step_seconds=f"[0.05, {HUGE}]")),
    "NaN in section": _body(_entry(seconds_in_section="NaN")),
    "Infinity in section": _body(_entry(seconds_in_section="Infinity")),
    "a NaN median": _body(_entry(median_step_seconds="NaN")),
    "an infinite busy time": _body(_entry(median_busy_seconds="-Infinity")),
    "a NaN recent step": _body(_entry(recent_step_seconds="[0.05, NaN]")),
    "a negative time in section": _body(_entry(seconds_in_section="-30.0")),
    "a negative recent step": _body(_entry(recent_step_seconds="[0.05, -0.5]")),
    "a negative save": _body(_entry(max_checkpoint_seconds="-3")),
    "a negative record age": _body(_entry(seconds_since_update="-1")),
    "a negative step": _body(_entry(step="-2")),
    "a huge list of recent steps": _body(_entry(recent_step_seconds=json.dumps([0.05] * 100_000))),
    "a huge list of ranks": _body(*[GOOD] * 10_000),
    "a section of 10,000 characters": _body(_entry(section=json.dumps("x" * 10_000))),
    "a string step": _body(_entry(step='"five"')),
    "a true step": _body(_entry(step="true")),
    "a float rank": _body(_entry(rank="1.5")),
    "a numeric section": _body(_entry(section="7")),
    "a numeric state": _body(_entry(state="2")),
    "a string duration": _body(_entry(seconds_since_update='"soon"')),
    "recent steps as a string": _body(_entry(recent_step_seconds='"0.05"')),
    "a null recent step": _body(_entry(recent_step_seconds="[0.05, null]")),
    "a rank entry that is a number": _body(GOOD, "5"),
    "a fast tier's 400-digit commit time": _body(
        GOOD, fast_tier=f'{{"step": 5, "committed_wall_time": {HUGE}}}'
    ),
    "a supervisor's NaN": _body(GOOD, supervisor='{"state": "running", "step": NaN}'),
    "a replica nested 20 deep": _body(GOOD, replica="[" * 20 + "]" * 20),
}


@pytest.mark.parametrize("why", sorted(BAD_BODIES))
def test_a_bad_value_makes_that_pods_report_no_report(why: str) -> None:
    bad = PodReport("bad", NOW, BAD_BODIES[why])
    good = PodReport("good", NOW, _body(_entry(rank="1")))
    reports = (bad, good)
    parsed = parse_reports(reports, NOW)
    assert parsed.bad_pods == ("bad",), why
    assert [r.rank for r in parsed.ranks] == [1], "the other pod's report stands"
    problem = report_problem(bad)
    assert problem is not None and problem in parsed.problems[0], why
    # every decision over the reports reads the bad one as no report, none raises
    assert stragglers(reports, now=NOW).stragglers == ()
    assert hang_verdict(reports, 60.0, NOW) is None
    assert auto_timeout(reports, now=NOW).step >= 30.0
    assert job_progress(reports, NOW).step == 5


def test_what_a_sidecar_writes_is_a_report() -> None:
    """The bounds leave every value `rtj_shim.agent.progress_report` writes: nulls before a first
    step, a save or a section, zero durations, the shim's 16 recent steps."""
    body = _body(
        _entry(step="null", median_step_seconds="null", max_checkpoint_seconds="null"),
        _entry(rank="1", recent_step_seconds=json.dumps([0.0] * 16)),
        _entry(rank="2", seconds_in_section="null", section="null"),
        supervisor='{"state": "running", "generation": 3}',
        fast_tier='{"step": 5, "committed_wall_time": 1717000000.123}',
    )
    report = PodReport("w", NOW, body)
    assert report_problem(report) is None
    parsed = parse_reports([report], NOW)
    assert [r.rank for r in parsed.ranks] == [0, 1] and parsed.bad_pods == ()
    assert parsed.problems == ("w: rank 2 without section timing",)


# ---------------------------------------------------------------------- the poller

A, B = ("team-a", "bad"), ("team-b", "fine")
TARGETS = {
    A: (rc.PollTarget("a0", "10.0.0.1", 9478, 1),),
    B: (rc.PollTarget("b0", "10.0.1.1", 9478, 1), rc.PollTarget("b1", "10.0.1.2", 9478, 1)),
}


def _polls(answers: dict[str, Any], on_round: Any) -> RankPolls:
    def fetch(ip: str, port: int, timeout: float, key: str | None) -> Any:
        return answers[ip]

    return RankPolls(lambda: WALL_NOW, on_round, fetch=fetch)


def _jobs() -> list[JobTargets]:
    return [JobTargets(key, targets) for key, targets in TARGETS.items()]


def test_one_pods_bad_report_is_its_bad_answer_and_every_other_job_is_read() -> None:
    answers = {
        "10.0.0.1": _body(GOOD),
        "10.0.1.1": _body(GOOD),
        "10.0.1.2": _body(_entry(rank="1")),
    }
    rounds: list[tuple[str, str]] = []
    polls = _polls(answers, rounds.append)
    asyncio.run(polls.poll_once(_jobs()))
    before = polls.reading(A)
    assert before is not None and [r.pod for r in before.reports] == ["a0"]
    answers["10.0.0.1"] = _body(_entry(seconds_in_section=HUGE))  # next round: 400 digits
    asyncio.run(polls.poll_once(_jobs()))
    bad, fine = polls.reading(A), polls.reading(B)
    assert rounds == [A, B, A, B], "both jobs' rounds ran, twice"
    assert fine is not None and [r.pod for r in fine.reports] == ["b0", "b1"]
    assert fine.polled_at == WALL_NOW.timestamp() and not fine.unanswered
    assert bad is not None and bad.unanswered == (
        f"a0: a bad progress report: seconds_in_section {HUGE[:37]}... is not seconds in 0..1e+09",
    )
    assert bad.reports == before.reports, "its last good report stands, and ages out"
    assert polls.job_errors == {}, "a bad report is a bad answer, not an error"
    polls.close()


def test_an_error_in_one_jobs_part_of_a_round_is_that_jobs_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = {
        ip: _body(_entry(rank=str(i))) for i, ip in enumerate(("10.0.0.1", "10.0.1.1", "10.0.1.2"))
    }
    judged: list[tuple[str, str]] = []

    def on_round(key: tuple[str, str]) -> None:
        if key == A:
            raise RuntimeError("the plan of team-a/bad broke")
        judged.append(key)

    polls = _polls(answers, on_round)
    with caplog.at_level(logging.DEBUG, logger="rtj_operator.rank_polls"):
        for _ in range(3):
            asyncio.run(polls.poll_once(_jobs()))
    assert judged == [B, B, B], "the other job's round went on every time"
    fine = polls.reading(B)
    assert fine is not None and [r.pod for r in fine.reports] == ["b0", "b1"]
    assert polls.job_errors == {A: 3} and polls.rounds == 3
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1 and "team-a/bad" in logged[0].getMessage(), "logged once, by name"
    asyncio.run(polls.poll_once([j for j in _jobs() if j.key == B]))
    assert polls.job_errors == {}, "a job no longer polled is forgotten"
    polls.close()
