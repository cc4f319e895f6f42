"""Drill on real training through the pod runner (issue 42): a hostile tenant beside an
innocent job on one platform, with signed reads (the operator has a control secret) and a
progress poll every second.

The hostile job's trainer (`e2e/demo/hostile_trainer.py`) answers its own pods' progress
polls with a 400-digit step and with a 1 MiB body, keeps 16 slow connections dripping a
request into each of the innocent job's sidecars, and in the end exits 127 printing the
NVIDIA container hook's words. The innocent job, on other nodes, runs the example trainer
restarting in place: one of its ranks is frozen with SIGSTOP while the attack goes on. Its
hang is still found within its allowance and it still restarts in place (no pod
re-created, the attempt stays 1); the hostile job's exit taints no node.
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

from e2e.demo import drills, story
from e2e.operator_proc import wait_for
from rtj_operator.api import keys
from rtj_shim.wire.progress_record import read_file

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]

INNOCENT, HOSTILE = "drill-innocent", "drill-hostile"
HANG_TIMEOUT, POLL, SLOW = 10, 1.0, 16
HOSTILE_DIR = "/var/hostile"
TAINT_KEY = "training.resilient.dev/unhealthy"


def _hostile_job(targets: list[str], avoid: list[str]) -> dict[str, Any]:
    """The example job, its trainer replaced by the hostile one, on nodes not in `avoid`."""
    body = drills.job(HOSTILE)
    body["spec"]["failurePolicy"]["maxRestarts"] = 0
    spec = body["spec"]["template"]["spec"]
    container = spec["containers"][0]
    container["command"] = [
        "python", "e2e/demo/hostile_trainer.py", "--pod-ip=$(POD_IP)",
        f"--port={keys.DEFAULT_PROGRESS_PORT}", f"--slow-connections={SLOW}",
        f"--status={HOSTILE_DIR}/status.json", f"--exit-file={HOSTILE_DIR}/exit",
        *(f"--target={t}" for t in targets),
    ]  # fmt: skip
    pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
    container["env"] = [{"name": "POD_IP", "valueFrom": pod_ip}]
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    container["volumeMounts"].append({"name": "hostile", "mountPath": HOSTILE_DIR})
    spec["volumes"].append({"name": "hostile", "emptyDir": {}})
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": avoid}
                        ]
                    }
                ]
            }
        }
    }
    return body


def _tally(opts: story.Options, pods: list[dict[str, Any]]) -> dict[str, int]:
    """What the hostile pods did so far, summed."""
    total: dict[str, int] = {}
    for pod in pods:
        path = story._pod_dir(opts, pod) / "volumes" / "hostile" / "status.json"
        try:
            counts = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for what, n in counts.items():
            total[what] = total.get(what, 0) + n
    return total


NOT_TRAINING = ("", "start", "restore", "barrier", "collective")
"""Sections a rank is not training in: starting, restoring, or waiting for the others (a
rank frozen right after a barrier returned still shows ``barrier``, and the hang verdict
looks past a waiting rank to the one it waits for: the other rank, running on into the
next collective, would be blamed)."""


def _freeze_in_training(opts: story.Options, pod: dict[str, Any]) -> float:
    """SIGSTOP the rank's training process once its record shows it training (any section
    but those `NOT_TRAINING` names); the time of the freeze."""
    records = story._pod_dir(opts, pod) / "volumes" / keys.PROGRESS_VOLUME
    pid = drills.trainer_pid(opts, pod)
    for _ in range(100):
        os.kill(pid, signal.SIGSTOP)
        at = time.time()
        time.sleep(0.05)
        found = sorted(records.glob("rank-*.progress"))
        if found and read_file(found[0]).section not in NOT_TRAINING:
            return at
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.013)
    raise AssertionError("the innocent rank never trained at a try")


def test_a_hostile_tenant_neither_blinds_nor_taints_an_innocent_job(tmp_path: Path) -> None:
    with drills.controlling_platform(tmp_path, "rtj-hostile", 4) as platform:
        opts, api = platform.opts, platform.api
        innocent = drills.in_place_job(INNOCENT, 40, 100000)
        innocent["spec"]["progress"] = {"hangTimeoutSeconds": HANG_TIMEOUT}
        api.create_rtj(story.NAMESPACE, innocent)
        pods = drills.scheduled(api, INNOCENT, 2)
        wait_for(
            "the innocent pods' addresses",
            lambda: all(p.get("status", {}).get("podIP") for p in drills.pods(api, INNOCENT, 1)),
            120,
            0.5,
        )
        pods = drills.pods(api, INNOCENT, 1)
        log0 = drills.rank_log(opts, drills.rank_pod(pods, 0), 0)
        wait_for("the innocent job training", lambda: drills.trained(log0) >= 20, 300, 0.5)

        targets = [f"{p['status']['podIP']}:{keys.DEFAULT_PROGRESS_PORT}" for p in pods]
        nodes = sorted(p["spec"]["nodeName"] for p in pods)
        api.create_rtj(story.NAMESPACE, _hostile_job(targets, nodes))
        hostile = drills.scheduled(api, HOSTILE, 2)
        assert not {p["spec"]["nodeName"] for p in hostile} & set(nodes)

        def attacking() -> dict[str, int] | None:
            tally = _tally(opts, drills.pods(api, HOSTILE, 1))
            full = tally.get("slow_open", 0) >= len(hostile) * len(targets) * SLOW
            served = tally.get("huge_step", 0) >= 1 and tally.get("huge_body", 0) >= 1
            return tally if full and served else None

        before = wait_for("the hostile pods attacking", attacking, 180, 0.5)
        sys.stdout.write(f"\nhostile pods under way: {before}\n")

        # the innocent job keeps its hang detection and its in-place restart
        victim = drills.rank_pod(pods, 1)
        frozen = _freeze_in_training(opts, victim)
        entry = wait_for("the innocent job's in-place restart",
                         lambda: drills.first_restart(api, INNOCENT), 180, 0.2)  # fmt: skip
        seen = time.time() - frozen
        assert entry["outcome"] == "Running" and entry["failureClass"] == "Hang", entry
        assert entry["firstFailed"]["pod"] == victim["metadata"]["name"], entry
        detected = datetime.fromisoformat(entry["detectedAt"].replace("Z", "+00:00"))
        # the allowance, plus a poll period and a reconcile (a loaded CI machine: slack);
        # detectedAt is whole seconds
        took = detected.timestamp() - frozen
        assert HANG_TIMEOUT - 1 <= took <= HANG_TIMEOUT + POLL + 15, (took, entry)
        assert "rank 1" in " ".join(entry["evidence"]), entry
        during = _tally(opts, drills.pods(api, HOSTILE, 1))
        assert during["slow_opened"] > before["slow_opened"], "the attack went on throughout"
        sys.stdout.write(f"freeze -> in-place restart: {seen:.1f} s ({entry}); {during}\n")
        after = drills.pods(api, INNOCENT, 1)
        assert {p["metadata"]["uid"] for p in after} == {p["metadata"]["uid"] for p in pods}
        trained = drills.trained(log0)
        wait_for("the innocent job training on", lambda: drills.trained(log0) > trained + 5,
                 180, 0.5)  # fmt: skip

        # the hostile trainers exit 127 quoting the NVIDIA hook: the tenant's words
        for pod in drills.pods(api, HOSTILE, 1):
            (story._pod_dir(opts, pod) / "volumes" / "hostile" / "exit").touch()

        def ended() -> dict[str, Any] | None:
            attempts = drills.status(api, HOSTILE).get("attempts") or []
            return attempts[0] if attempts and attempts[0].get("failureClass") else None

        hostile_record = wait_for("the hostile job's failure record", ended, 180, 0.5)
        assert hostile_record["failureClass"] != "GPUFault", hostile_record
        sys.stdout.write(f"hostile exit 127: {hostile_record['failureClass']} "
                         f"({hostile_record.get('evidence')})\n")  # fmt: skip
        assert not drills.status(api, HOSTILE).get("quarantinedNodes")
        assert not drills.status(api, INNOCENT).get("quarantinedNodes")
        nodes_now, _ = api.list_kind("nodes", None)
        tainted = [
            n["metadata"]["name"]
            for n in nodes_now
            if any(t.get("key") == TAINT_KEY for t in n["spec"].get("taints") or [])
        ]
        assert not tainted, tainted
        status = drills.status(api, INNOCENT)
        assert status["attempt"] == 1 and status["trainerGeneration"] == 1, status
