"""Drills on real training through the pod runner (issue 12): a rank frozen with SIGSTOP
is a Hang that names it, and a rank slower than the others is a straggler.

Both jobs run the example trainer (examples/ddp_train.py, which reports its sections to
`rtj_shim.progress`) on one local cluster with pod-runner nodes: every worker pod gets the
progress sidecar the operator renders, and the operator polls it each second. Nothing in
Kubernetes sees either fault: every pod stays Running.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.cluster import LocalCluster
from e2e.demo import story
from e2e.operator_proc import wait_for
from e2e.podrunner.runner import descendants

pytestmark = [pytest.mark.demo, pytest.mark.timeout(600)]

HANG_TIMEOUT = 10
POLL = 1.0


def _job(name: str, *args: str, **spec: Any) -> dict[str, Any]:
    """The example job, renamed, with its own store prefix, extra trainer arguments."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(story.EXAMPLE.read_text()))
    body["metadata"]["name"] = name
    body["spec"]["checkpoint"]["uri"] = f"s3://{story.BUCKET}/{name}"
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [
        *(a for a in container["command"] if not a.startswith("--steps")),
        "--steps=100000",  # never finishes on its own: the drill deletes it
        *args,
    ]
    body["spec"].update(spec)
    return body


def _trainer_pid(opts: story.Options, pod: dict[str, Any]) -> int:
    """The training process (torchrun's child) of a pod run by the pod runner."""
    torchrun = int((story._pod_dir(opts, pod) / "containers" / "trainer" / "pid").read_text())
    (child,) = [p for p in descendants(torchrun) if _is_trainer(p)]
    return child


def _is_trainer(pid: int) -> bool:
    try:
        return b"ddp_train.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _pods(api: Any, name: str, attempt: int) -> list[dict[str, Any]]:
    selector = f"training.resilient.dev/job={name},training.resilient.dev/attempt={attempt}"
    pods: list[dict[str, Any]] = api.list_pods(story.NAMESPACE, selector)
    return pods


def _rank_pod(pods: list[dict[str, Any]], rank: int) -> dict[str, Any]:
    return next(
        p
        for p in pods
        if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == str(rank)
    )


def _status(api: Any, name: str) -> dict[str, Any]:
    return dict(api.get_rtj(story.NAMESPACE, name).get("status") or {})


def test_a_frozen_rank_is_a_hang_and_a_slow_one_a_straggler(tmp_path: Path) -> None:
    opts = story.Options(
        out=tmp_path / "out",
        state=tmp_path / "state",
        cluster_name=f"rtj-drill-{os.getpid()}",
        nodes=4,
        timeout=240,
    )
    (opts.state / "logs").mkdir(parents=True)
    lines: list[str] = []
    display = story.Display(lines.append)
    state: dict[str, Any] = {"pids": {}}
    try:
        kubeconfig, _, api = story.start_platform(
            opts, display, state, operator_args=("--progress-poll-seconds", str(POLL))
        )
        hang = _job("drill-hang", progress={"hangTimeoutSeconds": HANG_TIMEOUT})
        slow = _job(
            "drill-slow",
            "--straggle-rank=1",
            "--straggle-seconds=0.25",
            progress={"stragglers": {"windows": 3}},
        )
        for body in (hang, slow):
            api.create_rtj(story.NAMESPACE, body)

        # 1. the hang: freeze rank 1's training process once it trains past a checkpoint
        def trained(name: str, step: int) -> bool:
            progress = _status(api, name).get("progress") or {}
            return progress.get("attempt") == 1 and (progress.get("step") or 0) >= step

        wait_for("drill-hang to train past step 45", lambda: trained("drill-hang", 45), 240, 0.5)
        victim = _rank_pod(_pods(api, "drill-hang", 1), 1)
        pid = _trainer_pid(opts, victim)
        os.kill(pid, signal.SIGSTOP)
        frozen = time.time()

        def recorded() -> dict[str, Any] | None:
            attempts = _status(api, "drill-hang").get("attempts") or []
            return attempts[0] if attempts and attempts[0].get("failureClass") else None

        record = wait_for("the Hang record", recorded, 120, 0.2)
        seen = time.time() - frozen
        assert record["failureClass"] == "Hang" and record["failureCategory"] == "unknown"
        assert record["firstFailed"]["rank"] == 1
        assert record["firstFailed"]["pod"] == victim["metadata"]["name"]
        evidence = " ".join(record["evidence"])
        assert "rank 1" in evidence and "(> 10s)" in evidence, evidence
        # the allowance, plus a poll period and a reconcile (a loaded CI machine: slack)
        assert HANG_TIMEOUT <= record["detectionSeconds"] <= HANG_TIMEOUT + POLL + 15
        sys.stdout.write(
            f"\nfreeze -> Hang record: {seen:.1f} s (detectionSeconds "
            f"{record['detectionSeconds']}; evidence: {evidence})\n"
        )

        def resumed() -> dict[str, Any] | None:
            status = _status(api, "drill-hang")
            attempts = status.get("attempts") or []
            progress = status.get("progress") or {}
            if len(attempts) < 2 or progress.get("attempt") != 2:
                return None
            pinned = attempts[1].get("resumedFromStep")
            return status if pinned and (progress.get("step") or 0) > pinned else None

        status = wait_for("attempt 2 training past its pinned step", resumed, 240, 0.5)
        assert status["attempts"][1]["resumedFromStep"] % 40 == 0  # a verified checkpoint
        assert not status.get("quarantinedNodes"), "a hang blames no node"

        # 2. the straggler: rank 1 spends 0.25 s more per step than rank 0
        def straggling() -> dict[str, Any] | None:
            conditions = {c["type"]: c for c in _status(api, "drill-slow").get("conditions", [])}
            found = conditions.get("Straggling")
            return found if found and found["status"] == "True" else None

        condition = wait_for("the Straggling condition", straggling, 240, 0.5)
        assert "rank 1 " in condition["message"] and "rank 0 " not in condition["message"]
        stragglers = _status(api, "drill-slow")["progress"]["stragglers"]
        assert [s["rank"] for s in stragglers] == [1] and stragglers[0]["ratio"] > 1.43
        events = api.list_events(story.NAMESPACE, "reason=StragglerDetected")
        assert any("rank 1 " in e.get("message", "") for e in events)
        table = story.kubectl(kubeconfig, "get", "rtj", "-n", story.NAMESPACE)
        header = table.splitlines()[0].split()
        assert header[:5] == ["NAME", "PHASE", "ATTEMPT", "STEP", "STEPS/S"], table
        sys.stdout.write(f"\n{table}\n{json.dumps(stragglers)}\n")
    finally:
        left = story.down(opts, display)
        shutil.rmtree(LocalCluster(opts.cluster_name).dir, ignore_errors=True)
        sys.stdout.write("\n".join(lines) + "\n")
    assert left == [], f"down left {left}"
