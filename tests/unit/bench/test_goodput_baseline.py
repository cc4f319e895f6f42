"""The JobSet baseline's pure parts: the JobSet a user writes, the trainer's choice of the
newest plain checkpoint, the baseline's accounting when it stalls, the side-by-side report."""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType
from typing import Any

import pytest

from bench import baseline_jobset as bj
from bench import baseline_judge, soak_compare, soak_report
from e2e.operator_proc import REPO


def trainer() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "plain_checkpoints", REPO / "examples" / "plain_checkpoints.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


def test_the_jobset_is_what_a_plain_user_writes() -> None:
    body = bj.jobset("ns", "q", 2, ["--steps=10"])
    spec = body["spec"]
    assert body["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert body["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "q"}
    assert spec["failurePolicy"] == {"maxRestarts": bj.MAX_RESTARTS}, "no rules: RestartJobSet"
    assert spec["network"]["enableDNSHostnames"] is True
    [rjob] = spec["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["completionMode"], job["backoffLimit"]) == (
        2, 2, "Indexed", 0,
    )  # fmt: skip
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    [c] = pod["containers"]
    assert c["command"][:2] == ["torchrun", "--nnodes=2"]
    assert "--plain-checkpoints=/checkpoints" in c["command"]
    assert c["command"][-1] == "--steps=10"
    env = {e["name"]: e for e in c["env"]}
    assert env["MASTER_ADDR"]["value"] == "baseline-worker-0-0.baseline"
    rank_path = env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert rank_path == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": bj.CLAIM}}]
    pv, pvc = bj.shared_volume("ns")
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["claimRef"] == {"namespace": "ns", "name": bj.CLAIM}


def test_the_trainer_resumes_from_the_highest_numbered_file() -> None:
    newest = trainer().newest_plain_step
    assert newest([]) is None
    assert newest([".step-900.pt.tmp", "notes.txt"]) is None, "a torn save is not a step"
    assert newest(["step-100.pt", "step-1000.pt", "step-200.pt", ".step-1100.pt.tmp"]) == 1000


def test_the_corruption_lands_in_the_largest_tensor(tmp_path: Any) -> None:
    import torch

    state = {"small": torch.zeros(3), "big": torch.arange(1000, dtype=torch.float32)}
    torch.save(state, tmp_path / "step-1.pt")
    body = bytearray((tmp_path / "step-1.pt").read_bytes())
    record, at = bj.largest_tensor_middle(bytes(body))
    assert record.endswith("/data/1")
    body[at] ^= 0xFF
    (tmp_path / "step-1.pt").write_bytes(bytes(body))
    loaded = torch.load(tmp_path / "step-1.pt", weights_only=True)  # nothing notices
    assert torch.equal(loaded["small"], state["small"])
    changed = (loaded["big"] != state["big"]).nonzero().flatten().tolist()
    assert changed == [500], "the middle byte of the 4000: the low byte of element 500"


def pod(name: str, restart: int, rank: int, phase: str = "Running", **meta: Any) -> Any:
    return {
        "metadata": {"name": name, "labels": {bj.RESTARTS_LABEL: str(restart)},
                     "annotations": {bj.INDEX_ANNOTATION: str(rank)}, **meta},
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase},
    }  # fmt: skip


def test_the_injector_hits_the_running_pod_of_the_current_restart() -> None:
    pods = [
        pod("old", 0, 1),
        pod("gone", 1, 1, deletionTimestamp="2026-01-01T00:00:00Z"),
        pod("pending", 1, 1, phase="Pending"),
        pod("new", 1, 1),
        pod("other-rank", 1, 0),
    ]
    assert (bj.current_pod(pods, 1, 1) or {})["metadata"]["name"] == "new"
    assert bj.current_pod(pods, 2, 1) is None
    assert bj.finished({"status": {"conditions": [{"type": "Completed", "status": "True"}]}})
    not_yet = {"status": {"conditions": [{"type": "Completed", "status": "False"}]}}
    assert bj.finished(not_yet) is None
    stall = bj.stall_summary(
        {"status": {"restarts": 3}},
        [pod("w-0", 3, 0, deletionTimestamp="x"), pod("w-1", 3, 1, phase="Failed")],
        700, 120.0, {"w-1": "RuntimeError: PytorchStreamReader failed"},
    )  # fmt: skip
    assert stall.startswith("JobSet restarts 3; last step 700, 120 s before the cap")
    assert "w-0 (restart 3) terminating on n1" in stall
    assert "w-1 (restart 3) Failed on n1: RuntimeError" in stall


def log(restored: int, steps: dict[int, float], losses: dict[int, float], at: float) -> list[str]:
    out = [json.dumps({"event": "restore", "step": restored, "time": at})]
    out += [json.dumps({"step": s, "loss": losses[s], "time": t}) for s, t in steps.items()]
    return out


def test_a_stalled_baseline_counts_goodput_over_the_cap_and_reports_findings() -> None:
    ref = {s: float(s) for s in range(1, 9)}
    attempt0 = {s: 100.0 + s for s in range(1, 7)}  # saved at 4, killed after 6
    attempt1 = {s: 110.0 + s for s in range(5, 8)}  # resumed from 4, stuck after 7
    wrong = {**ref, 6: 99.0}  # the resumed model differs at step 6
    logs = {
        0: {0: log(0, attempt0, ref, 100.0), 1: log(0, attempt0, ref, 100.0)},
        1: {0: log(4, attempt1, wrong, 114.5), 1: log(4, attempt1, ref, 114.5)},
        2: {0: [json.dumps({"event": "restore", "step": 4, "time": 130.0})]},  # crash loop
    }
    injected = [{"kind": "rank_killed", "rank": 1, "at": 106.5, "scheduled": 6.0, "what": "x"}]
    facts = baseline_judge.judge(
        100.0, 160.0, None, logs, injected, {0: ref, 1: ref}, "JobSet restarts 2", steps=8
    )  # fmt: skip
    assert facts["problems"] == []
    assert facts["wall_seconds"] == 60.0, "to the cap, not to the last step"
    assert facts["reached_step"] == 7
    # steps 1-4 of attempt 0 (4 s, the first from the restore) + 5-7 of attempt 1 (0.5 + 2)
    assert facts["productive_seconds"] == pytest.approx(4.0 + 0.5 + 2.0)
    assert facts["goodput"] == pytest.approx(6.5 / 60.0)
    assert any(f.startswith("rank 0: the model differs") and "[6]" in f for f in facts["findings"])
    assert not any(f.startswith("rank 1") for f in facts["findings"])
    assert any(f.startswith("did not finish: step 7 of 8") for f in facts["findings"])
    [recovery] = facts["recoveries"]
    assert recovery["resumed_attempt"] == 1 and recovery["lost_steps"] == 2
    done = baseline_judge.judge(100.0, 500.0, "Completed", logs, [], {0: ref}, None, steps=7)
    assert done["wall_seconds"] == 17.0, "a finished baseline ends at its last step"
    nothing = baseline_judge.judge(100.0, 160.0, None, {}, [], {0: ref}, "stuck", steps=8)
    assert nothing["problems"] == ["no training step was logged"]


def test_the_side_by_side_report_has_both_systems_and_two_lanes() -> None:
    def facts(goodput: float, what: str, first: float | None) -> dict[str, Any]:
        return {
            "created": 0.0, "timeline": {"1": {"1": 1.0, "2": 2.0}}, "goodput": goodput,
            "productive_seconds": 2.0, "wall_seconds": 10.0, "attempts": 1,
            "injected": [{"kind": "hang", "rank": 0, "at": 1.5, "scheduled": 20.0,
                          "what": what}],
            "recoveries": [{"seconds_to_first_step": first, "lost_steps": 3}],
            "problems": [], "findings": ["did not finish"], "reached_step": 2,
        }  # fmt: skip

    ours, base = facts(0.66, "SIGSTOP", 25.6), facts(0.2, "SIGSTOP", None)
    text = soak_compare.markdown(ours, base, {"seed": 4}, "2 CPUs")
    assert "**66.0%**" in text and "**20.0%**" in text
    assert "| +20 s | hang | 25.6 s / 3 | never trained again |" in text
    assert "different schedules" not in text
    svg = soak_compare.timeline(ours, base)
    assert svg.count("<polyline") == 2 and "(b) JobSet baseline" in svg
    assert "cap: not finished at step 2" not in svg, "no 'completed' key: not a baseline"
    stalled = soak_compare.timeline(ours, {**base, "completed": None})
    assert "cap: not finished at step 2" in stalled
    variant = {**facts(0.5, "SIGSTOP", 30.0), "label": "(b') the same, without node_lost"}
    text = soak_compare.markdown(ours, base, {}, "2 CPUs", [variant])
    assert "| (b') the same, without node_lost | **50.0%**" in text
    assert "| +20 s | hang | 25.6 s / 3 | never trained again | 30.0 s / 3 |" in text
    assert soak_compare.timeline(ours, base, [variant]).count("<polyline") == 3
    single = soak_report.timeline_svg(0.0, {1: {1: 1.0}}, [], "one")
    assert single.count("<polyline") == 1 and 'height="360"' in single


def test_the_nvrx_jobset_runs_ft_launcher_with_its_heartbeats() -> None:
    body = bj.jobset("ns", "q", 2, ["--steps=10"], launcher="nvrx")
    [rjob] = body["spec"]["replicatedJobs"]
    [c] = rjob["template"]["spec"]["template"]["spec"]["containers"]
    command = c["command"]
    assert command[:2] == ["ft_launcher", "--nnodes=2"]
    assert "--rdzv-backend=c10d" in command and f"--max-restarts={bj.MAX_RESTARTS}" in command
    assert "--rdzv-endpoint=$(MASTER_ADDR):$(MASTER_PORT)" in command
    assert command[-1] == "--nvrx-heartbeats" and "--steps=10" in command
    assert {e["name"] for e in c["env"]} >= {"MASTER_ADDR", "JOBSET_UID", "RESTART_ATTEMPT"}
    with pytest.raises(ValueError, match="launcher: expected one of torchrun, nvrx"):
        bj.launcher_command("mpirun", 2)


def test_a_rank_log_is_cut_at_each_restart_in_the_job() -> None:
    from bench.goodput_baseline import by_restore

    restore = json.dumps({"event": "restore", "step": 0})
    lines = [restore, '{"step": 1}', '{"step": 2}', restore, '{"step": 2}']
    assert by_restore(lines) == [lines[:3], lines[3:]]
    assert by_restore(['{"step": 1}']) == [['{"step": 1}']]  # a log cut before its restore
    assert by_restore([]) == []
