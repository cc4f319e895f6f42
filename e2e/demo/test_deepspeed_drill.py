"""Drill on real DeepSpeed training through the pod runner (issue 47): a ZeRO-2 job
(`examples/deepspeed_train.py`: 2 worker pods, one rank each, DeepSpeed's CPU accelerator,
gloo) publishes ``engine.save_checkpoint`` through ``PublishingEngine`` into the S3 store
every 30 steps. Past the second save, rank 1's training process is SIGKILLed: the
operator re-creates the world pinned to the newest verified step, the trainers' integration
loads that step (the resume init container's decision, ``RTJ_RESUME_FILE``), and the steps
the second attempt trains again repeat the first attempt's bit for bit on both ranks (that
the whole run equals an uninterrupted one is `test_deepspeed_integration.py`'s).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from e2e.demo import drills, story
from e2e.operator_proc import wait_for
from e2e.podrunner.runner import descendants

pytestmark = [pytest.mark.demo, pytest.mark.timeout(900)]

JOB = "drill-deepspeed"
STEPS, SAVE_EVERY = 90, 30
SCRIPT = "examples/deepspeed_train.py"
EXTENSIONS = Path.home() / ".cache" / "torch_extensions"
"""DeepSpeed's CPU accelerator compiles one communication op on its first start (g++ and
ninja, about 40 s) into torch's extensions cache: the pods share the harness's (each pod
runs with a home of its own; torch's build lock lets one pod build it)."""


def _job() -> dict[str, Any]:
    body = drills.job(JOB)
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [
        "torchrun", "--nproc-per-node=1", SCRIPT, "--root=$(RTJ_CHECKPOINT_URI)",
        "--log-dir=/var/log/train", f"--steps={STEPS}", f"--save-every={SAVE_EVERY}",
        "--step-sleep=0.05",
    ]  # fmt: skip
    container["env"] = [{"name": "TORCH_EXTENSIONS_DIR", "value": str(EXTENSIONS)}]
    return body


def _trainer(opts: story.Options, pod: dict[str, Any]) -> int:
    """The DeepSpeed script's process (torchrun's child) in `pod`."""
    for pid in descendants(drills.container_pid(opts, pod)):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if SCRIPT.encode() in cmdline and b"torch.distributed.run" not in cmdline:
            return pid
    raise AssertionError(f"no training process in {pod['metadata']['name']}")


def _events(log: Path, kind: str) -> list[int]:
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == kind:
            out.append(int(record["step"]))
    return out


def test_a_killed_deepspeed_rank_resumes_the_pinned_step_bit_for_bit(tmp_path: Path) -> None:
    with drills.running_platform(tmp_path, "rtj-deepspeed", 2) as platform:
        opts, api = platform.opts, platform.api
        api.create_rtj(story.NAMESPACE, _job())
        pods = drills.scheduled(api, JOB, 2)
        victim = drills.rank_pod(pods, 1)
        log = drills.rank_log(opts, victim, 1)
        wait_for("training past two saves", lambda: (
            len(_events(log, "save")) >= 2 and drills.trained(log) >= 2 * SAVE_EVERY + 5
        ), 300, 0.5)  # fmt: skip
        os.kill(_trainer(opts, victim), signal.SIGKILL)
        done = wait_for("the job to finish", lambda: (
            (s := drills.status(api, JOB)).get("phase") in ("Succeeded", "Failed") and s
        ), 600, 1.0)  # fmt: skip
        assert done["phase"] == "Succeeded" and done["attempt"] == 2, done
        pinned = done["attempts"][1]["resumedFromStep"]
        assert pinned is not None and pinned >= 2 * SAVE_EVERY and pinned % SAVE_EVERY == 0
        second = drills.pods(api, JOB, 2)
        for rank in (0, 1):
            first_log = drills.rank_log(opts, drills.rank_pod(pods, rank), rank)
            after = drills.rank_log(opts, drills.rank_pod(second, rank), rank)
            assert _events(after, "restore") == [pinned], rank  # the operator's pin, loaded
            before = drills.losses(first_log.read_text().splitlines())
            again = drills.losses(after.read_text().splitlines())
            assert sorted(again) == list(range(pinned + 1, STEPS + 1)), rank
            replayed = sorted(set(before) & set(again))
            assert replayed and replayed[0] == pinned + 1, (rank, replayed)
            for step in replayed:  # bit for bit: the restored state trains as the lost one did
                assert again[step] == before[step], (rank, step, again[step], before[step])
        api.delete_rtj(story.NAMESPACE, JOB)
