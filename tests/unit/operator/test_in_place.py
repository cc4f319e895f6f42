"""Restart in place (spec.recovery.inPlace, issue 15), decided without a cluster: how the
pods are rendered, which failures restart in place, and the stop -> barrier -> start -> done
sequence driven by committed status (its deadline and fallback: test_in_place_deadline.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from rtj_test_support import NOW, make_job, supervisor_reports
from rtj_world import jobset, node, nodes_for, reading, rtj_raw, snapshot, with_status
from test_rank_progress import running_pods

from rtj_operator import reconcile as rc
from rtj_operator.api import keys
from rtj_operator.policy import control_key
from rtj_operator.policy.render import render_jobset
from rtj_shim.wire.supervisor_report import SupervisorReport

KEY = "0123456789abcdef" * 4
IN_PLACE = {"replicas": 2, "recovery": {"inPlace": True, "inPlaceDeadlineSeconds": 60}}
STARTED = {"attempt": 1, "jobSet": "llm-a1", "startedAt": "2025-03-14T11:00:00Z"}
RUNNING = {"phase": "Running", "attempt": 1, "attempts": [STARTED]}
T = NOW.timestamp()


def supervised_pods(n: int = 2) -> list[dict[str, Any]]:
    pods = running_pods(n)
    for p in pods:  # as the watch cache keeps them (reconcile/trim.py): metadata, not volumes
        p["metadata"].setdefault("annotations", {})[keys.SUPERVISED_ANNOTATION] = "true"
    return pods


def readings(pods: list[dict[str, Any]], *states: tuple[int, str, int | None]) -> rc.RankReadings:
    """Per pod: (generation, state, exit code) as its supervisor reports it."""
    reports = {p["metadata"]["name"]: {"generation": g, "state": s, "exit_code": c,
                                       "updated_wall_time": T - 5 + i}
               for i, (p, (g, s, c)) in enumerate(zip(pods, states, strict=True))}  # fmt: skip
    return rc.RankReadings(
        attempt=1,
        reports=(),
        polled_at=T,
        supervisors=supervisor_reports(reports),
    )


def plan(raw: dict[str, Any], pods: list[dict[str, Any]], ranks: rc.RankReadings,
         key: str | None = KEY, **extra: Any) -> rc.Plan:  # fmt: skip
    snap = snapshot(raw, jobsets=[jobset(1)], pods=pods, **extra)
    return rc.plan(replace(snap, ranks=ranks, control_key=key))


def test_the_trainer_runs_under_the_supervisor_and_only_the_sidecar_holds_the_key() -> None:
    job = make_job(**IN_PLACE)
    spec = render_jobset(job, 1, None, KEY)["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod = spec["template"]["spec"]
    trainer = pod["containers"][0]
    assert trainer["command"][:3] == ["rtj-shim", "supervise", "--control-dir"]
    assert trainer["command"][trainer["command"].index("--") + 1 :] == job.spec.template[
        "spec"]["containers"][0]["command"]  # fmt: skip
    sidecar = next(c for c in pod["initContainers"] if c["name"] == keys.PROGRESS_SIDECAR)
    assert sidecar["command"][-2:] == ["--control-dir", keys.CONTROL_DIR]
    # the key itself is in the job's key Secret, never in the template (issue 42)
    assert control_key.key_env(job.metadata.uid) in sidecar["env"]
    assert KEY not in json.dumps(spec)
    assert all(e["name"] != keys.ENV_CONTROL_KEY for c in pod["containers"] for e in c["env"])
    assert any(v["name"] == keys.CONTROL_VOLUME for v in pod["volumes"])
    template = spec["template"]["metadata"]["annotations"]
    assert template[keys.SUPERVISED_ANNOTATION] == "true"
    # no key (the operator has no control secret), or inPlace off: rendered as before
    plain = render_jobset(job, 1, None, None)["spec"]["replicatedJobs"][0]["template"]
    assert plain["spec"]["template"]["spec"]["containers"][0]["command"][0] != "rtj-shim"
    off = render_jobset(make_job(), 1, None, KEY)["spec"]["replicatedJobs"][0]["template"]
    assert off["spec"]["template"]["spec"]["containers"][0]["command"][0] != "rtj-shim"


def test_a_trainer_that_exits_is_stopped_and_started_again_in_the_same_pods() -> None:
    pods = supervised_pods()
    raw = rtj_raw(RUNNING, **IN_PLACE)
    failed = plan(raw, pods, readings(pods, (0, "running", None), (0, "exited", 1)))
    assert not [a for a in failed.actions if isinstance(a, (rc.DeleteJobSet, rc.DeletePod))]
    raw = with_status(raw, failed)
    status = raw["status"]
    assert status["phase"] == "Running" and status["trainerGeneration"] == 1
    assert status["inPlace"]["phase"] == "Stopping" and status["restarts"]["infrastructure"] == 1
    entry = status["attempts"][0]["inPlaceRestarts"][0]
    assert entry["failureClass"] == "Unknown"
    assert entry["firstFailed"]["pod"] == pods[1]["metadata"]["name"]
    assert "exited with code 1" in entry["evidence"][0]
    order = rc.restart_order(snapshot(raw, pods=pods))
    assert order is not None and (order.generation, order.action) == (1, "stop")

    # one pod stopped, the other not yet: the barrier holds
    half = plan(raw, pods, readings(pods, (1, "stopped", 1), (0, "exited", 1)))
    assert half.status_patch is None and not half.actions
    # every pod stopped: the newest verified step is pinned, phase Starting
    stopped = readings(pods, (1, "stopped", None), (1, "stopped", 1))
    starting = plan(raw, pods, stopped, store=reading(1200))
    raw = with_status(raw, starting)
    assert raw["status"]["inPlace"] == {**raw["status"]["inPlace"], "phase": "Starting",
                                        "step": 1200}  # fmt: skip
    order = rc.restart_order(snapshot(raw, pods=pods))
    assert order is not None and (order.action, order.attempt, order.step) == ("run", 1, 1200)
    # every pod runs generation 1: done, recorded, nothing torn down at any point
    done = plan(raw, pods, readings(pods, (1, "running", None), (1, "running", None)))
    assert not [a for a in done.actions if isinstance(a, (rc.DeleteJobSet, rc.DeletePod))]
    raw = with_status(raw, done)
    assert "inPlace" not in raw["status"] and raw["status"]["phase"] == "Running"
    entry = raw["status"]["attempts"][0]["inPlaceRestarts"][0]
    assert (entry["outcome"], entry["resumedFromStep"]) == ("Running", 1200)
    assert rc.restart_order(snapshot(raw, pods=pods)) is None
    assert any(a.reason == "RestartedInPlace" for a in done.actions if isinstance(a, rc.PostEvent))


FAST = {**IN_PLACE, "checkpoint": {"uri": "s3://ckpt/team-a/llm", "fastTier": {"everySteps": 20}}}


def held_as(steps: list[int], lineage: str = "0123456789abcdef") -> list[str]:
    """A supervisor's `fast_held`: the steps, each with its lineage (one history here)."""
    return [f"{lineage}@{s}" for s in steps]


def stopped_holding(pods: list[dict[str, Any]], *held: list[int] | None) -> rc.RankReadings:
    """Every pod's supervisor reports generation 1 stopped, holding these fast steps."""
    reports = {p["metadata"]["name"]: {"generation": 1, "state": "stopped", "exit_code": None,
                                       "updated_wall_time": T,
                                       **({} if h is None else {"fast_steps": h,
                                                           "fast_held": held_as(h)})}
               for p, h in zip(pods, held, strict=True)}  # fmt: skip
    return rc.RankReadings(
        attempt=1,
        reports=(),
        polled_at=T,
        supervisors=supervisor_reports(reports),
    )


def stopping(raw: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    failed = plan(raw, pods, readings(pods, (0, "running", None), (0, "exited", 1)))
    return with_status(raw, failed)


def test_the_newest_fast_step_every_pod_holds_is_pinned_beside_the_durable_one() -> None:
    pods = supervised_pods()
    raw = stopping(rtj_raw(RUNNING, **FAST), pods)
    starting = plan(raw, pods, stopped_holding(pods, [1220, 1240, 1260], [1240, 1260]),
                    store=reading(1200))  # fmt: skip
    raw = with_status(raw, starting)
    state = raw["status"]["inPlace"]
    assert (state["phase"], state["step"], state["fastStep"]) == ("Starting", 1200, 1260)
    assert state["fastLineage"] == "0123456789abcdef", "the history every pod holds it in"
    entry = raw["status"]["attempts"][0]["inPlaceRestarts"][0]
    assert (entry["resumedFromStep"], entry["resumedFromFastStep"]) == (1200, 1260)
    order = rc.restart_order(snapshot(raw, pods=pods))
    assert order is not None
    assert (order.action, order.step, order.fast_step) == ("run", 1200, 1260)
    assert order.fast_lineage == "0123456789abcdef", "the trainers restore only that history"
    done = plan(raw, pods, readings(pods, (1, "running", None), (1, "running", None)))
    raw = with_status(raw, done)
    assert "inPlace" not in raw["status"]
    assert raw["status"]["attempts"][0]["inPlaceRestarts"][0]["resumedFromFastStep"] == 1260
    (event,) = [a for a in done.actions
                if isinstance(a, rc.PostEvent) and a.reason == "RestartedInPlace"]  # fmt: skip
    assert "from fast-tier step 1260 (durable step 1200 as fallback)" in event.message


def test_no_fast_step_is_pinned_unless_every_pod_holds_a_good_new_one() -> None:
    pods = supervised_pods()
    raw = stopping(rtj_raw(RUNNING, **FAST), pods)

    def pinned(ranks: rc.RankReadings, raw: dict[str, Any] = raw, step: int = 1200) -> Any:
        bad = tuple(raw["status"].get("badSteps", ()))  # a reading that excluded them
        store = reading(step, excluded=bad)
        state = with_status(raw, plan(raw, pods, ranks, store=store))["status"]["inPlace"]
        assert (state["phase"], state["step"]) == ("Starting", step)
        return state.get("fastStep")

    assert pinned(stopped_holding(pods, [1240, 1260], None)) is None, "a pod has no list"
    assert pinned(stopped_holding(pods, [1260], [1240])) is None, "nothing held by both"
    assert pinned(stopped_holding(pods, [1180], [1180])) is None, "older than durable"
    assert pinned(stopped_holding(pods, [1180, 1220], [1180, 1220]), step=1180) == 1220
    bad = {**raw, "status": {**raw["status"], "badSteps": [1260]}}
    assert pinned(stopped_holding(pods, [1240, 1260], [1240, 1260]), bad) == 1240
    # without a fast step the order and the event are as before
    starting = with_status(raw, plan(raw, pods, stopped_holding(pods, None, None),
                                     store=reading(1200)))  # fmt: skip
    order = rc.restart_order(snapshot(starting, pods=pods))
    assert order is not None and order.fast_step is None and order.step == 1200
    done = plan(starting, pods, readings(pods, (1, "running", None), (1, "running", None)))
    (event,) = [a for a in done.actions
                if isinstance(a, rc.PostEvent) and a.reason == "RestartedInPlace"]  # fmt: skip
    assert event.message.endswith("from step 1200") and "fast-tier" not in event.message
    entry = with_status(starting, done)["status"]["attempts"][0]["inPlaceRestarts"][0]
    assert "resumedFromFastStep" not in entry


def test_what_needs_another_node_or_a_cluster_view_is_not_restarted_in_place() -> None:
    pods = supervised_pods()
    exited = readings(pods, (0, "running", None), (0, "exited", 1))
    # the operator has no control secret: the whole world, as before
    whole = plan(rtj_raw(RUNNING, **IN_PLACE), pods, exited, key=None)
    assert [a for a in whole.actions if isinstance(a, rc.DeleteJobSet)]
    assert "no control secret" in whole.summary
    # a GPU fault on the failed pod's node needs another node
    sick = {**nodes_for(pods), pods[1]["spec"]["nodeName"]: node(pods[1]["spec"]["nodeName"],
                                                                 xid=79)}  # fmt: skip
    faulty = supervised_pods()
    faulty[1]["status"]["phase"] = "Failed"
    faulty[1]["status"]["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {
        "exitCode": 1, "reason": "Error", "finishedAt": "2025-03-14T11:59:55Z"}}}]  # fmt: skip
    gpu = plan(rtj_raw(RUNNING, **IN_PLACE), faulty, exited, nodes=sick)
    raw = with_status(rtj_raw(RUNNING, **IN_PLACE), gpu)
    assert "inPlace" not in raw["status"]
    # pods created before inPlace was set have no supervisor
    old = running_pods()
    unsupervised = plan(rtj_raw(RUNNING, **IN_PLACE), old, exited)
    assert "no supervisor" in unsupervised.summary


def test_the_poller_sends_each_pod_its_order_then_reads_it_back_in_the_next_round() -> None:
    import asyncio

    from rtj_operator.rank_polls import JobTargets, RankPolls

    sent: list[tuple[str, rc.PollMessage]] = []
    state = {"generation": 0, "state": "running"}

    def send(ip: str, port: int, timeout: float, message: rc.PollMessage) -> None:
        sent.append((ip, message))
        state.update(generation=1, state="stopped")  # the supervisor carried it out

    def fetch(ip: str, port: int, timeout: float, key: str | None) -> Any:
        return {"schema": 1, "ranks": [], "supervisor": dict(state)}

    polls = RankPolls(lambda: NOW, lambda key: None, fetch=fetch, send=send)
    key = ("team-a", "llm")
    targets = (rc.PollTarget("p0", "10.0.0.1", 9478, 1), rc.PollTarget("p1", "10.0.0.2", 9478, 1))
    order = (rc.PollMessage("/control", b"{}", "sha256=ab"),)
    job = JobTargets(key, targets, messages={"p0": order, "p1": order})
    asyncio.run(polls.poll_once([job]))
    assert sorted(ip for ip, _ in sent) == ["10.0.0.1", "10.0.0.2"]
    assert {m.path for _, m in sent} == {"/control"}
    reading = polls.reading(key)
    assert reading is not None and not reading.supervisors and not reading.unanswered, (
        "a pod just given its order is not read in the same round: it cannot show it yet"
    )
    sent.clear()
    asyncio.run(polls.poll_once([job]))
    assert not sent, "the order was taken: the next round only reads the pod back"
    reading = polls.reading(key)
    assert reading is not None
    assert reading.supervisors["p0"] == SupervisorReport.parse(
        {"generation": 1, "state": "stopped"}
    )
    asyncio.run(polls.poll_once([JobTargets(key, targets)]))
    assert not sent, "no order, nothing sent"
    polls.close()


def test_an_order_whose_answer_carries_the_report_is_read_in_the_same_round() -> None:
    """A sidecar answers a restart order once its supervisor took it, with the pod's report
    (`rtj_shim.agent.progress_server`): that stands for the read, and no round reads it back."""
    import asyncio

    from rtj_operator.rank_polls import JobTargets, RankPolls

    fetched: list[str] = []

    def send(ip: str, port: int, timeout: float, message: rc.PollMessage) -> Any:
        if ip == "10.0.0.2":
            return None  # an older sidecar: its answer carries no report
        return {"schema": 1, "ranks": [], "supervisor": {"generation": 1, "state": "stopped"}}

    def fetch(ip: str, port: int, timeout: float, key: str | None) -> Any:
        fetched.append(ip)
        return {"schema": 1, "ranks": [], "supervisor": {"generation": 1, "state": "stopped"}}

    polls = RankPolls(lambda: NOW, lambda key: None, fetch=fetch, send=send)
    key = ("team-a", "llm")
    targets = (rc.PollTarget("p0", "10.0.0.1", 9478, 1), rc.PollTarget("p1", "10.0.0.2", 9478, 1))
    order = (rc.PollMessage("/control", b"{}", "sha256=ab"),)
    asyncio.run(polls.poll_once([JobTargets(key, targets, messages={"p0": order, "p1": order})]))
    reading = polls.reading(key)
    assert reading is not None and not reading.unanswered
    assert reading.supervisors == {
        "p0": SupervisorReport.parse({"generation": 1, "state": "stopped"})
    }, "p0's answer was its report; p1's older sidecar is read back in the next round"
    assert fetched == [], "no GET after a first order"
    polls.close()


def test_close_rounds_read_only_the_pods_still_to_carry_out_their_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from rtj_operator import rank_polls
    from rtj_operator.rank_polls import JobTargets, RankPolls

    read: list[str] = []
    states = {"10.0.0.1": "stopped", "10.0.0.2": "stopped", "10.0.0.3": "running"}

    def fetch(ip: str, port: int, timeout: float, key: str | None) -> Any:
        read.append(ip)
        return {"schema": 1, "ranks": [], "supervisor": {"generation": 1, "state": states[ip]}}

    posted: list[str] = []

    def send(ip: str, port: int, timeout: float, message: rc.PollMessage) -> None:
        posted.append(ip)

    key = ("team-a", "llm")
    targets = tuple(rc.PollTarget(f"p{i}", f"10.0.0.{i}", 9478, 1) for i in (1, 2, 3))
    stop = rc.PollMessage("/control", b"{}", "sha256=ab")
    stands = rc.PollMessage("/control", b"{}", "sha256=ab", standing=True)
    # p1 and p2 show the stop carried out (their order stands), p3 does not yet
    job = JobTargets(key, targets, messages={"p1": (stands,), "p2": (stands,), "p3": (stop,)})
    assert job.ordering and [t.pod for t in targets if job.pressing(t.pod)] == ["p3"]

    polls = RankPolls(lambda: NOW, lambda key: None, fetch=fetch, send=send)
    asyncio.run(polls.poll_once([job]))  # the first round: p3 is only given its order
    assert sorted(read) == ["10.0.0.1", "10.0.0.2"]
    read.clear()
    states["10.0.0.3"] = "stopped"
    assert len(posted) == 3
    asyncio.run(polls.poll_once([job]))  # the next close round: only the pod still to move
    assert read == ["10.0.0.3"]
    assert len(posted) == 3, "an order its sidecar took is not posted again for a while"
    reading = polls.reading(key)
    assert reading is not None and not reading.unanswered and not reading.quiet_since
    assert {p: s.state for p, s in reading.supervisors.items()} == dict.fromkeys(
        ("p1", "p2", "p3"), "stopped"
    ), "a pod not asked again keeps its last answer, supervisor included"
    assert len(reading.reports) == 3
    polls.close()

    # a pod's last answer stands for a while only: past it, every pod is read again
    monkeypatch.setattr(rank_polls, "RESTING_SECONDS", 0.0)
    read.clear()
    posted.clear()
    every = RankPolls(lambda: NOW, lambda key: None, fetch=fetch, send=send)
    for _ in range(2):
        asyncio.run(every.poll_once([job]))
    assert sorted(read) == ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2", "10.0.0.3"]
    assert len(posted) == 6, "past that, orders are posted again (idempotent), p3's read back"
    every.close()


def test_a_pod_that_refuses_its_order_is_still_read_back() -> None:
    import asyncio

    from rtj_operator.pod_http import PollFailed
    from rtj_operator.rank_polls import JobTargets, RankPolls

    read: list[str] = []
    posted: list[str] = []

    def fetch(ip: str, port: int, timeout: float, key: str | None) -> Any:
        read.append(ip)
        return {"schema": 1, "ranks": [], "supervisor": {"generation": 2, "state": "running"}}

    def send(ip: str, port: int, timeout: float, message: rc.PollMessage) -> None:
        posted.append(ip)
        raise PollFailed("/control: refused: HTTP 403 order.generation: 1 stop is older")

    key = ("team-a", "llm")
    target = rc.PollTarget("p1", "10.0.0.1", 9478, 1)
    stop = rc.PollMessage("/control", b"{}", "sha256=ab")
    job = JobTargets(key, (target,), messages={"p1": (stop,)})
    polls = RankPolls(lambda: NOW, lambda key: None, fetch=fetch, send=send)
    asyncio.run(polls.poll_once([job]))
    assert (posted, read) == (["10.0.0.1"], []), "first posted alone"
    asyncio.run(polls.poll_once([job]))
    assert (posted, read) == (["10.0.0.1"] * 2, ["10.0.0.1"]), (
        "refused, so posted again; and read back, so its report shows why it stays"
    )
    reading = polls.reading(key)
    assert reading is not None and reading.supervisors["p1"].generation == 2
    polls.close()


def test_an_exchange_that_fails_leaves_its_orders_to_be_sent_again() -> None:
    import asyncio

    from rtj_operator.rank_polls import JobTargets, RankPolls

    posted: list[str] = []

    def fetch(ip: str, port: int, timeout: float, key: str | None) -> Any:
        raise RuntimeError("the read broke")  # not a PollFailed: any failure

    def send(ip: str, port: int, timeout: float, message: rc.PollMessage) -> None:
        posted.append(message.path)
        if message.path == "/replica":
            raise RuntimeError("the post broke")

    key = ("team-a", "llm")
    target = rc.PollTarget("p1", "10.0.0.1", 9478, 1)
    order = rc.PollMessage("/control", b"{}", "sha256=ab", standing=True)
    replica = rc.PollMessage("/replica", b"{}", "sha256=cd")
    job = JobTargets(key, (target,), messages={"p1": (replica, order)})
    polls = RankPolls(lambda: NOW, lambda key: None, fetch=fetch, send=send)
    asyncio.run(polls.poll_once([job]))
    assert posted == ["/replica", "/control"], "one message's failure does not stop the next"
    asyncio.run(polls.poll_once([job]))
    assert posted[2:] == [], "a pod whose read failed waits for its back-off"
    asyncio.run(polls.poll_once([job]))
    assert posted[2:] == ["/replica", "/control"], "nothing counted as taken: sent again"
    reading = polls.reading(key)
    assert reading is not None and not reading.reports
    polls.close()


def test_close_rounds_of_one_job_do_not_read_another_jobs_pods_every_round() -> None:
    import asyncio

    from rtj_operator.rank_polls import JobTargets, RankPolls

    read: list[str] = []

    def fetch(ip: str, port: int, timeout: float, key: str | None) -> Any:
        read.append(ip)
        return {"schema": 1, "ranks": [], "supervisor": {"generation": 1, "state": "running"}}

    def send(ip: str, port: int, timeout: float, message: rc.PollMessage) -> None:
        pass

    restarting = JobTargets(
        ("team-a", "llm"),
        (rc.PollTarget("a0", "10.0.0.1", 9478, 1),),
        messages={"a0": (rc.PollMessage("/control", b"{}", "sha256=ab"),)},
    )
    other = JobTargets(("team-b", "vit"), (rc.PollTarget("b0", "10.0.1.1", 9478, 1),))
    polls = RankPolls(lambda: NOW, lambda key: None, interval=3600.0, fetch=fetch, send=send)
    for _ in range(3):
        asyncio.run(polls.poll_once([restarting, other]))
    assert read.count("10.0.1.1") == 1, "the other job's pod: once a poll period"
    assert read.count("10.0.0.1") == 2, "the pod under restart: every close round after its post"
    reading = polls.reading(("team-b", "vit"))
    assert reading is not None and [r.pod for r in reading.reports] == ["b0"]
    assert not reading.unanswered
    polls.close()
