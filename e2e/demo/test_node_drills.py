"""Drills on real training through the pod runner (issue 12): node liveness. Every node
losing contact with the API server at once is a partition the job rides out; a 3 s Ready
flicker causes nothing; a node that goes silent with its processes frozen is judged lost
within seconds, fenced, and the group recovers elsewhere; when the frozen world wakes up (a
zombie) it cannot publish a checkpoint, and nobody ever deletes the Node object.

One job of one pod with two ranks (`--nproc-per-node=2`): the whole old world sits on the
silent node, so once thawed it trains on and reaches a checkpoint save, as a zombie would.
The pod runner plays the kubelet; its cut-off file (`PodRunner.cut_off_file`) stops Lease
renewals, status and pod events for a node, and with ``freeze`` SIGSTOPs its processes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import faults
from e2e.demo import drills, story
from e2e.operator_proc import wait_for
from e2e.podrunner.runner import ready_condition

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]

JOB = "drill-node"
POLL = 1.0
TAINT_PREFIX = "training.resilient.dev/"


def _conditions(api: Any) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in drills.status(api, JOB).get("conditions", [])}


def _step(api: Any, attempt: int) -> int:
    progress = drills.status(api, JOB).get("progress") or {}
    return int(progress.get("step") or 0) if progress.get("attempt") == attempt else 0


def _our_taints(kube: Any) -> list[str]:
    return [
        f"{n.metadata.name}:{t.key}"
        for n in kube.core.list_node().items
        for t in n.spec.taints or []
        if t.key.startswith(TAINT_PREFIX)
    ]


def _cut(opts: story.Options, node: str, how: str | None) -> None:
    """Cut `node` off (how: "" or "freeze"), or restore contact (None)."""
    path = opts.state / "runner" / "cut-off" / node
    if how is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(how)


def _logs(opts: story.Options, attempt: int) -> list[Path]:
    root = opts.state / "runner" / "pods" / story.NAMESPACE
    return sorted(root.glob(f"{JOB}-a{attempt}-worker-*"))


def _steps_logged(pod_dir: Path, since: float, until: float) -> list[int]:
    """The steps rank 0 of the pod logged between two wall times."""
    steps = []
    for line in (pod_dir / "volumes" / "train-logs" / "rank-0.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the line being written
        if "loss" in record and "event" not in record and since <= record["time"] <= until:
            steps.append(int(record["step"]))
    return steps


def _saves(pod_dir: Path) -> list[int]:
    steps = []
    for line in (pod_dir / "volumes" / "train-logs" / "rank-0.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == "save":
            steps.append(int(record["step"]))
    return steps


def test_partition_flicker_and_a_silent_node_whose_zombie_cannot_publish(tmp_path: Path) -> None:
    with drills.running_platform(
        tmp_path, "rtj-nodes", 4, "--progress-poll-seconds", str(POLL)
    ) as platform:
        opts, kube, api = platform.opts, platform.kube, platform.api
        body = drills.job(JOB, replicas=1, progress={"hangTimeoutSeconds": 60})
        container = body["spec"]["template"]["spec"]["containers"][0]
        container["command"] = [
            "--nproc-per-node=2" if a.startswith("--nproc-per-node") else a
            for a in container["command"]
        ]
        api.create_rtj(story.NAMESPACE, body)
        wait_for("training past step 45", lambda: _step(api, 1) >= 45, 240, 0.5)
        nodes = [n.metadata.name for n in kube.core.list_node().items]

        # 1. every node loses contact for 30 s: a partition, held; training goes on
        (pod,) = drills.pods(api, JOB, 1)
        pod_dir = next(d for d in _logs(opts, 1) if pod["metadata"]["uid"][:8] in d.name)
        for node in nodes:
            _cut(opts, node, "")
        cut_at, cut_wall = time.monotonic(), time.time()
        held = wait_for("NodesUnreachable", lambda: (
            (c := _conditions(api).get("NodesUnreachable")) and c["status"] == "True" and c
        ), 60, 0.5)  # fmt: skip
        assert "holding" in held["message"]
        time.sleep(max(0.0, 30 - (time.monotonic() - cut_at)))
        status = drills.status(api, JOB)
        assert (status["phase"], status["attempt"]) == ("Running", 1), status
        assert not status.get("quarantinedNodes") and not _our_taints(kube)
        # the trainer's own log, not status.progress (rewritten at most every 30 s)
        during = _steps_logged(pod_dir, cut_wall, time.time())
        for node in nodes:
            _cut(opts, node, None)
        wait_for("contact restored", lambda: (
            _conditions(api).get("NodesUnreachable", {}).get("status") == "False"
        ), 60, 0.5)  # fmt: skip
        assert drills.status(api, JOB)["attempt"] == 1
        assert len(during) >= 20, f"the job trained through the partition: steps {during}"
        assert drills.pods(api, JOB, 1)[0]["metadata"]["uid"] == pod["metadata"]["uid"]

        # 2. the node's Ready flickers to False for 3 s (its Lease renewed): nothing
        victim = pod["spec"]["nodeName"]
        faults.node_not_ready(kube, victim)
        time.sleep(3)
        kube.core.patch_node_status(victim, {"status": {"conditions": [ready_condition()]}})
        time.sleep(12)  # past the flicker window
        status = drills.status(api, JOB)
        assert (status["phase"], status["attempt"]) == ("Running", 1), status
        assert not _our_taints(kube)

        # 3. the node goes silent, its processes frozen: lost, fenced, recovered elsewhere
        old_dir = pod_dir
        _cut(opts, victim, "freeze")
        frozen = time.monotonic()

        def recorded() -> dict[str, Any] | None:
            attempts = drills.status(api, JOB).get("attempts") or []
            return attempts[0] if attempts and attempts[0].get("failureClass") else None

        record = wait_for("the NodeLost record", recorded, 90, 0.2)
        took = time.monotonic() - frozen
        assert record["failureClass"] == "NodeLost" and record["firstFailed"]["node"] == victim
        evidence = " ".join(record["evidence"])
        assert "answers the progress poll" in evidence, evidence  # both signals, not 20 s
        assert took < 30, f"judged lost {took:.1f} s after the freeze"
        sys.stdout.write(f"\nfreeze -> NodeLost record: {took:.1f} s ({evidence})\n")

        def resumed() -> dict[str, Any] | None:
            status = drills.status(api, JOB)
            attempts = status.get("attempts") or []
            pinned = attempts[1].get("resumedFromStep") if len(attempts) > 1 else None
            return status if pinned and _step(api, 2) > pinned + 45 else None

        status = wait_for("attempt 2 training past a save", resumed, 240, 0.5)
        recovered = time.monotonic() - frozen
        (new,) = drills.pods(api, JOB, 2)
        assert new["spec"]["nodeName"] != victim
        assert [q["node"] for q in status["quarantinedNodes"]] == [victim]
        sys.stdout.write(f"freeze -> attempt 2 trained past a save: {recovered:.1f} s\n")

        # 4. the zombie wakes (still cut off, so nobody stops it) and tries to publish
        saved_before = _saves(old_dir)
        _cut(opts, victim, "")
        log = old_dir / "containers" / "trainer" / "log"
        refusal = wait_for("the zombie's refusal", lambda: (
            "is stale" in (text := log.read_text(errors="replace")) and text
        ), 120, 0.5)  # fmt: skip
        assert "attempt 1 is stale; attempt 2" in refusal and "owns this root now" in refusal
        # The trainer logs a save after publishing it, after the hint, retention and the
        # ranks' broadcast: a freeze in that window leaves a step published before the
        # freeze logged only once the zombie wakes. Such a step is one attempt 2 saw and
        # resumed from; anything the zombie published after the freeze would be newer.
        pinned = status["attempts"][1]["resumedFromStep"]
        late = [step for step in _saves(old_dir) if step not in saved_before]
        assert all(step <= pinned for step in late), (
            f"the zombie published nothing: saves {late} logged after the wake, "
            f"attempt 2 resumed from step {pinned}"
        )
        assert drills.status(api, JOB)["attempt"] == 2, "and changed nothing for the job"

        # contact back: the node learns its pod is gone and stops what is left
        _cut(opts, victim, None)
        assert kube.core.read_node(victim).metadata.name == victim, "nobody deleted the Node"
        resumed_from = {a["attempt"]: a.get("resumedFromStep") for a in status["attempts"]}
        sys.stdout.write(f"resumed from {resumed_from}; zombie saves {saved_before}\n")
