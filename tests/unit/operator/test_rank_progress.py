"""Hangs, stragglers and the progress summary in the plan (issue 12, operator side), the
progress poller's bookkeeping, and the rendered progress sidecar."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

from rtj_test_support import NOW, make_job
from rtj_world import iso, jobset, pod, reading, rtj_raw, snapshot, with_status

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.pod_http import PollFailed
from rtj_operator.policy import control_key
from rtj_operator.policy import progress as rank_progress
from rtj_operator.policy.render import avoided_nodes, render_jobset
from rtj_operator.policy.stragglers import Straggler
from rtj_operator.rank_polls import JobTargets, RankPolls
from rtj_operator.reconcile.converge import HANG_TEARDOWN_GRACE
from rtj_operator.reconcile.ranks import progress_port

RUNNING = {"phase": "Running", "attempt": 1, "attempts": [{"attempt": 1, "jobSet": "llm-a1"}]}
T = NOW.timestamp()


def with_sidecar(p: dict[str, Any], port: int = 9478) -> dict[str, Any]:
    """The pod as created from a render with progress monitoring on (trim_pod keeps this)."""
    ports = [{"name": keys.PROGRESS_PORT_NAME, "containerPort": port, "protocol": "TCP"}]
    p["spec"]["initContainers"] = [{"name": keys.PROGRESS_SIDECAR, "ports": ports}]
    return p


def running_pods(n: int = 2) -> list[dict[str, Any]]:
    pods = [with_sidecar(pod(1, i)) for i in range(n)]
    for i, p in enumerate(pods):
        p["status"]["podIP"] = f"10.0.0.{i + 1}"
    return pods


def rank(
    r: int,
    step: int | None,
    section: str,
    seconds: float,
    *,
    steps: tuple[float, ...] = (0.05,) * 8,
    completed: int = 100,
) -> dict[str, Any]:
    """One rank as `rtj-shim progress-server` serves it (rtj_shim.agent.progress_server, schema
    1)."""
    median = sorted(steps)[len(steps) // 2] if steps else None
    return {
        "rank": r, "local_rank": 0, "pid": 100 + r, "restart": 0, "state": "running",
        "step": step, "steps_completed": completed, "section": section,
        "seconds_in_section": seconds, "seconds_since_update": seconds,
        "seconds_since_step": seconds, "seconds_since_start": 600.0,
        "last_step_seconds": steps[-1] if steps else None, "median_step_seconds": median,
        "median_busy_seconds": median, "recent_step_seconds": list(steps),
        "recent_wait_seconds": [0.0] * len(steps), "last_checkpoint_seconds": None,
        "max_checkpoint_seconds": None, "checkpoints": 0, "seq": 7, "updated_wall_time": T,
    }  # fmt: skip


def report(pod_name: str, *ranks: dict[str, Any], age: float = 0.0) -> rank_progress.PodReport:
    body = {"schema": 1, "pod_wall_time": T, "hostname": pod_name, "ranks": list(ranks)}
    return rank_progress.PodReport(pod_name, T - age, body)


def readings(
    pods: list[dict[str, Any]], *ranks: dict[str, Any], age: float = 0.0, **kw: Any
) -> rc.RankReadings:
    reports = tuple(
        report(p["metadata"]["name"], r, age=age) for p, r in zip(pods, ranks, strict=True)
    )
    return rc.RankReadings(attempt=1, reports=reports, polled_at=T - age, **kw)


def plan(
    pods: list[dict[str, Any]],
    ranks: rc.RankReadings | None,
    raw: dict[str, Any] | None = None,
    **spec: Any,
) -> rc.Plan:
    raw = raw or rtj_raw(RUNNING, replicas=len(pods), **spec)
    snap = snapshot(raw, jobsets=[jobset(1)], pods=pods)
    return rc.plan(replace(snap, ranks=ranks))


FIXED_60 = {"progress": {"hangTimeoutSeconds": 60}}


def test_a_rank_stuck_in_forward_while_the_other_waits_is_a_hang_naming_it() -> None:
    pods = running_pods()
    stuck = readings(pods, rank(0, 812, "allreduce", 93.0), rank(1, 812, "forward", 94.0))
    p = plan(pods, stuck, **FIXED_60)
    patch = p.status_patch
    assert patch is not None and patch.status["phase"] == "Restarting"
    record = patch.status["attempts"][0]
    assert record["failureClass"] == "Hang" and record["failureCategory"] == "unknown"
    assert record["firstFailed"]["rank"] == 1
    assert record["firstFailed"]["pod"] == pods[1]["metadata"]["name"]
    assert record["firstFailed"]["node"] == "gpu-node-001"
    assert record["detectionSeconds"] == 94.0  # from its last progress to the record
    assert "'forward' of step 813" in record["evidence"][0]
    assert patch.status["restarts"]["infrastructure"] == 1  # maxRestarts, with backoff
    assert not patch.status.get("quarantinedNodes"), "a hang blames no node"
    deletes = [a for a in p.actions if isinstance(a, rc.DeletePod)]
    assert {d.name for d in deletes} == {q["metadata"]["name"] for q in pods}
    assert {d.grace_seconds for d in deletes} == {HANG_TEARDOWN_GRACE}
    warnings = [a for a in p.actions if isinstance(a, rc.PostEvent) and a.type == "Warning"]
    assert any("Hang on rank 1" in e.message for e in warnings)


def test_ranks_making_progress_are_no_hang_and_fill_the_progress_summary() -> None:
    pods = running_pods()
    fine = readings(pods, rank(0, 812, "forward", 0.02), rank(1, 812, "backward", 0.01))
    p = plan(pods, fine, **FIXED_60)
    patch = p.status_patch
    assert patch is not None and patch.status["phase"] == "Running"
    summary = patch.status["progress"]
    assert summary["attempt"] == 1 and summary["step"] == 812 and summary["ranks"] == 2
    assert summary["stepSeconds"] == 0.05 and summary["stepsPerSecond"] == 20.0
    assert not any(isinstance(a, rc.DeletePod) for a in p.actions)


def test_the_progress_summary_carries_the_fast_step_every_pod_holds() -> None:
    pods = running_pods()
    names = [p["metadata"]["name"] for p in pods]
    tiers = {names[0]: {"step": 810, "committed_wall_time": T - 3},
             names[1]: {"step": 805, "committed_wall_time": T - 9}}  # fmt: skip
    spec: dict[str, Any] = {
        **FIXED_60,
        "recovery": {"inPlace": True},
        "checkpoint": {"uri": "s3://ckpt/llm", "fastTier": {"everySteps": 5}},
    }
    fine = readings(
        pods, rank(0, 812, "forward", 0.02), rank(1, 812, "backward", 0.01), fast_tiers=tiers
    )
    patch = plan(pods, fine, **spec).status_patch
    assert patch is not None
    summary = patch.status["progress"]
    assert summary["fastStep"] == 805, "the newest step every pod holds"
    assert summary["fastCommittedAt"] == iso(NOW - timedelta(seconds=3))
    # a pod with no fast step yet: none for the job
    waiting = replace(fine, fast_tiers={**tiers, names[1]: None})
    none_yet = plan(pods, waiting, **spec)
    patch = none_yet.status_patch
    assert patch is not None and patch.status["progress"].get("fastStep") is None
    # the attempt's first fast step is written at once, not up to 30 s later with the step
    raw = with_status(rtj_raw(RUNNING, replicas=2, **spec), none_yet)
    snap = snapshot(raw, jobsets=[jobset(1)], pods=pods, now=NOW + timedelta(seconds=5))
    first = rc.plan(replace(snap, ranks=replace(fine, polled_at=fine.polled_at + 5)))
    assert first.status_patch is not None, first.summary
    assert first.status_patch.status["progress"]["fastStep"] == 805
    moved = {names[0]: {**tiers[names[0]], "step": 815}, names[1]: {**tiers[names[1]], "step": 810}}
    raw = with_status(raw, first)
    later = replace(snap, now=NOW + timedelta(seconds=10), rtj=snapshot(raw).rtj)
    again = rc.plan(replace(later, ranks=replace(fine, fast_tiers=moved)))
    assert again.status_patch is None, "a later fast step waits for the summary's 30 s"


def test_the_progress_summary_is_rewritten_at_most_every_30_seconds() -> None:
    pods = running_pods()
    first = plan(pods, readings(pods, rank(0, 800, "data", 0.0), rank(1, 800, "data", 0.0)))
    raw = with_status(rtj_raw(RUNNING, replicas=2), first)
    step_812 = (rank(0, 812, "data", 0.0), rank(1, 812, "data", 0.0))
    later = readings(pods, *step_812, age=-10)  # polled 10 s after the first write
    snap = snapshot(raw, jobsets=[jobset(1)], pods=pods, now=NOW + timedelta(seconds=10))
    quiet = rc.plan(replace(snap, ranks=later))
    assert quiet.status_patch is None, "the step moved 10 s after the last write: no write"
    assert quiet.requeue_after is not None and quiet.requeue_after <= 20.0
    snap = replace(snap, now=NOW + timedelta(seconds=31))
    moved = rc.plan(replace(snap, ranks=readings(pods, *step_812, age=-31)))
    assert moved.status_patch is not None
    assert moved.status_patch.status["progress"]["step"] == 812


def test_automatic_timeouts_follow_the_observed_step_time_and_spare_the_startup() -> None:
    pods = running_pods()
    # 50 ms steps: the allowance is the 30 s floor
    hung = plan(pods, readings(pods, rank(0, 9, "allreduce", 39), rank(1, 9, "forward", 40)))
    assert hung.status_patch is not None and hung.status_patch.status["phase"] == "Restarting"
    fine = plan(pods, readings(pods, rank(0, 9, "allreduce", 25), rank(1, 9, "forward", 25)))
    assert fine.status_patch is None or fine.status_patch.status["phase"] == "Running"
    # before its first steps a rank gets the start-up grace (600 s by default)
    starting = readings(
        pods, rank(0, None, "start", 300, steps=()), rank(1, None, "start", 300, steps=())
    )
    p = plan(pods, starting)
    assert p.status_patch is None or p.status_patch.status["phase"] == "Running"


def test_no_hang_is_judged_from_stale_reports_or_before_every_worker_runs() -> None:
    pods = running_pods()
    stuck = (rank(0, 812, "allreduce", 93.0), rank(1, 812, "forward", 94.0))
    stale = plan(pods, readings(pods, *stuck, age=45), **FIXED_60)
    assert stale.status_patch is None or stale.status_patch.status["phase"] == "Running"
    admitted = {**RUNNING, "phase": "Admitted"}
    starting = [*pods[:1], {**pods[1], "status": {**pods[1]["status"], "phase": "Pending"}}]
    raw = rtj_raw(admitted, replicas=2, **FIXED_60)
    p = plan(starting, readings(pods, *stuck), raw=raw)
    assert p.status_patch is None or p.status_patch.status["phase"] != "Restarting"
    off = plan(pods, readings(pods, *stuck), progress={"enabled": False})
    assert off.status_patch is None or off.status_patch.status["phase"] == "Running"
    other_attempt = replace(readings(pods, *stuck), attempt=2)
    p = plan(pods, other_attempt, **FIXED_60)
    assert p.status_patch is None or p.status_patch.status["phase"] == "Running"


def test_a_straggler_gets_a_condition_and_one_event() -> None:
    pods = running_pods(3)
    slow = Straggler(2, pods[2]["metadata"]["name"], 0.08, 0.05, 3)
    ranks = [rank(i, 812, "data", 0.01) for i in range(3)]
    first = plan(pods, readings(pods, *ranks, stragglers=(slow,)))
    patch = first.status_patch
    assert patch is not None
    assert patch.status["progress"]["stragglers"][0]["rank"] == 2
    assert patch.status["progress"]["stragglers"][0]["node"] == "gpu-node-002"
    condition = {c["type"]: c for c in patch.status["conditions"]}["Straggling"]
    assert condition["status"] == "True" and "rank 2" in condition["message"]
    events = [a for a in first.actions if isinstance(a, rc.PostEvent)]
    assert [e.reason for e in events] == ["StragglerDetected"]
    raw = with_status(rtj_raw(RUNNING, replicas=3), first)
    again = plan(pods, readings(pods, *ranks, stragglers=(slow,)), raw=raw)
    assert not [a for a in again.actions if isinstance(a, rc.PostEvent)], "reported once"
    cleared = plan(pods, readings(pods, *ranks), raw=raw)
    patch = cleared.status_patch
    assert patch is not None
    condition = {c["type"]: c for c in patch.status["conditions"]}["Straggling"]
    assert condition["status"] == "False"


def test_replace_node_keeps_the_next_attempt_off_the_stragglers_node() -> None:
    status = {
        **RUNNING,
        "progress": {
            "attempt": 1, "observedAt": "2025-03-14T12:00:00Z", "ranks": 4,
            "stragglers": [{"rank": 2, "pod": "p", "node": "gpu-node-002", "ratio": 1.6,
                            "attempt": 1, "since": "2025-03-14T12:00:00Z"}],
        },
    }  # fmt: skip
    job = make_job()
    job = job.model_copy(update={"status": job.status.model_validate(status)})
    assert avoided_nodes(job, 2) == [], "Report (the default) keeps the node"
    replacing = make_job(progress={"stragglers": {"action": "ReplaceNode"}})
    replacing = replacing.model_copy(update={"status": job.status})
    assert avoided_nodes(replacing, 2) == ["gpu-node-002"]
    assert avoided_nodes(replacing, 3) == [], "only the next attempt avoids it"
    spec = render_jobset(replacing, 2, None)["spec"]["replicatedJobs"][0]["template"]["spec"]
    terms = spec["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchFields"][0]["values"] == ["gpu-node-002"]


def test_poll_targets_are_the_current_attempts_trusted_running_pods_with_an_ip() -> None:
    pods = running_pods(5)
    pods[2]["status"].pop("podIP")
    pods[3]["spec"].pop("initContainers")  # created without the sidecar: nothing to poll
    with_sidecar(pods[4], port=19478)  # created when spec.progress.port was 19478
    stranger = with_sidecar(pod(1, 5))
    stranger["status"]["podIP"] = "10.0.0.9"
    stranger["metadata"]["ownerReferences"] = []  # a bare pod labelled for the job
    old = with_sidecar(pod(0, 0))
    old["status"]["podIP"] = "10.0.0.8"
    raw = rtj_raw(RUNNING, replicas=5)
    snap = snapshot(raw, jobsets=[jobset(1)], pods=[*pods, stranger, old])
    targets = rc.poll_targets(snap)
    assert [(t.pod, t.ip, t.port) for t in targets] == [
        (pods[0]["metadata"]["name"], "10.0.0.1", 9478),
        (pods[1]["metadata"]["name"], "10.0.0.2", 9478),
        (pods[4]["metadata"]["name"], "10.0.0.5", 19478),
    ]
    off = snapshot(rtj_raw(RUNNING, progress={"enabled": False}), jobsets=[jobset(1)], pods=pods)
    assert rc.poll_targets(off) == ()
    # while it restarts, what is left of the failed attempt (being deleted) is still read
    leaving = [with_sidecar(pod(1, i, deleting=True)) for i in range(2)]
    for i, p in enumerate(leaving):
        p["status"]["podIP"] = f"10.0.1.{i + 1}"
    restarting = snapshot(rtj_raw({**RUNNING, "phase": "Restarting"}), gone_jobsets=[jobset(1)],
                          pods=leaving)  # fmt: skip
    assert [t.ip for t in rc.poll_targets(restarting)] == ["10.0.1.1", "10.0.1.2"]
    running_deleting = snapshot(raw, jobsets=[jobset(1)], pods=leaving)
    assert rc.poll_targets(running_deleting) == (), "a running attempt's leaving pods: no"
    suspended = snapshot(rtj_raw({**RUNNING, "phase": "Suspended"}), jobsets=[], pods=pods)
    assert rc.poll_targets(suspended) == ()


def test_the_poller_keeps_the_last_answer_of_a_pod_that_stops_answering() -> None:
    answers: dict[str, Any] = {
        "10.0.0.1": {"schema": 1, "ranks": [rank(0, 5, "data", 0.0)]},
        "10.0.0.2": {"schema": 1, "ranks": [rank(1, 5, "data", 0.0)]},
    }
    clock = [NOW]
    rounds: list[tuple[str, str]] = []

    asked: list[str] = []

    def fetch(ip: str, port: int, timeout: float, key: str | None) -> Any:
        asked.append(ip)
        if ip not in answers:
            raise PollFailed("ConnectionRefusedError: [Errno 111] Connection refused")
        return answers[ip]

    polls = RankPolls(lambda: clock[0], rounds.append, fetch=fetch)
    key = ("team-a", "llm")
    targets = (rc.PollTarget("p0", "10.0.0.1", 9478, 1), rc.PollTarget("p1", "10.0.0.2", 9478, 1))
    asyncio.run(polls.poll_once([JobTargets(key, targets)]))
    first = polls.reading(key)
    assert first is not None and [r.pod for r in first.reports] == ["p0", "p1"]
    assert rounds == [key]
    del answers["10.0.0.2"]
    clock[0] = NOW + timedelta(seconds=5)
    asyncio.run(polls.poll_once([JobTargets(key, targets)]))
    second = polls.reading(key)
    assert second is not None
    assert [(r.pod, r.received_at) for r in second.reports] == [("p0", T + 5), ("p1", T)], (
        "p1 keeps its last report, which ages out of the evidence by itself"
    )
    assert second.unanswered and "Connection refused" in second.unanswered[0]
    assert second.quiet_since == {"p1": T + 5}, "quiet since its first unanswered poll"
    asked.clear()
    for _ in range(4):  # a pod that keeps not answering is asked every 2, 4, ... rounds
        asyncio.run(polls.poll_once([JobTargets(key, targets)]))
    assert asked.count("10.0.0.1") == 4 and asked.count("10.0.0.2") == 1
    later = polls.reading(key)
    assert later is not None and later.quiet_since == {"p1": T + 5}, "kept while not asked"
    asyncio.run(polls.poll_once([]))
    assert polls.reading(key) is None and rounds[-1] == key, "a job no longer polled is dropped"
    polls.close()


def test_the_progress_sidecar_is_rendered_as_a_native_sidecar() -> None:
    job = make_job(checkpoint={"uri": "s3://ckpt/team-a/llm", "resolverImage": "rtj/resolver:1"})
    spec = render_jobset(job, 1, None)["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod_spec = spec["template"]["spec"]
    names = [c["name"] for c in pod_spec["initContainers"]]
    assert names == [keys.RESUME_INIT_CONTAINER, keys.PROGRESS_SIDECAR]
    sidecar = pod_spec["initContainers"][1]
    assert sidecar["restartPolicy"] == "Always" and sidecar["image"] == "rtj/resolver:1"
    assert sidecar["command"][:2] == ["rtj-shim", "progress-server"]
    assert sidecar["command"][-2:] == ["--host", "$(RTJ_POD_IP)"]
    assert sidecar["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert sidecar["volumeMounts"] == [
        {"name": keys.PROGRESS_VOLUME, "mountPath": keys.PROGRESS_DIR, "readOnly": True}
    ]
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    volume = next(v for v in pod_spec["volumes"] if v["name"] == keys.PROGRESS_VOLUME)
    assert volume["emptyDir"]["medium"] == "Memory"
    trainer = pod_spec["containers"][0]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env[keys.ENV_PROGRESS_DIR] == keys.PROGRESS_DIR
    resolver = pod_spec["initContainers"][0]
    assert all(m["name"] != keys.PROGRESS_VOLUME for m in resolver["volumeMounts"])
    # rendering twice never duplicates what the operator owns
    again = render_jobset(
        job.model_copy(update={"spec": job.spec.model_copy(update={"template": spec["template"]})}),
        2,
        None,
    )["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert [c["name"] for c in again["initContainers"]] == names
    assert sorted(v["name"] for v in again["volumes"]) == sorted(
        v["name"] for v in pod_spec["volumes"]
    )
    off = make_job(progress={"enabled": False})
    plain = render_jobset(off, 1, None)["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert [c["name"] for c in plain["template"]["spec"]["initContainers"]] == [
        keys.RESUME_INIT_CONTAINER
    ]
    assert keys.ENV_PROGRESS_DIR not in {
        e["name"] for e in plain["template"]["spec"]["containers"][0]["env"]
    }


def _sidecar_env(job: Any, key: str | None) -> list[dict[str, Any]]:
    spec = render_jobset(job, 1, None, key)["spec"]["replicatedJobs"][0]["template"]["spec"]
    init = spec["template"]["spec"]["initContainers"]
    env: list[dict[str, Any]] = next(c for c in init if c["name"] == keys.PROGRESS_SIDECAR)["env"]
    return env


def test_with_a_control_key_every_jobs_sidecar_answers_only_signed_reads() -> None:
    """Not only in-place jobs' (issue 42): the sidecar holds the job's key and uid and is told
    to refuse unsigned reads; the poller signs every read of a job with a key."""
    key = "k" * 64
    for job in (make_job(), make_job(recovery={"inPlace": True})):
        env = _sidecar_env(job, key)
        named = [e["name"] for e in env]
        assert control_key.key_env(job.metadata.uid) in env
        assert {"name": keys.ENV_JOB_UID, "value": job.metadata.uid} in env
        assert {"name": keys.ENV_SIGNED_READS, "value": "1"} in env
        assert len(named) == len(set(named)), "each once, in-place or not"
    assert [e["name"] for e in _sidecar_env(make_job(), None)] == [keys.ENV_POD_IP], (
        "no control secret: nothing to sign with, reads stay open"
    )


def test_the_watch_cache_keeps_the_port_a_pod_was_created_with() -> None:
    job = make_job(progress={"port": 19478})
    rendered = render_jobset(job, 1, None)["spec"]["replicatedJobs"][0]["template"]["spec"]
    body = {"metadata": {"name": "p", "namespace": "team-a"}, **rendered["template"]}
    body["spec"] = {**body["spec"], "nodeName": "gpu-node-000"}
    trimmed = rc.trim_pod(body)
    assert progress_port(trimmed) == 19478
    assert trimmed["spec"]["initContainers"] == [
        {"name": keys.PROGRESS_SIDECAR,
         "ports": [{"name": "rtj-progress", "containerPort": 19478, "protocol": "TCP"}]}
    ]  # fmt: skip
    assert len(str(trimmed)) < 600, "the cache keeps the name and the port, not the container"


def test_the_platform_resolver_image_runs_the_init_container_and_the_sidecar() -> None:
    def images(raw: dict[str, Any], platform: str | None) -> dict[str, str]:
        snap = replace(snapshot(raw, store=reading(100)), resolver_image=platform)
        (create,) = [a for a in rc.plan(snap).actions if isinstance(a, rc.CreateJobSet)]
        spec = create.body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        return {c["name"]: c["image"] for c in [*spec["initContainers"], *spec["containers"]]}

    platform = "ghcr.io/resilient-training/rtj-resolver:0.1.0"
    found = images(rtj_raw(), platform)
    assert found[keys.RESUME_INIT_CONTAINER] == found[keys.PROGRESS_SIDECAR] == platform
    assert found["trainer"].startswith("registry.example/llm@"), "the trainer keeps its own"
    own = rtj_raw(checkpoint={"uri": "s3://ckpt/team-a/llm", "resolverImage": "mine:1"})
    assert images(own, platform)[keys.RESUME_INIT_CONTAINER] == "mine:1", "the job's wins"
    assert images(rtj_raw(), None)[keys.PROGRESS_SIDECAR] == found["trainer"]


def test_one_plan_parses_the_same_reports_once() -> None:
    """parse_reports keeps its last parse of a tuple (by identity, at the same `now`): the
    hang timeouts, the verdict and the summary of one plan share it; a list, a new tuple or
    another `now` are parsed afresh."""
    pods = running_pods(2)
    got = readings(pods, rank(0, 5, "forward", 1.0), rank(1, 5, "forward", 1.0))
    first = rank_progress.parse_reports(got.reports, T)
    assert rank_progress.parse_reports(got.reports, T) is first
    assert rank_progress.parse_reports(list(got.reports), T) == first
    assert rank_progress.parse_reports(got.reports, T + 1) is not first
    later = rank_progress.parse_reports(tuple(got.reports), T + 1)
    assert later == rank_progress.parse_reports(got.reports, T + 1)


def test_with_a_control_key_the_sidecar_seals_its_answers_and_the_poller_requires_it() -> None:
    """Issue 42, finding 6: a pod rendered with the job's key seals its answers with its own
    name and attempt (downward API); the watch cache keeps that it does, and the pod is
    polled as one whose unsealed answers are not its own."""
    key = "k" * 64
    job = make_job()
    env = _sidecar_env(job, key)
    assert {"name": keys.ENV_SEALED_ANSWERS, "value": "1"} in env
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in env
            if "fieldRef" in e.get("valueFrom", {})}  # fmt: skip
    assert refs[keys.ENV_POD_NAME] == "metadata.name"
    assert refs[keys.ENV_POD_ATTEMPT] == f"metadata.labels['{keys.ATTEMPT_LABEL}']"
    rendered = render_jobset(job, 1, None, key)["spec"]["replicatedJobs"][0]["template"]["spec"]
    body = {"metadata": {"name": "p", "namespace": "team-a"}, **rendered["template"]}
    trimmed = rc.trim_pod(body)
    (sidecar,) = trimmed["spec"]["initContainers"]
    assert sidecar["env"] == [{"name": keys.ENV_SEALED_ANSWERS, "value": "1"}], "no key kept"
    assert rc.answers_sealed(trimmed)
    unsealed = render_jobset(job, 1, None)["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert not rc.answers_sealed(rc.trim_pod({"metadata": {"name": "p"}, **unsealed["template"]}))
