"""The soak's pure parts: the seeded fault schedule and the goodput accounting."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from bench import soak_accounting as acc
from bench import soak_compare, soak_judge, soak_report
from bench.soak_schedule import DEFAULT_MIX, KINDS, Fault, schedule


def test_the_schedule_is_seeded_spaced_and_capped() -> None:
    a = schedule(7, 3600, 60, ranks=4, caps={"gpu_xid": 2}, min_gap=30)
    assert a == schedule(7, 3600, 60, ranks=4, caps={"gpu_xid": 2}, min_gap=30)
    assert a != schedule(8, 3600, 60, ranks=4, caps={"gpu_xid": 2}, min_gap=30)
    assert len(a) > 20
    assert all(later.at - earlier.at >= 30 for earlier, later in itertools.pairwise(a))
    assert all(f.at <= 3600 - 30 and f.kind in KINDS and 0 <= f.rank < 4 for f in a)
    assert sum(f.kind == "gpu_xid" for f in a) <= 2
    assert {f.kind for f in a} == set(DEFAULT_MIX), "the default mix draws each of its kinds"
    assert set(KINDS) - set(DEFAULT_MIX) == {"sdc", "bad_node"}, "named in --mix only"
    only = schedule(1, 600, 30, ranks=2, mix={"hang": 1.0})
    assert only and {f.kind for f in only} == {"hang"}
    with pytest.raises(ValueError, match="unknown fault kinds"):
        schedule(1, 600, 30, ranks=2, mix={"meteor": 1.0})


def lines(restored: int | None, steps: dict[int, float], restore_at: float = 0.0) -> list[str]:
    out = []
    if restored is not None:
        out.append(json.dumps({"event": "restore", "step": restored, "time": restore_at}))
    for step, at in steps.items():
        out.append(json.dumps({"step": step, "loss": float(step), "time": at}))
    out.append('{"step": 99, "lo')  # the line a killed rank was writing
    return out


def test_goodput_counts_only_the_steps_that_survive_into_the_final_model() -> None:
    # attempt 1: steps 1-6 at 1 s each from t=10; checkpoint at 4; killed after 6
    one = acc.parse_attempt(1, lines(0, {s: 10.0 + s for s in range(1, 7)}, restore_at=10.0))
    # attempt 2: resumed from 4 at t=30, steps 5-8
    two = acc.parse_attempt(2, lines(4, {s: 30.0 + (s - 4) for s in range(5, 9)}, 30.0))
    attempts = {1: one, 2: two}
    line = acc.lineage(attempts)
    assert line.ranges == ((2, 4, 8), (1, 0, 4))
    assert sorted(line.losses(attempts)) == [1, 2, 3, 4, 5, 6, 7, 8]
    # surviving: steps 1-4 of attempt 1 (4 s) and 5-8 of attempt 2 (4 s); steps 5-6 of
    # attempt 1 were recomputed, and 24..30 s was detection, teardown and start-up
    assert acc.productive_seconds(attempts, line) == pytest.approx(8.0)
    (recovery,) = acc.recoveries([("hang", 17.0)], attempts)
    assert (recovery.attempt, recovery.resumed_attempt) == (1, 2)
    assert recovery.seconds_to_first_step == pytest.approx(14.0)
    assert recovery.lost_steps == 2


def test_checkpoint_stalls_are_lost_time_only_on_the_surviving_steps() -> None:
    """The trainer logs with each step the time its loop spent in the checkpointer's calls
    since the previous step (`ckpt_s`): a blocking save's stall is not productive."""

    def world(restored: int, steps: dict[int, float], stalls: dict[int, float]) -> list[str]:
        out = [json.dumps({"event": "restore", "step": restored, "time": steps[restored + 1] - 1})]
        out += [json.dumps({"step": s, "loss": float(s), "time": t, "ckpt_s": stalls.get(s, 0.0)})
                for s, t in steps.items()]  # fmt: skip
        return out

    # attempt 1: steps 1-6, 1 s each, but step 5 took 1.5 s: 0.5 s of it the save of step 4
    times = {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 5.5, 6: 6.5}
    one = acc.parse_attempt(1, world(0, times, {5: 0.5, 6: 0.0}))
    # attempt 2 resumed from 4 (the saved step): attempt 1's steps 5-6 and their stall are lost
    two = acc.parse_attempt(2, world(4, {5: 20.0, 6: 21.0, 7: 22.25}, {7: 0.25}))
    attempts = {1: one, 2: two}
    line = acc.lineage(attempts)
    assert one.stalls == {5: 0.5} and two.stalls == {7: 0.25}
    # surviving: attempt 1's steps 1-4 (4 s), attempt 2's 5-7 (3.25 s less 0.25 s of stall)
    assert acc.productive_seconds(attempts, line) == pytest.approx(7.0)
    assert acc.stall_seconds(attempts, line) == pytest.approx(0.25)
    # a stall longer than its step's own time (a clock step) never counts negative
    skew = acc.parse_attempt(3, world(0, {1: 1.0, 2: 2.0}, {2: 5.0}))
    assert acc.productive_seconds({3: skew}, acc.lineage({3: skew})) == pytest.approx(1.0)


def test_a_resume_from_a_step_no_attempt_logged_is_an_error() -> None:
    one = acc.parse_attempt(1, lines(0, {1: 1.0, 2: 2.0}))
    two = acc.parse_attempt(2, lines(5, {6: 9.0}))
    with pytest.raises(ValueError, match="resumed from step 5"):
        acc.lineage({1: one, 2: two})


def test_two_worlds_training_at_once_are_caught() -> None:
    fine = {1: {0: [1.0, 2.0], 1: [1.1, 2.1]}, 2: {0: [5.0], 1: [5.1]}}
    assert acc.overlaps(fine) == []
    zombie = {1: {0: [1.0, 2.0], 1: [1.1, 6.0]}, 2: {0: [5.0], 1: [5.1]}}
    (overlap,) = acc.overlaps(zombie)
    assert (overlap.earlier, overlap.later) == (1, 2) and overlap.seconds == pytest.approx(1.0)


# ---------------------------------------------------------------- restarts in place (issue 15)
#
# One job, three worlds: attempt 1 trains steps 1-27 (generation 0), a rank is killed, and
# the operator restarts it in place: generation 1 resumes from fast-tier step 25 (durable
# saves every 10 steps, fast every 5) in the same pods and trains 26-37; then a node is lost
# and attempt 2 (new pods, generation 0) resumes from durable step 30 and trains 31-50.
# Every world appends to its pods' files; rank 1 logs 0.01 s after rank 0.

CREATED = 90.0
KILL, NODE_LOST = 127.5, 147.5


def loss(rank: int, step: int) -> float:
    return step * 0.5 + rank


def world(
    rank: int, generation: int, restored: int, source: str, at: float, steps: range
) -> list[dict[str, Any]]:
    lag = 0.01 * rank
    out: list[dict[str, Any]] = [{"event": "restore", "step": restored, "source": source,
                                  "skipped": [], "time": at + lag}]  # fmt: skip
    out += [{"step": s, "loss": loss(rank, s), "time": at + (s - restored) + lag} for s in steps]
    return [{**r, "rank": rank, "restart": 0, "generation": generation} for r in out]


def job_logs(**change: Any) -> dict[int, dict[int, list[str]]]:
    """logs[attempt][rank]: JSON lines as the pods' files hold them."""
    logs: dict[int, dict[int, list[str]]] = {1: {}, 2: {}}
    for rank in (0, 1):
        first = world(rank, 0, 0, "fresh", 100.0, range(1, 28))
        second = world(rank, 1, 25, change.get("source", "fast-tier"), 135.0, range(26, 38))
        third = world(rank, 0, 30, "resume-file", 160.0, range(31, 51))
        lines = [json.dumps(r) for r in first]
        lines[-1] = lines[-1][:20]  # the record the killed world was writing: half a line...
        lines += [json.dumps(r) for r in second]
        lines[len(first) - 1] += lines.pop(len(first))  # ...and the next one appended to it
        logs[1][rank] = lines
        logs[2][rank] = [json.dumps(r) for r in third]
    return logs


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def job_status(fast: int | None = 25, durable: int | None = 20) -> dict[str, Any]:
    entry = {"generation": 1, "failureClass": "Unknown", "failureCategory": "Infrastructure",
             "detectedAt": iso(KILL + 1.5), "stoppedAt": iso(KILL + 3.0),
             "startedAt": iso(KILL + 5.0), "resumedFromStep": durable,
             "resumedFromFastStep": fast, "outcome": "Running"}  # fmt: skip
    return {
        "phase": "Succeeded", "attempt": 2, "trainerGeneration": 1, "badSteps": [],
        "restarts": {"infrastructure": 2, "user": 0, "preemption": 0, "checkpoint": 0},
        "attempts": [
            {"attempt": 1, "failureClass": "NodeLost", "detectionSeconds": 9.0,
             "recoverySeconds": 4.0, "inPlaceRestarts": [entry]},
            {"attempt": 2, "resumedFromStep": 30},
        ],
        "recoveries": [ledger(2, 0, "WholeWorld", NODE_LOST, 161.01),
                       ledger(1, 1, "InPlace", KILL, 136.01)],
    }  # fmt: skip


def ledger(attempt: int, generation: int, path: str, onset: float, first: float) -> dict[str, Any]:
    """A complete recovery record (status.recoveries) whose first step is the last rank's
    log line of its world's first step (rank 1's, 0.01 s after rank 0's), 0.2 s later."""
    return {"attempt": attempt, "generation": generation, "path": path, "failedAt": iso(onset),
            "detectedAt": iso(onset + 1.5), "decidedAt": iso(onset + 1.5),
            "startedAt": iso(first - 1.0), "restoredAt": iso(first - 0.5),
            "firstStepAt": iso(first + 0.2), "complete": True}  # fmt: skip


def no_fault() -> dict[int, dict[int, float]]:
    return {r: {s: loss(r, s) for s in range(1, 51)} for r in (0, 1)}


INJECTED = [
    {"kind": "rank_killed", "rank": 1, "at": KILL, "scheduled": 27.5, "what": "SIGKILL"},
    {"kind": "node_lost", "rank": 0, "at": NODE_LOST, "scheduled": 47.5, "what": "off"},
]


def judged(logs: Any = None, status: Any = None, baseline: Any = None) -> dict[str, Any]:
    return soak_judge.judge(CREATED, status or job_status(), logs or job_logs(), INJECTED,
                            baseline or no_fault(), [], max_restarts=5)  # fmt: skip


def test_each_generation_of_an_attempt_is_a_world_of_its_own() -> None:
    worlds = acc.split_worlds(job_logs())
    assert list(worlds) == [(1, 0), (1, 1), (2, 0)]
    logs = {w: acc.world_log(w, ranks[0]) for w, ranks in worlds.items()}
    # the half line lost step 27 of generation 0; the record appended to it survived
    assert max(logs[1, 0].steps) == 26
    assert (logs[1, 1].restored, logs[1, 1].restore_source, logs[1, 1].tier) == (
        25, "fast-tier", "fast",
    )  # fmt: skip
    assert logs[2, 0].tier == "durable" and logs[1, 0].tier == "scratch"
    line = acc.lineage(logs)
    assert line.ranges == (((2, 0), 30, 50), ((1, 1), 25, 30), ((1, 0), 0, 25))
    assert line.losses(logs) == no_fault()[0]
    # 25 s of generation 0, 5 s of generation 1 (26-30), 20 s of attempt 2; not the steps
    # 26 of generation 0 and 31-37 of generation 1 trained again, nor the restarts
    assert acc.productive_seconds(logs, line) == pytest.approx(50.0)
    killed, lost = acc.recoveries([("rank_killed", KILL), ("node_lost", NODE_LOST)], logs)
    assert (killed.attempt, killed.generation, killed.resumed_generation) == (1, 0, 1)
    assert (killed.path, killed.resumed_from, killed.tier) == ("in place", 25, "fast")
    assert killed.seconds_to_first_step == pytest.approx(136.0 - KILL)
    assert killed.lost_steps == 1  # rank 0 logged 26 whole (27 was the half line)
    assert (lost.attempt, lost.generation, lost.resumed_attempt) == (1, 1, 2)
    assert (lost.path, lost.resumed_from, lost.tier, lost.lost_steps) == (
        "whole world", 30, "durable", 7,
    )  # fmt: skip


def test_the_soak_holds_its_invariants_across_generations() -> None:
    facts = judged()
    assert facts["problems"] == []
    assert facts["goodput"] == pytest.approx(50.0 / (180.0 - CREATED))
    assert (facts["attempts"], facts["worlds"], facts["in_place_restarts"]) == (2, 3, 1)
    assert list(facts["timeline"]) == ["1", "1 g1", "2"]
    killed, lost = facts["recoveries"]
    assert (killed["path"], killed["failure_class"], killed["pinned_fast_step"]) == (
        "in place", "Unknown", 25,
    )  # fmt: skip
    assert killed["detection_seconds"] == pytest.approx(1.5)
    assert killed["recovery_seconds"] == pytest.approx(3.5)
    assert (lost["path"], lost["failure_class"], lost["pinned_step"]) == (
        "whole world", "NodeLost", 30,
    )  # fmt: skip
    assert [(r["world"], r["step"], r["pinned"]) for r in facts["resumes"]] == [
        ("1", 0, None), ("1 g1", 25, 25), ("2", 30, 30),
    ]  # fmt: skip
    assert soak_report.markdown(facts, {}, "test").count("| in place | Unknown |") == 1
    # the operator's ledger tells each recovery's phases, agreeing with the trainers' logs
    assert killed["ledger_lag"] == lost["ledger_lag"] == pytest.approx(0.2)
    assert sum(killed["ledger"].values()) == pytest.approx(killed["ledger_seconds"])
    assert killed["ledger_seconds"] == pytest.approx(136.21 - KILL)
    table = soak_report.ledger_table(facts["recoveries"])
    assert table[2].startswith("| fault | detected | decided |") and len(table) == 7
    assert table[4].startswith("| rank_killed | 1.5 | 0.0 |  |  |  | 6.0 |  | 0.5 | 0.7 |")
    assert table[4].endswith("| +0.20 |")


def test_a_ledger_missing_or_at_odds_with_the_trainers_logs_is_a_problem() -> None:
    status = job_status()
    whole, in_place = status["recoveries"]
    status["recoveries"] = [{**whole, "firstStepAt": iso(170.0)}, {**in_place, "complete": False}]
    problems = judged(status=status)["problems"]
    assert problems == [
        "rank_killed at +128: world 1 g1 trained but its ledger record is incomplete",
        "world 2: the ledger's first step is +8.99 s from the trainers' logs (allowed -0.05..2.0)",
    ]
    status["recoveries"] = []
    assert len(judged(status=status)["problems"]) == 2


def test_generations_without_their_field_cannot_be_told_apart() -> None:
    logs = job_logs()
    for rank in (0, 1):
        logs[1][rank] = [line.replace(', "generation": 1', "") for line in logs[1][rank]]
    problems = judged(logs)["problems"]
    assert any("resumed from step 25, which no earlier world logged" in p for p in problems)


def test_a_generation_that_starts_before_the_last_one_stopped_is_caught() -> None:
    logs = job_logs()
    late = {"step": 28, "loss": loss(1, 28), "time": 136.5, "rank": 1, "generation": 0}
    logs[1][1].insert(10, json.dumps(late))  # rank 1 of generation 0 still training
    assert "worlds 1 and 1 g1 trained at once (0.50 s)" in judged(logs)["problems"]


def test_a_resume_from_another_step_than_the_operator_pinned_is_caught() -> None:
    assert (
        "world 1 g1 resumed from 25 (fast-tier), the operator pinned 20"
        in judged(status=job_status(fast=20))["problems"]
    )
    unpinned = judged(status=job_status(fast=None))["problems"]
    assert "world 1 g1: resumed from fast-tier step 25, but the operator pinned no fast step" in (
        unpinned
    )
    # the trainer fell back to the durable step the operator pinned beside the fast one: held
    logs = job_logs(source="resume-file")
    fell = judged(logs, status=job_status(fast=25, durable=25))
    assert fell["problems"] == [] and fell["fallbacks"][0].startswith(
        "world 1 g1: fast-tier step 25 pinned, resumed from durable step 25"
    )
    # a durable resume of another step than pinned is not a fallback
    assert (
        "world 1 g1 resumed from 25 (resume-file), the operator pinned 20"
        in judged(logs, status=job_status(fast=25, durable=20))["problems"]
    )


def test_budgets_and_generations_are_counted() -> None:
    status = job_status()
    status["restarts"]["infrastructure"] = 1  # the in-place restart spent nothing?
    status["trainerGeneration"] = 2
    problems = judged(status=status)["problems"]
    assert any(p.startswith("budget: status counts 1 restarts") for p in problems), problems
    assert "trainerGeneration 2, but 1 in-place restarts recorded" in problems
    over = soak_judge.judge(CREATED, job_status(), job_logs(), INJECTED, no_fault(), [],
                            max_restarts=1)  # fmt: skip
    assert over["problems"] == ["budget: 2 infrastructure restarts, over maxRestarts 1"]


def test_a_model_that_differs_is_caught_per_rank() -> None:
    baseline = no_fault()
    baseline[1][28] += 1e-9
    assert judged(baseline=baseline)["problems"] == [
        "rank 1: 1 steps differ from the no-fault run (first [28])"
    ]


def test_the_features_table_counts_paths_and_means_per_fault_kind() -> None:
    facts = judged()
    facts.update(variant="in place, fast tier every 5 steps", harness_seconds=300.0,
                 settings={"mean time between faults": "45 s"}, load_end="2.0 / 2.0 / 2.0",
                 machine="2 CPUs, load average 1.0 / 1.0 / 1.0 at the start")  # fmt: skip
    old = {**facts, "label": "before restart in place", "recoveries": [
        {k: v for k, v in r.items() if k not in ("path", "tier")} for r in facts["recoveries"]
    ]}  # fmt: skip
    header, _, ours, before, *rest = soak_compare.ablation([facts, old])
    assert header.split(" | ")[7:9] == ["node_lost s", "rank_killed s"]
    # 1 in place and 1 whole world; 1 + 7 steps trained again; seconds to the first step
    assert "| 1 / 1 | 8 | 13.5 (1) | 8.5 (1) | 1.0 / 1.0 / 1.0; 2.0 / 2.0 / 2.0 | 300 |" in ours
    assert before.startswith("| before restart in place |") and "| 0 / 2 | 8 |" in before
    cells = [r for r in rest if r.startswith("| +28 s | rank_killed |")]
    assert cells == ["| +28 s | rank_killed | in place: 8.5 s / 1, from 25 (fast) | "
                     "whole world: 8.5 s / 1 |"]  # fmt: skip


def test_a_job_that_never_finished_is_missing_steps() -> None:
    logs = job_logs()
    for rank in (0, 1):
        logs[2][rank] = logs[2][rank][:-5]  # the last world stopped after step 45
    status = job_status()
    status["phase"] = "Failed"
    facts = judged(logs, status=status)
    assert facts["problems"] == [
        "rank 0: 5 steps of the no-fault run never trained (first [46, 47, 48, 49, 50])",
        "rank 1: 5 steps of the no-fault run never trained (first [46, 47, 48, 49, 50])",
        "the job ended Failed",
    ]
    assert (facts["phase"], facts["reached_step"]) == ("Failed", 45)
    # a fault restarted in place again and again, and nothing trained after it
    logs = job_logs()
    del logs[2]
    status = job_status()
    status.update(phase="Failed", attempt=1, trainerGeneration=2)
    del status["attempts"][1]
    entries = status["attempts"][0]["inPlaceRestarts"]
    entries.append({**entries[0], "generation": 2, "detectedAt": iso(NODE_LOST + 2.0)})
    killed, lost = judged(logs, status=status)["recoveries"]
    assert killed["path"] == "in place"
    assert (lost["path"], lost["detection_seconds"]) == ("in place (1 restarts), never trained "
                                                         "again", pytest.approx(2.0))  # fmt: skip


def test_a_mix_is_parsed_by_kind_and_a_bad_one_names_what_was_expected() -> None:
    import argparse

    from bench.goodput import parse_mix

    assert parse_mix("sdc=1, rank_killed=0.5") == {"sdc": 1.0, "rank_killed": 0.5}
    assert parse_mix("hang") == {"hang": 1.0}
    for bad, said in (("meteor=1", "expected one of"), ("sdc=lots", "KIND=WEIGHT"),
                      ("sdc=-1", "0 or more"), ("sdc=0", "at least one positive")):  # fmt: skip
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            parse_mix(bad)


def test_only_a_schedule_that_may_hold_an_sdc_gives_the_trainers_the_flip_file() -> None:
    from bench.soak_training import FLIP_FILE, SoakOptions, trainer_args

    flip = f"--fault-flip-file={FLIP_FILE}"
    assert flip not in trainer_args(SoakOptions())
    assert flip in trainer_args(SoakOptions(mix={"sdc": 1.0}))
    assert flip in trainer_args(SoakOptions(faults=[Fault(30.0, "sdc", 1)]))
    assert flip not in trainer_args(SoakOptions(faults=[Fault(30.0, "hang", 1)], mix={"sdc": 1}))


def test_an_auto_interval_soak_saves_by_the_operators_interval_with_the_fleets_prior() -> None:
    import yaml

    from bench.soak_training import SoakOptions, job_body, platform_config, trainer_args
    from rtj_operator.policy.platform import load_interval_policy

    opts = SoakOptions(mtbf=300.0, auto_interval=True, fast_every=50)
    args = trainer_args(opts)
    assert "--save-seconds=auto" in args and "--save-every=0" in args
    assert not [a for a in args if a.startswith("--save-every=") and a != "--save-every=0"]
    checkpoint = job_body(opts)["spec"]["checkpoint"]
    assert checkpoint["plannedIntervalSeconds"] == "auto"
    text = yaml.safe_dump(platform_config(opts))
    policy = load_interval_policy(text)
    # 12 faults an hour over the job's 2 pods: the operator's prior is the schedule's rate
    assert policy.prior(2).per_hour == pytest.approx(3600 / 300)
    assert yaml.safe_load(text)["checkpointIntervals"]["minSeconds"] == 5
    assert "preflight" not in yaml.safe_load(text)  # the published runs' pods: unchanged
    assert opts.features()["auto_interval"] is True and "interval auto" in opts.variant()
    with pytest.raises(ValueError, match="no drain"):
        SoakOptions(auto_interval=True, fast_every=50, drain_every=100)
    fixed = trainer_args(SoakOptions(save_every=200))
    assert "--save-every=200" in fixed and not [a for a in fixed if "save-seconds" in a]


def test_only_a_schedule_that_may_hold_a_bad_node_gets_a_preflight_that_fails_there(
    tmp_path: Path,
) -> None:  # fmt: skip
    import subprocess

    import yaml

    from bench.soak_training import BAD_NODES, CAPS, NODES, SoakOptions, platform_config
    from rtj_operator.policy.platform import load_preflight_policy

    assert platform_config(SoakOptions()) is None
    fixed = SoakOptions(faults=[Fault(30.0, "hang", 1)], mix={"bad_node": 1})
    assert platform_config(fixed) is None
    opts = SoakOptions(mix={"bad_node": 1.0, "hang": 1.0}, work=tmp_path)
    policy = load_preflight_policy(yaml.safe_dump(platform_config(opts)))
    assert policy.image is not None and policy.node_command[:2] == ("sh", "-c")
    (tmp_path / BAD_NODES).mkdir()
    (tmp_path / BAD_NODES / "node-b").write_text("")

    def check(node: str) -> subprocess.CompletedProcess[str]:
        env = {"RTJ_NODE_NAME": node, "PATH": "/usr/bin:/bin"}
        return subprocess.run(list(policy.node_command), env=env, capture_output=True,
                              text=True, check=False)  # fmt: skip

    bad, good = check("node-b"), check("node-a")
    assert bad.returncode == 226 and "failed the memory test" in bad.stderr, bad
    assert good.returncode == 0, good
    # with spares, a node more per kind of fault that takes one for good and may occur
    assert SoakOptions(spares=1, mix={"hang": 1.0}).nodes() == NODES + 1
    assert SoakOptions(spares=1, mix={"bad_node": 1.0}).nodes() == NODES + 1 + CAPS["bad_node"]
    assert SoakOptions(spares=1).nodes() == NODES + 1 + CAPS["gpu_xid"] + CAPS["node_lost"]


def test_the_bad_node_watcher_kills_only_what_trains_on_a_broken_node(tmp_path: Path) -> None:
    import subprocess
    import sys

    from bench.soak_bad_nodes import BadNodes

    procs = {n: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
             for n in ("a", "b", "c")}  # fmt: skip
    pods = [{"metadata": {"name": f"pod-{n}"}, "spec": {"nodeName": f"node-{n}"},
             "status": {"phase": "Running" if n != "c" else "Pending"}} for n in procs]  # fmt: skip
    watcher = BadNodes(tmp_path / "bad", lambda: pods,
                       lambda pod: procs[pod["metadata"]["name"][-1]].pid)  # fmt: skip
    try:
        watcher.add("node-b")
        watcher.add("node-c")
        watcher.sweep(watcher.nodes)
        assert procs["b"].wait(10) == -9 and (tmp_path / "bad" / "node-b").exists()
        assert procs["a"].poll() is None and procs["c"].poll() is None  # c: not running yet
        assert [k["pod"] for k in watcher.kills] == ["pod-b"]
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    with pytest.raises(ValueError, match="folder"):
        BadNodes(None, lambda: [], lambda pod: None).add("node-a")


def test_the_report_names_the_mix_its_schedule_was_drawn_from() -> None:
    words = soak_report._mix_words
    assert words(dict(DEFAULT_MIX)).startswith("The default mix")
    assert words({"sdc": 1.0, "hang": 0.5}).startswith(
        "The mix drawn from (`--mix`): sdc 1, hang 0.5."
    )
    assert words(None).startswith("A fixed schedule")
