"""The TorchFT baseline's JobSet and judge (bench.baseline_torchft), on plain data."""

from __future__ import annotations

import json
from typing import Any

from bench import baseline_jobset as bj
from bench import baseline_torchft as btf


def line(step: int, t: float, participants: int) -> str:
    return json.dumps({"step": step, "loss": 0.5, "samples": [], "participants": participants,
                       "time": t})  # fmt: skip


def done(t: float, fingerprint: str) -> str:
    return json.dumps({"event": "done", "step": 0, "fingerprint": fingerprint, "time": t})


def test_the_jobset_runs_a_lighthouse_and_one_job_per_replica_group() -> None:
    body = btf.jobset("ns", "q", 3, ["--steps=10"])
    lighthouse, groups = body["spec"]["replicatedJobs"]
    assert (lighthouse["name"], lighthouse["replicas"]) == ("lighthouse", 1)
    assert lighthouse["template"]["spec"]["template"]["spec"]["containers"][0]["command"][:3] == [
        "torchft_lighthouse", "--min_replicas", "1"]  # fmt: skip
    assert (groups["name"], groups["replicas"]) == ("group", 3)
    job = groups["template"]["spec"]
    assert job["parallelism"] == 1 and job["backoffLimit"] == bj.MAX_RESTARTS
    container = job["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["torchrun", "--standalone"]
    assert (
        "examples/torchft_train.py" in container["command"] and "--steps=10" in container["command"]
    )
    env = {e["name"]: e for e in container["env"]}
    assert env["NUM_REPLICA_GROUPS"]["value"] == "3"
    assert env["TORCHFT_LIGHTHOUSE"]["value"] == "http://$(LIGHTHOUSE_HOST):29510"
    assert env["LIGHTHOUSE_HOST"]["value"] == "baseline-lighthouse-0-0.baseline"
    assert "job-index" in env["REPLICA_GROUP_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    # the JobSet completes with its groups, whatever the lighthouse does
    assert body["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["group"]}
    assert body["metadata"]["labels"][bj.QUEUE_LABEL] == "q" and body["spec"]["suspend"] is True


def pod(name: str, group: int, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {btf.RJOB_LABEL: "group",
                                                     btf.JOB_INDEX_LABEL: str(group)}}  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def test_a_groups_pods_are_its_running_undeleted_ones() -> None:
    pods = [pod("a", 0), pod("b", 1), pod("c", 1, "Failed"), pod("d", 1, deleting=True),
            pod("e", 1)]  # fmt: skip
    assert [p["metadata"]["name"] for p in btf.group_pods(pods, 1)] == ["b", "e"]


def test_a_survivor_trains_on_and_the_killed_group_heals_to_the_quorums_step() -> None:
    # two groups 1 s a step; group 1 killed after step 3, back (healed) at step 6
    g0 = [line(s, float(s), 2 if s <= 3 or s >= 6 else 1) for s in range(1, 9)]
    g1_first = [line(s, float(s), 2) for s in range(1, 4)]
    g1_back = [line(s, float(s), 2) for s in range(6, 9)]
    restore = json.dumps({"event": "restore", "step": 5, "time": 5.5})
    runs = [(0, [*g0, done(8.5, "x")]), (1, g1_first), (1, [restore, *g1_back, done(8.5, "x")])]
    fault = {"kind": "rank_killed", "rank": 1, "at": 2.5}  # step 3 was under way
    facts = btf.judge(0.0, 9.0, "Completed", runs, [fault], None, steps=8, groups=2)
    assert facts["problems"] == [] and facts["reached_step"] == 8
    assert facts["steps_short_of_groups"] == 2 and facts["samples_never_trained"] == 2
    assert facts["steps_trained_again"] == 0 and facts["attempts"] == 3
    assert facts["typical_step_seconds"] == 1.0 and facts["mean_step_seconds"] == 1.0
    assert facts["first_step_seconds"] == 1.0
    # 6 full steps and 2 half steps at 1 s, over 8 s of wall time
    assert facts["goodput"] == 7.0 / 8.0 and facts["goodput_by_steps"] == 1.0
    (rec,) = facts["recoveries"]
    assert rec["seconds_to_rejoin"] == 3.5 and rec["rejoined_at_step"] == 6
    assert rec["stall_seconds"] == 1.0
    assert any("without every replica group" in f for f in facts["findings"])
    assert not any("different models" in f for f in facts["findings"])


def test_steps_trained_again_after_every_group_started_over_from_a_file() -> None:
    before = [line(s, float(s), 2) for s in range(1, 6)]
    after = [line(s, 20.0 + s, 2) for s in range(3, 9)]  # resumed from step 2's file
    runs = [(0, before), (1, before), (0, after), (1, after)]
    facts = btf.judge(0.0, 30.0, "Completed", runs, [], None, steps=8, groups=2)
    assert facts["steps_trained_again"] == 3  # steps 3, 4, 5
    assert facts["reached_step"] == 8 and facts["wall_seconds"] == 28.0


def test_groups_that_end_apart_and_a_hung_group_are_findings() -> None:
    g0 = [line(s, float(s), 2) for s in range(1, 5)]
    runs = [(0, [*g0, done(5.0, "aaa")]), (1, [*g0, done(5.0, "bbb")])]
    facts = btf.judge(0.0, 6.0, "Completed", runs, [], None, steps=4, groups=2)
    assert any("different models" in f for f in facts["findings"])
    # one group hung (no end): the model is trained, the JobSet never completes
    runs = [(0, [*g0, done(5.0, "aaa")]), (1, g0[:2])]
    facts = btf.judge(0.0, 60.0, None, runs, [], "pod hung", steps=4, groups=2)
    assert facts["wall_seconds"] == 4.0, "the model was done at its last step"
    assert any("did not complete" in f for f in facts["findings"])
    assert any("groups [1] did not reach the end" in f for f in facts["findings"])


def test_a_run_short_of_its_steps_counts_to_the_cap() -> None:
    runs = [(0, [line(s, float(s), 1) for s in range(1, 4)])]
    facts = btf.judge(0.0, 100.0, None, runs, [], "stuck", steps=10, groups=2)
    assert facts["wall_seconds"] == 100.0 and facts["reached_step"] == 3
    assert any(f.startswith("did not finish: step 3 of 10") for f in facts["findings"])
    empty = btf.judge(0.0, 100.0, None, [], [], None, steps=10, groups=2)
    assert empty["problems"] == ["no training step was logged"] and empty["goodput"] == 0.0


def test_trained_out_is_a_groups_end_in_its_logs_last_bytes(tmp_path: Any) -> None:
    from bench import goodput_torchft
    from e2e.demo import story

    platform = story.Options(out=tmp_path / "out", state=tmp_path / "state",
                             cluster_name="c", nodes=1, timeout=1)  # fmt: skip
    logs = platform.state / "runner" / "pods" / story.NAMESPACE
    log = logs / "baseline-group-1-0-abcde-1234" / "volumes" / "train-logs" / "group-1.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("".join(line(s, float(s), 2) + "\n" for s in range(1, 200)))
    assert not goodput_torchft._trained_out(platform)
    with log.open("a") as f:
        f.write(done(300.0, "abc") + "\n")
    assert goodput_torchft._trained_out(platform)
