"""``rtj-shim supervise`` with real processes, ordered through a real ``rtj-shim
progress-server`` (``POST /control``), as the operator will order it (issue 15): a stop
leaves no process of the old generation (not even one in a session of its own whose parent
is gone), a run starts the command again with the ordered attempt and resume step, orders
that are stale or not this job's are refused, and a command that fails with no order to
follow ends the supervisor with its code. Every process started here is stopped by its id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from supervised_pod import UID, Pod, alive, until

from rtj_shim.agent.supervisor import descendants
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.fast.fast_tier import ENV_DIR, rank_store
from rtj_shim.wire.control import Order, job_key

# the "trainer": starts a worker in a session of its own (as torchrun does), ignores
# SIGTERM (so only SIGKILL ends it), and writes its pids, attempt and resume file
TRAINER = """
import json, os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen(["sleep", "300"], start_new_session=True)
resume = os.environ.get("RTJ_RESUME_FILE")
out = {"pids": [os.getpid(), worker.pid], "attempt": os.environ.get("RTJ_ATTEMPT"),
       "generation": os.environ.get("RTJ_RESTART_GENERATION"),
       "resume": json.load(open(resume)) if resume else None}
path = sys.argv[1] + "/gen-" + (out["generation"] or "0") + ".json"
open(path + ".tmp", "w").write(json.dumps(out)); os.replace(path + ".tmp", path)
time.sleep(300)
"""


def test_a_stop_leaves_no_process_and_a_run_starts_the_ordered_attempt(pod: Pod) -> None:
    sup = pod.supervise(sys.executable, "-c", TRAINER, str(pod.out))
    first = json.loads(until("generation 0", lambda: _read(pod.out / "gen-0.json")))
    assert first["attempt"] == "1" and first["resume"] is None
    reported = pod.supervisor() or {}
    assert (reported["generation"], reported["state"], reported["attempt"]) == (0, "running", 1)

    status, answer = pod.post(Order(UID, 1, "stop"))
    assert status == 202
    assert isinstance(answer["report"]["supervisor"], dict), "the answer carries the report"
    until("stopped", lambda: (pod.supervisor() or {}).get("state") == "stopped")
    assert not [pid for pid in first["pids"] if alive(pid)], "the old generation is gone"
    assert (pod.supervisor() or {})["generation"] == 1

    status, _ = pod.post(Order(UID, 1, "run", attempt=2, step=40))
    assert status == 202
    second = json.loads(until("generation 1", lambda: _read(pod.out / "gen-1.json")))
    assert (second["attempt"], second["generation"]) == ("2.1", "1")  # writes as 2.1
    assert second["resume"]["step"] == 40
    assert (pod.supervisor() or {})["state"] == "running"

    # refused: older than the last accepted order, another job's key, a forged body
    assert pod.post(Order(UID, 1, "stop"))[0] == 403
    assert pod.post(Order(UID, 2, "stop"), key=job_key(b"x", "another-job"))[0] == 403
    assert pod.post(Order("another-job", 2, "stop"))[0] == 403
    assert (pod.supervisor() or {})["state"] == "running", "nothing refused reached it"

    sup.send_signal(signal.SIGTERM)  # the pod is deleted
    assert sup.wait(20) == 128 + signal.SIGKILL, "the command ignored SIGTERM: killed"
    assert not [pid for pid in second["pids"] if alive(pid)]


LINEAGE, OTHER = "0123456789abcdef", "fedcba9876543210"


def test_stopped_reports_the_fast_steps_every_rank_holds_and_run_pins_one(
    pod: Pod, tmp_path: Path
) -> None:
    """The fast tier (issue 16): once its world is gone, the pod reports the fast-tier steps
    every rank directory holds (the operator pins the newest every pod holds), and a run
    order's fast step reaches the trainer in its resume file."""
    fast = tmp_path / "fast"
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "state.bin").write_bytes(b"state")
    for rank, steps in ((0, (30, 35, 40)), (1, (30, 35))):  # rank 1 died before 40
        for step in steps:
            protocol = CommitProtocol(rank_store(fast, rank), retention=None)
            protocol.lineage = LINEAGE if step != 30 or rank == 0 else OTHER  # issue 43
            protocol.publish_directory(step, payload)
    (fast / "rank-00001" / "steps" / "step-000000000040.tmp-1").mkdir()  # half-written
    pod.supervise(sys.executable, "-c", TRAINER, str(pod.out), env={ENV_DIR: str(fast)})
    until("generation 0", lambda: _read(pod.out / "gen-0.json"))
    assert pod.post(Order(UID, 1, "stop"))[0] == 202
    stopped = until("stopped", lambda: (s := pod.supervisor() or {}).get("state") == "stopped"
                    and s)  # fmt: skip
    assert stopped["fast_steps"] == [35], "rank 1's 30 is of another history than rank 0's"
    assert stopped["fast_held"] == [f"{LINEAGE}@35"]
    run = Order(UID, 1, "run", attempt=1, step=20, fast_step=35, fast_lineage=LINEAGE)
    assert pod.post(run)[0] == 202
    second = json.loads(until("generation 1", lambda: _read(pod.out / "gen-1.json")))
    assert (second["resume"]["step"], second["resume"]["fast_step"]) == (20, 35)
    # the history the step is pinned in: the restoring ranks take no other copy (issue 43)
    assert second["resume"]["fast_lineage"] == LINEAGE


def test_a_replacement_pod_is_held_until_its_run_order(pod: Pod) -> None:
    """A pod the Job controller created again for a failed index (the operator replaced the
    broken pod of a lost or faulty node) starts nothing until the barrier's run order."""
    pod.supervise(sys.executable, "-c", TRAINER, str(pod.out), env={"RTJ_INDEX_FAILURES": "1"})
    held = until("held", lambda: pod.supervisor())
    assert (held["generation"], held["state"]) == (0, "stopped")
    assert pod.post(Order(UID, 3, "stop"))[0] == 202  # the others' generation
    until("stopped for 3", lambda: (pod.supervisor() or {}).get("generation") == 3)
    assert (pod.supervisor() or {})["state"] == "stopped"
    assert not (pod.out / "gen-0.json").exists(), "nothing ran before its order"
    assert pod.post(Order(UID, 3, "run", attempt=1, step=40))[0] == 202
    started = json.loads(until("generation 3", lambda: _read(pod.out / "gen-3.json")))
    assert (started["attempt"], started["resume"]["step"]) == ("1.3", 40)


def test_a_held_replacement_with_no_order_gives_up(pod: Pod) -> None:
    sup = pod.supervise(
        sys.executable, "-c", TRAINER, str(pod.out), deadline=1,
        env={"RTJ_INDEX_FAILURES": "2"},
    )  # fmt: skip
    assert sup.wait(20) == 1
    assert not (pod.out / "gen-0.json").exists()


def test_a_failed_command_with_no_order_ends_the_supervisor_with_its_code(pod: Pod) -> None:
    sup = pod.supervise(sys.executable, "-c", "import sys; sys.exit(3)", deadline=1)
    assert sup.wait(30) == 3
    assert (pod.supervisor() or {}).get("state") == "exited"
    assert (pod.supervisor() or {}).get("exit_code") == 3
    done = pod.supervise(sys.executable, "-c", "pass", deadline=60)
    assert done.wait(30) == 0, "a command that succeeds ends the supervisor at once"


SUSPECTING = """
import json, os, sys
verdict = {"step": 40, "kind": "diverged", "ranks": [3], "pods": [1]}
open(os.environ["RTJ_RESUME_FILE"] + ".suspect", "w").write(json.dumps(verdict))
sys.exit(1)
"""


def test_a_trainer_that_refused_a_suspect_state_is_reported_with_its_verdict(pod: Pod) -> None:
    """The trainers leave their verdict beside the generation's resume file
    (`rtj_shim.torch.restore.record_suspect`); the supervisor reports it with the exit, so
    the operator restarts the world away from the suspect pod's node."""
    verdict = {"step": 40, "kind": "diverged", "ranks": [3], "pods": [1]}
    pod.supervise(sys.executable, "-c", SUSPECTING, env={"RTJ_RESUME_FILE": str(pod.out / "r")})
    report = until("exited", lambda: (r := pod.supervisor() or {}).get("state") == "exited" and r)
    assert report["exit_code"] == 1 and report["suspect"] == verdict, "generation 0's file"

    status, _ = pod.post(Order(UID, 1, "stop"))
    until("stopped", lambda: (pod.supervisor() or {}).get("state") == "stopped")
    status, _ = pod.post(Order(UID, 1, "run", attempt=1, step=30))
    assert status == 202
    report = until("exited again", lambda: (r := pod.supervisor() or {}).get("generation") == 1
                   and r.get("state") == "exited" and r)  # fmt: skip
    assert report["suspect"] == verdict, "a restarted generation's, beside its own resume file"


REFUSING = """
import json, os, sys
open(os.environ["RTJ_RESUME_FILE"] + ".rejected", "w").write(json.dumps({"step": 30}))
sys.exit(1)
"""


def test_a_pinned_step_the_first_generation_refused_is_reported(pod: Pod) -> None:
    """Generation 0 restores from the pod's own resume file (``RTJ_RESUME_FILE``, written by
    the resolve init container): the step it refused is found beside that file, as a later
    generation's is beside the supervisor's resume file (it was looked for beside the
    supervisor's ``resume-0.json``, which generation 0 never reads, and went unreported)."""
    pod.supervise(sys.executable, "-c", REFUSING, env={"RTJ_RESUME_FILE": str(pod.out / "r")})
    report = until("exited", lambda: (r := pod.supervisor() or {}).get("state") == "exited" and r)
    assert report["exit_code"] == 1 and report["rejected"] == {"step": 30, "reason": ""}, report


SAVING_ON_SIGTERM = """
import os, signal, sys, time
out = sys.argv[1]
def save(*_):  # the Checkpointer's emergency save: the next boundary, then the save
    time.sleep(2.5)
    open(out + "/saved-" + os.environ.get("RTJ_RESTART_GENERATION", "0"), "w").write("ok")
    sys.exit(143)
signal.signal(signal.SIGTERM, save)
open(out + "/started", "w").write("ok")
while True:
    time.sleep(0.05)
"""


def test_a_stop_with_a_save_grace_lets_the_trainers_save_first(pod: Pod) -> None:
    """A healthy world stopped to grow back (`Order.save_seconds`): the trainer's SIGTERM
    save, longer than the supervisor's 1 s grace, completes before the stop is reported; a
    failure's stop (no grace) kills it first."""
    pod.supervise(sys.executable, "-c", SAVING_ON_SIGTERM, str(pod.out))
    until("started", lambda: (pod.out / "started").exists())
    pod.post(Order(UID, 1, "stop", save_seconds=10))
    report = until("stopped", lambda: (r := pod.supervisor() or {}).get("state") == "stopped" and r)
    assert (pod.out / "saved-0").exists(), "the save completed within the grace"
    assert report["exit_code"] == 143
    (pod.out / "started").unlink()
    pod.post(Order(UID, 1, "run", attempt=1, step=None))
    until("started again", lambda: (pod.out / "started").exists())
    pod.post(Order(UID, 2, "stop"))
    until("stopped again", lambda: (pod.supervisor() or {}).get("generation") == 2
          and (pod.supervisor() or {}).get("state") == "stopped")  # fmt: skip
    assert not (pod.out / "saved-1").exists(), "the short grace killed it mid-save"


MISALIGNING = """
import json, os, time
found = {"step": 56, "ranks": [1], "factors": [9.5], "spread": 0.03}
open(os.environ["RTJ_RESUME_FILE"] + ".misaligned", "w").write(json.dumps(found))
time.sleep(300)
"""


def test_a_running_trainers_data_alignment_finding_is_reported(pod: Pod) -> None:
    """The trainers leave the data alignment check's finding beside the resume file and
    train on (`rtj_shim.torch.restore.record_misaligned`); the supervisor reports it while
    the generation runs, so the operator shows it with a Warning Event."""
    found = {"step": 56, "ranks": [1], "factors": [9.5], "spread": 0.03}
    pod.supervise(sys.executable, "-c", MISALIGNING, env={"RTJ_RESUME_FILE": str(pod.out / "r")})
    report = until("reported", lambda: (r := pod.supervisor() or {}).get("misaligned") and r)
    assert report["state"] == "running" and report["misaligned"] == found


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


RANKED = """
import json, os, sys, time
keys = ("RANK", "NODE_RANK", "PET_NODE_RANK", "MASTER_ADDR", "PET_MASTER_ADDR",
        "RTJ_RESTART_GENERATION", "WORLD_SIZE", "NNODES", "PET_NNODES", "RTJ_FAST_EVERY_STEPS")
out = {k: os.environ.get(k) for k in keys}
path = sys.argv[1] + "/gen-" + (out["RTJ_RESTART_GENERATION"] or "0") + ".json"
open(path + ".tmp", "w").write(json.dumps(out)); os.replace(path + ".tmp", path)
time.sleep(300)
"""


def test_a_warm_spare_waits_past_the_deadline_and_takes_the_rank_it_is_given(pod: Pod) -> None:
    """A spare (``RTJ_SPARE=1``) starts nothing and, unlike a replacement, never gives up
    waiting; its run order's rank and rendezvous host replace the pod's own, and stay for
    the next generation."""
    host = "llm-a1-worker-0-0.llm-a1"
    own = {"RANK": "2", "NODE_RANK": "2", "PET_NODE_RANK": "2", "MASTER_ADDR": host,
           "PET_MASTER_ADDR": host}  # fmt: skip
    sup = pod.supervise(sys.executable, "-c", RANKED, str(pod.out), deadline=1,
                        env={"RTJ_SPARE": "1", **own})  # fmt: skip
    held = until("held", lambda: pod.supervisor())
    assert (held["generation"], held["state"], held["spare"], held["rank"]) == (
        0,
        "stopped",
        True,
        None,
    )
    with pytest.raises(subprocess.TimeoutExpired):
        sup.wait(3)  # three times the order deadline: a spare is still waiting
    assert not (pod.out / "gen-0.json").exists(), "a spare starts nothing on its own"

    assert pod.post(Order(UID, 4, "stop"))[0] == 202
    until("stopped for 4", lambda: (pod.supervisor() or {}).get("generation") == 4)
    run = Order(UID, 4, "run", attempt=2, step=40, rank=1, master_addr="llm-a1-spare-0-0.llm-a1")
    assert pod.post(run)[0] == 202
    first = json.loads(until("generation 4", lambda: _read(pod.out / "gen-4.json")))
    assert [first[k] for k in ("RANK", "NODE_RANK", "PET_NODE_RANK")] == ["1"] * 3
    assert first["MASTER_ADDR"] == first["PET_MASTER_ADDR"] == "llm-a1-spare-0-0.llm-a1"
    assert (pod.supervisor() or {})["rank"] == 1

    # the next generation's order names neither: the pod keeps the rank it was given
    assert pod.post(Order(UID, 5, "stop"))[0] == 202
    until("stopped for 5", lambda: (s := pod.supervisor() or {}).get("generation") == 5
          and s.get("state") == "stopped")  # fmt: skip
    assert pod.post(Order(UID, 5, "run", attempt=2, step=80))[0] == 202
    second = json.loads(until("generation 5", lambda: _read(pod.out / "gen-5.json")))
    assert (second["RANK"], second["MASTER_ADDR"]) == ("1", "llm-a1-spare-0-0.llm-a1")


def test_an_elastic_order_gives_the_trainers_a_smaller_world_then_the_whole_one(pod: Pod) -> None:
    """A shrink renumbers the survivors into a world of 3 (this pod, rank 2 of 4, becomes
    rank 1 of 3); the grow-back gives it its own rank in the world of 4 again."""
    own = {"RANK": "2", "NODE_RANK": "2", "PET_NODE_RANK": "2", "WORLD_SIZE": "4",
           "NNODES": "4", "PET_NNODES": "4"}  # fmt: skip
    pod.supervise(sys.executable, "-c", RANKED, str(pod.out), env=own)
    first = json.loads(until("generation 0", lambda: _read(pod.out / "gen-0.json")))
    assert [first[k] for k in ("RANK", "WORLD_SIZE", "NNODES", "PET_NNODES")] == ["2"] + ["4"] * 3
    assert pod.post(Order(UID, 1, "stop"))[0] == 202
    until("stopped for 1", lambda: (s := pod.supervisor() or {}).get("generation") == 1
          and s.get("state") == "stopped")  # fmt: skip
    assert pod.post(Order(UID, 1, "run", attempt=1, step=40, rank=1, world_size=3))[0] == 202
    shrunk = json.loads(until("generation 1", lambda: _read(pod.out / "gen-1.json")))
    assert [shrunk[k] for k in ("RANK", "NODE_RANK", "PET_NODE_RANK")] == ["1"] * 3
    assert [shrunk[k] for k in ("WORLD_SIZE", "NNODES", "PET_NNODES")] == ["3"] * 3
    assert pod.post(Order(UID, 2, "stop"))[0] == 202
    until("stopped for 2", lambda: (s := pod.supervisor() or {}).get("generation") == 2
          and s.get("state") == "stopped")  # fmt: skip
    assert shrunk["RTJ_FAST_EVERY_STEPS"] is None  # the pod's own (none here)
    grow = Order(UID, 2, "run", attempt=1, step=90, rank=2, world_size=4, fast_every_steps=35)
    assert pod.post(grow)[0] == 202
    grown = json.loads(until("generation 2", lambda: _read(pod.out / "gen-2.json")))
    assert [grown[k] for k in ("RANK", "WORLD_SIZE", "PET_NNODES")] == ["2", "4", "4"]
    assert grown["RTJ_FAST_EVERY_STEPS"] == "35"  # fastTier.everySteps: auto, at the restart


def test_a_held_pod_the_operator_addressed_waits_and_finishes_on_order(pod: Pod) -> None:
    """A replacement whose rank a spare took is an idle spare itself: the current
    generation's stop order holds it past the order deadline; ``finish`` ends it with 0
    (its Job completes with the world's)."""
    sup = pod.supervise(
        sys.executable, "-c", TRAINER, str(pod.out), deadline=1,
        env={"RTJ_INDEX_FAILURES": "1"},
    )  # fmt: skip
    assert pod.post(Order(UID, 2, "stop"))[0] == 202
    until("stopped for 2", lambda: (pod.supervisor() or {}).get("generation") == 2)
    with pytest.raises(subprocess.TimeoutExpired):
        sup.wait(3)  # three times the order deadline
    assert pod.post(Order(UID, 2, "finish"))[0] == 202
    assert sup.wait(20) == 0
    assert (pod.supervisor() or {})["state"] == "finished"
    assert not (pod.out / "gen-0.json").exists() and not (pod.out / "gen-2.json").exists()


# records whether the preloaded module was imported before its own code ran
PRELOADED = """
import json, os, sys, time
out = {"pid": os.getpid(), "preloaded": "decimal" in sys.modules, "argv": sys.argv,
       "attempt": os.environ.get("RTJ_ATTEMPT"), "stdin": sys.stdin.read(),
       "generation": os.environ.get("RTJ_RESTART_GENERATION")}
path = sys.argv[1] + "/gen-" + (out["generation"] or "0") + ".json"
open(path + ".tmp", "w").write(json.dumps(out)); os.replace(path + ".tmp", path)
time.sleep(300)
"""


def _standbys(supervisor: int, waiting: bool = False) -> list[int]:
    """The supervisor's descendants started as a warm interpreter (`rtj_shim.agent.preload`;
    `waiting`: only those not running a trainer, a fork server or a standby)."""
    out = []
    for pid in descendants(supervisor):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"rtj_shim.agent.preload" in cmdline and (not waiting or _reads_a_pipe(pid)):
            out.append(pid)
    return out


def _reads_a_pipe(pid: int) -> bool:
    """A warm interpreter reads its orders from the supervisor's pipe; a trainer's stdin
    is /dev/null."""
    try:
        return os.readlink(f"/proc/{pid}/fd/0").startswith("pipe:")
    except OSError:
        return False


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_with_preload_every_generation_is_forked_from_one_server_that_imported_once(
    pod: Pod,
) -> None:
    """``--preload``: one fork server per pod imports the modules once; each generation's
    trainer is forked from it with the generation's environment, in a session of its own,
    and is the supervisor's child (reparented to it, the subreaper), which stops and reaps
    it; the server outlives the stops; a pod's deletion ends it too."""
    sup = pod.supervise(sys.executable, "-c", PRELOADED, str(pod.out), preload="decimal")
    first = json.loads(until("generation 0", lambda: _read(pod.out / "gen-0.json")))
    assert first["preloaded"] and first["argv"] == ["-c", str(pod.out)]
    assert (first["attempt"], first["stdin"]) == ("1", ""), "its own env; stdin empty"
    (server,) = until("the fork server", lambda: _standbys(sup.pid, waiting=True))
    assert _parent(first["pid"]) == sup.pid, "the forked trainer is the supervisor's child"
    assert os.getsid(first["pid"]) == first["pid"], "in a session of its own"
    report = pod.supervisor() or {}
    assert (report["preloaded"], report["standby"]) == (True, "ready")

    assert pod.post(Order(UID, 1, "stop"))[0] == 202
    until("stopped", lambda: (pod.supervisor() or {}).get("state") == "stopped")
    assert not alive(first["pid"]) and alive(server), "the stop left the server alone"

    assert pod.post(Order(UID, 1, "run", attempt=2, step=40))[0] == 202
    second = json.loads(until("generation 1", lambda: _read(pod.out / "gen-1.json")))
    assert second["pid"] not in (first["pid"], server) and _parent(second["pid"]) == sup.pid
    assert second["preloaded"] and (second["attempt"], second["generation"]) == ("2.1", "1")
    assert _standbys(sup.pid, waiting=True) == [server], "no new import for generation 1"

    sup.send_signal(signal.SIGTERM)
    sup.wait(20)
    assert not alive(second["pid"]) and not alive(server)


def test_a_generation_whose_trainer_exits_is_reaped_with_its_code(pod: Pod) -> None:
    """A forked trainer's exit code reaches the supervisor (it is its child): reported as
    ``exited`` with the code, as a trainer the supervisor started itself."""
    pod.supervise(sys.executable, "-c", "import sys; sys.exit(7)", preload="decimal")
    report = until("exited", lambda: (r := pod.supervisor() or {}).get("state") == "exited" and r)
    assert (report["exit_code"], report["preloaded"]) == (7, True)


def test_without_fork_each_generation_starts_from_a_standby_that_imported_ahead(
    pod: Pod,
) -> None:
    """``--no-preload-fork``: the command runs in a standby interpreter that imported the
    modules before it was handed the generation's environment; while stopped, the next
    standby waits, and it is the process the run order starts; a pod's deletion ends the
    standby too."""
    sup = pod.supervise(sys.executable, "-c", PRELOADED, str(pod.out), preload="decimal",
                        fork=False)  # fmt: skip
    first = json.loads(until("generation 0", lambda: _read(pod.out / "gen-0.json")))
    assert first["preloaded"] and first["argv"] == ["-c", str(pod.out)]
    assert (first["attempt"], first["stdin"]) == ("1", ""), "its own env; stdin empty"
    assert (pod.supervisor() or {})["preloaded"] is True

    assert pod.post(Order(UID, 1, "stop"))[0] == 202
    until("stopped", lambda: (pod.supervisor() or {}).get("state") == "stopped")
    assert not alive(first["pid"])
    standby = until("the next standby", lambda: _standbys(sup.pid))
    assert len(standby) == 1 and alive(standby[0]), "the stop left the standby alone"
    until("reported ready", lambda: (pod.supervisor() or {}).get("standby") == "ready")

    assert pod.post(Order(UID, 1, "run", attempt=2, step=40))[0] == 202
    second = json.loads(until("generation 1", lambda: _read(pod.out / "gen-1.json")))
    assert second["pid"] == standby[0], "the standby became the command"
    assert second["preloaded"] and (second["attempt"], second["generation"]) == ("2.1", "1")

    sup.send_signal(signal.SIGTERM)
    sup.wait(20)
    assert not alive(second["pid"]) and not _standbys(sup.pid)


def test_a_module_that_does_not_import_starts_the_generation_cold(pod: Pod) -> None:
    """The standby fails before it is ready: the generation starts cold and runs."""
    pod.supervise(sys.executable, "-c", PRELOADED, str(pod.out), preload="no_such_module_rtj")
    first = json.loads(until("generation 0", lambda: _read(pod.out / "gen-0.json")))
    assert not first["preloaded"] and first["argv"] == ["-c", str(pod.out)]
    report = pod.supervisor() or {}
    assert (report["preloaded"], report["standby"]) == (False, None), "no standby after it"


def test_preload_starts_a_command_that_is_not_a_python_interpreters_cold(pod: Pod) -> None:
    sup = pod.supervise("sh", "-c", f"touch {pod.out}/ran; exec sleep 300", preload="decimal")
    until("the shell ran", lambda: (pod.out / "ran").exists())
    assert (pod.supervisor() or {})["preloaded"] is False
    assert not _standbys(sup.pid)
