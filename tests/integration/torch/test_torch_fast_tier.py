"""The fast tier on real training (issue 16): the example trainer under torchrun, 2 ranks,
durable saves every 20 steps and fast-tier saves every 5 (``RTJ_FAST_TIER_DIR``).

Rank 1 is SIGKILLed after step 47: the newest durable step is 40, the newest fast step every
rank holds is 45. A restart pinned as an in-place restart pins it (``fast_step`` in the
resume file) resumes from 45 and continues the no-fault run bit for bit; a corrupted
fast-tier shard on one rank is skipped on every rank, with the reason, for the durable 40.
Drained (``rtj_shim.fast.drain``: rank 0's pod publishes fast step 45 into a durable root, rank 1's
file read from its pod's real progress sidecar), step 45 is a durable step the trainer
resumes from bit for bit, on a filesystem and on S3.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from rtj_operator.policy import fast_tier as fast_tier_policy
from rtj_shim.agent.progress_server import ProgressServer
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.checkpoint.verifier import verify_step
from rtj_shim.fast import fast_tier
from rtj_shim.fast.drain import DrainReport, drain_step
from rtj_shim.fast.drain_sidecar import Drainer
from rtj_shim.fast.fast_tier import committed_steps, holdings, rank_store
from rtj_shim.fast.peer_pull import PeerError
from rtj_shim.wire.control import job_key, sign
from rtj_shim.wire.drain_order import DrainOrder
from rtj_shim.wire.supervisor_report import SupervisorReport, SupervisorState

REPO = Path(__file__).resolve().parents[3]
STEPS, DURABLE_EVERY, FAST_EVERY, KILL_AFTER = 60, 20, 5, 47
RUN_ID = "run-fast-tier-test"  # the operator sets RTJ_RUN_ID in every pod
UID = "0b6f3c8e-2d4a-4e1f-9a7b-5c3d2e1f0a9b"
KEY = job_key(b"operator secret", UID)

pytestmark = pytest.mark.timeout(600)


def _train(work: Path, root: Path | str, logs: Path, *extra: str, env: dict[str, str]) -> int:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "AWS_"))}
    uri = f"file://{root}" if isinstance(root, Path) else root
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--max-restarts=0", "examples/ddp_train.py", f"--root={uri}",
         f"--log-dir={logs}", f"--steps={STEPS}", f"--save-every={DURABLE_EVERY}", *extra],
        cwd=REPO, env={**clean, **env}, timeout=300, capture_output=True, text=True,
    )  # fmt: skip
    (work / f"{logs.name}.stderr").write_text(done.stderr)
    return done.returncode


def _records(logs: Path, rank: int) -> list[dict[str, Any]]:
    out = []
    for line in (logs / f"rank-{rank}.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # the line a killed rank was writing
    return out


def _losses(logs: Path, rank: int) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in _records(logs, rank) if "loss" in r and "event" not in r}


def _restore(logs: Path, rank: int) -> dict[str, Any]:
    return [r for r in _records(logs, rank) if r.get("event") == "restore"][-1]


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The no-fault run, and a run whose rank 1 was killed after step 47."""
    work = tmp_path_factory.mktemp("fast-tier")
    assert _train(work, work / "clean-ckpt", work / "clean-logs", env={}) == 0
    fast = work / "fast"
    code = _train(
        work, work / "ckpt", work / "killed-logs",
        f"--fault-kill-step={KILL_AFTER}", "--fault-kill-rank=1",
        "--step-sleep=0.05",  # the fast step written in the background is in before the kill
        env={"RTJ_FAST_TIER_DIR": str(fast), "RTJ_FAST_EVERY_STEPS": str(FAST_EVERY),
             "RTJ_RUN_ID": RUN_ID},
    )  # fmt: skip
    assert code != 0, "rank 1 was to be killed"
    return {"work": work, "fast": fast, "ckpt": work / "ckpt", "clean": work / "clean-logs"}


def _resume(killed: dict[str, Path], name: str, pin: dict[str, Any]) -> Path:
    """Resume a copy of the killed run's stores with the resume file an in-place restart
    writes; the logs of the resumed run."""
    work = killed["work"] / name
    shutil.copytree(killed["ckpt"], work / "ckpt")
    shutil.copytree(killed["fast"], work / "fast")
    (work / "resume.json").write_text(json.dumps({**pin, "skipped": [], "source": "test"}))
    env = {
        "RTJ_FAST_TIER_DIR": str(work / "fast"),
        "RTJ_FAST_EVERY_STEPS": str(FAST_EVERY),
        "RTJ_RESUME_FILE": str(work / "resume.json"),
    }
    assert _train(work, work / "ckpt", work / "logs", env=env) == 0, (
        work / "logs.stderr"
    ).read_text()[-3000:]
    return work / "logs"


def test_the_killed_world_left_fast_steps_newer_than_its_durable_one(
    killed: dict[str, Path],
) -> None:
    for rank in (0, 1):
        kept = committed_steps(rank_store(killed["fast"], rank))
        assert kept == [45, 40], f"rank {rank} keeps the newest two fast steps: {kept}"
    assert holdings(killed["fast"]) == [40, 45]  # what the pod's supervisor reports
    durable = sorted(p.name for p in (killed["ckpt"] / "steps").iterdir())
    assert durable == ["step-000000000020", "step-000000000040"]


def test_resume_from_the_pinned_fast_step_continues_the_no_fault_run_bit_for_bit(
    killed: dict[str, Path],
) -> None:
    logs = _resume(killed, "from-fast", {"step": 40, "fast_step": 45})
    for rank in (0, 1):
        restore = _restore(logs, rank)
        assert (restore["step"], restore["source"], restore["skipped"]) == (45, "fast-tier", [])
        resumed, clean = _losses(logs, rank), _losses(killed["clean"], rank)
        assert sorted(resumed) == list(range(46, STEPS + 1))
        assert all(resumed[s] == clean[s] for s in resumed), f"rank {rank} diverged"


def test_a_corrupt_fast_shard_on_one_rank_falls_back_to_the_durable_step_on_every_rank(
    killed: dict[str, Path],
) -> None:
    shard = killed["fast"] / "rank-00001" / "steps" / "step-000000000045" / "ranks"
    target = shard / "rank-00001.pt"
    original = target.read_bytes()
    target.write_bytes(original[:-8] + bytes(8))  # same size: only the hash can tell
    try:
        logs = _resume(killed, "corrupt", {"step": 40, "fast_step": 45})
    finally:
        target.write_bytes(original)
    for rank in (0, 1):
        restore = _restore(logs, rank)
        assert (restore["step"], restore["source"]) == (40, "resume-file")
        [(step, reason)] = [(s["step"], s["reason"]) for s in restore["skipped"]]
        assert step == 45 and reason.startswith("fast tier: rank 1: ")
        assert "sha256" in reason or "does not match" in reason, reason
        resumed, clean = _losses(logs, rank), _losses(killed["clean"], rank)
        assert sorted(resumed) == list(range(41, STEPS + 1))
        assert all(resumed[s] == clean[s] for s in resumed), f"rank {rank} diverged"


def test_a_fast_step_alone_pinned_falls_back_to_resolving_the_durable_store(
    killed: dict[str, Path],
) -> None:
    """A file:// root the operator cannot read pins only the fast step; a fast step no rank
    holds then falls back to the newest verified durable step."""
    logs = _resume(killed, "unheld", {"fast_step": 55})
    for rank in (0, 1):
        restore = _restore(logs, rank)
        assert (restore["step"], restore["source"]) == (40, "resolved")
        assert restore["skipped"][0]["step"] == 55
        assert restore["skipped"][0]["reason"].startswith("fast tier: rank 0: ")


# -- two histories of one step number (issue 43) -------------------------------------------


def _run_from(work: Path, pin: dict[str, Any], name: str, *extra: str) -> tuple[int, Path]:
    """Train on `work`'s stores with the resume file an in-place restart writes."""
    resume = work / f"{name}.json"
    resume.write_text(json.dumps({**pin, "skipped": [], "source": "test"}))
    env = {"RTJ_FAST_TIER_DIR": str(work / "fast"), "RTJ_FAST_EVERY_STEPS": str(FAST_EVERY),
           "RTJ_RESUME_FILE": str(resume)}  # fmt: skip
    return _train(work, work / "ckpt", work / name, *extra, env=env), work / name


def _pods_pin(fast: Path, durable: int) -> fast_tier_policy.FastPin:
    """What the operator pins at the next in-place restart: each rank in a pod of its own,
    its supervisor reporting what its pod holds (`fast_tier.held`)."""
    reports: dict[str, SupervisorReport] = {}
    for rank in (0, 1):
        pod = fast.parent / f"pod-{rank}"
        shutil.rmtree(pod, ignore_errors=True)
        shutil.copytree(fast / f"rank-0000{rank}", pod / f"rank-0000{rank}")
        held = fast_tier.held(pod)
        reports[f"pod-{rank}"] = SupervisorReport(
            1, SupervisorState.STOPPED, fast_steps=tuple(h.step for h in held),
            fast_held=frozenset(held),
        )  # fmt: skip
    return fast_tier_policy.pin(reports, ["pod-0", "pod-1"], durable, [])


def test_after_a_durable_fallback_the_fast_steps_saved_again_are_one_history(
    killed: dict[str, Path],
) -> None:
    """Timeline A left fast steps 40 and 45 on both ranks; rank 1's pod is replaced (its
    fast tier empty), so the world resumes from durable 40 (timeline B), saves fast step 45
    again and is killed after 47. The next in-place restart must pin a step both ranks hold
    in B and resume the no-fault run bit for bit; a pin naming A's history falls back."""
    work = killed["work"] / "two-histories"
    shutil.copytree(killed["ckpt"], work / "ckpt")
    shutil.copytree(killed["fast"], work / "fast")
    shutil.rmtree(work / "fast" / "rank-00001")  # the replaced pod's emptyDir
    code, _ = _run_from(work, {"step": 40}, "b-logs", f"--fault-kill-step={KILL_AFTER}",
                        "--fault-kill-rank=1", "--step-sleep=0.05")  # fmt: skip
    assert code != 0, "rank 1 was to be killed"
    assert "is already published" not in (work / "b-logs.stderr").read_text()
    mine = {r: fast_tier.committed_held(rank_store(work / "fast", r)) for r in (0, 1)}
    [a_40] = [h for h in mine[0] if h.step == 40]
    b_45 = {r: next(h for h in mine[r] if h.step == 45) for r in (0, 1)}
    assert b_45[0] == b_45[1], f"rank 0 saved step 45 again, in B: {mine}"
    assert b_45[0].lineage != a_40.lineage, "B is another history than A"
    pinned = _pods_pin(work / "fast", 40)
    assert (pinned.step, pinned.lineage) == (45, b_45[0].lineage)

    wrong = killed["work"] / "two-histories-wrong-pin"
    shutil.copytree(work, wrong)
    _, logs = _run_from(wrong, {"step": 40, "fast_step": 45, "fast_lineage": a_40.lineage}, "c")
    for rank in (0, 1):
        restore = _restore(logs, rank)
        assert (restore["step"], restore["source"]) == (40, "resume-file")
        [skipped] = restore["skipped"]
        assert skipped["step"] == 45 and f"pinned lineage {a_40.lineage}" in skipped["reason"]

    code, logs = _run_from(work, {"step": 40, "fast_step": 45, "fast_lineage": pinned.lineage},
                           "c-logs")  # fmt: skip
    assert code == 0, (work / "c-logs.stderr").read_text()[-3000:]
    for rank in (0, 1):
        restore = _restore(logs, rank)
        assert (restore["step"], restore["source"], restore["skipped"]) == (45, "fast-tier", [])
        resumed, clean = _losses(logs, rank), _losses(killed["clean"], rank)
        assert sorted(resumed) == list(range(46, STEPS + 1))
        assert all(resumed[s] == clean[s] for s in resumed), f"rank {rank} diverged"


# -- the drain: a fast step published as a durable one, without the trainers ---------------


@contextmanager
def _sidecar(
    root: Path, fast: Path, key: str = KEY, drainer: Drainer | None = None
) -> Iterator[str]:
    """A pod's progress sidecar serving its fast tier (signed, the job's key); its address."""
    (root / "progress").mkdir(parents=True)
    server = ProgressServer(
        root / "progress", "127.0.0.1", 0, control_dir=root / "control",
        fast_tier_dir=fast, control_key=key, job_uid=UID, drainer=drainer,
    )  # fmt: skip
    server.start_in_thread()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        server.shutdown()
        server.server_close()


def _two_pods(killed: dict[str, Path], work: Path) -> tuple[Path, Path]:
    """The killed run's fast tier as two pods' volumes, one rank each."""
    pod0, pod1 = work / "pod-0" / "fast", work / "pod-1" / "fast"
    shutil.copytree(killed["fast"] / "rank-00000", pod0 / "rank-00000")
    shutil.copytree(killed["fast"] / "rank-00001", pod1 / "rank-00001")
    return pod0, pod1


def _drain(killed: dict[str, Path], work: Path, root: str, peer_key: str = KEY) -> DrainReport:
    """Rank 0's pod drains step 45 into ``root``, rank 1's file read from the other pod's
    sidecar."""
    pod0, pod1 = _two_pods(killed, work)
    with _sidecar(work / "pod-1", pod1, peer_key) as peer:
        # as the world whose fast step it is (attempt 0 here): a newer world may write on
        protocol = CommitProtocol(open_store(root), run_id=RUN_ID, attempt="0", retention=None)
        return drain_step(pod0, protocol, 45, [peer], KEY)


def _resumes_the_drained_step_bit_for_bit(
    killed: dict[str, Path], work: Path, root: str, env: dict[str, str]
) -> None:
    verdict = verify_step(open_store(root), 45, Depth.DEEP)
    assert verdict.valid, verdict.reason
    assert verdict.manifest is not None
    assert verdict.manifest.extra["drained_from"] == "fast-tier"
    assert "tier" not in verdict.manifest.extra  # never taken for a fast step
    paths = sorted(f.path for f in verdict.manifest.files)
    assert paths[-2:] == ["ranks/rank-00000.pt", "ranks/rank-00001.pt"], paths
    code = _train(work, root, work / "logs", env=env)
    assert code == 0, (work / "logs.stderr").read_text()[-3000:]
    for rank in (0, 1):
        restore = _restore(work / "logs", rank)
        assert (restore["step"], restore["source"]) == (45, "resolved"), restore
        resumed, clean = _losses(work / "logs", rank), _losses(killed["clean"], rank)
        assert sorted(resumed) == list(range(46, STEPS + 1))
        assert all(resumed[s] == clean[s] for s in resumed), f"rank {rank} diverged"


def test_a_drained_fast_step_is_a_durable_step_the_trainer_resumes_bit_for_bit(
    killed: dict[str, Path],
) -> None:
    work = killed["work"] / "drain-fs"
    root = f"file://{work / 'durable'}"
    report = _drain(killed, work, root)
    assert (report.step, report.remote_ranks, report.uri) == (
        45, (1,), f"{root}/steps/step-000000000045",
    )  # fmt: skip
    _resumes_the_drained_step_bit_for_bit(killed, work, root, env={})


def test_a_fast_step_drains_into_s3(killed: dict[str, Path], s3_root: str) -> None:
    work = killed["work"] / "drain-s3"
    assert _drain(killed, work, s3_root).remote_ranks == (1,)
    aws = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    _resumes_the_drained_step_bit_for_bit(killed, work, s3_root, env=aws)


def test_a_peer_of_another_job_hands_the_drain_nothing_and_nothing_is_published(
    killed: dict[str, Path],
) -> None:
    work = killed["work"] / "drain-foreign"
    root = f"file://{work / 'durable'}"
    with pytest.raises(PeerError, match=r"HTTP 403.*missing or not this job"):
        _drain(killed, work, root, peer_key=job_key(b"operator secret", "another-job-uid"))
    assert not (work / "durable" / "steps").exists() or not any(
        (work / "durable" / "steps").iterdir()
    )


def _post(address: str, path: str, body: bytes, signature: str) -> int:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", path, body, {"X-RTJ-Signature": signature})
        return conn.getresponse().status
    finally:
        conn.close()


def _drain_report(address: str) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/progress")
        body: dict[str, Any] = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return dict(body.get("drain") or {})


def _until(what: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s")


def test_rank_0s_sidecar_drains_on_the_operators_signed_order(killed: dict[str, Path]) -> None:
    """Pod 0's sidecar, ordered to drain every 5th fast step, publishes fast step 45 (rank
    1's file from pod 1's sidecar); an order signed with another job's key is refused."""
    work = killed["work"] / "drain-sidecar"
    pod0, pod1 = _two_pods(killed, work)
    root = f"file://{work / 'durable'}"
    with (
        _sidecar(work / "pod-1", pod1) as peer,
        _sidecar(work / "pod-0", pod0, drainer=Drainer(pod0, KEY, root, RUN_ID)) as me,
    ):
        other_job = job_key(b"operator secret", "another-job-uid")
        order = DrainOrder(UID, "0", FAST_EVERY, (peer,)).encode()
        assert _post(me, "/drain", order, sign(other_job, order)) == 403
        assert _drain_report(me) == {}  # nothing followed
        assert _post(me, "/drain", order, sign(KEY, order)) == 202
        report = _until(lambda: (r := _drain_report(me)).get("step") == 45 and r)
    assert report["error"] is None and report["peers"] == 1, report
    assert report["last"]["bytes"] > 0, report
    verdict = verify_step(open_store(root), 45, Depth.DEEP)
    assert verdict.valid, verdict.reason


def test_a_step_the_trainers_save_themselves_is_left_to_them(killed: dict[str, Path]) -> None:
    """Ordered to drain every 20th fast step, the sidecar finds fast step 40, which the
    trainers save durably themselves (every 20 steps, recorded in their fast manifests):
    it publishes nothing (one writer per step)."""
    work = killed["work"] / "drain-trainers"
    pod0, pod1 = _two_pods(killed, work)
    root = f"file://{work / 'durable'}"
    with (
        _sidecar(work / "pod-1", pod1) as peer,
        _sidecar(work / "pod-0", pod0, drainer=Drainer(pod0, KEY, root, RUN_ID)) as me,
    ):
        order = DrainOrder(UID, "0", DURABLE_EVERY, (peer,)).encode()
        assert _post(me, "/drain", order, sign(KEY, order)) == 202
        report = _until(lambda: (r := _drain_report(me)).get("step") == 40 and r)
    assert report["last"] == {"step": 40, "left_to_trainers": True}, report
    assert report["error"] is None
    assert not (work / "durable" / "steps").exists()
