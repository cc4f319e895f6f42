"""In-place restart of real training (issue 15): torchrun (2 ranks, gloo) under ``rtj-shim
supervise``; one rank is SIGKILLed mid-run, torchrun ends the other and exits, and the pod's
supervisor reports it. Ordered through the pod's progress server as the operator orders it
(stop, then run from the newest verified step as the next attempt), the same supervisor
starts torchrun again inside the "pod": it resumes from that step and its losses equal a
no-fault run's bit for bit; the step's new checkpoints are written as the new attempt.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from supervised_pod import UID, Pod, until

from rtj_shim.agent.supervisor import descendants
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.wire.control import Order

REPO = Path(__file__).resolve().parents[3]
STEPS, SAVE_EVERY = 120, 40


def torchrun(root: Path, logs: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node=2", str(REPO / "examples" / "ddp_train.py"),
            f"--root=file://{root}", f"--log-dir={logs}", f"--steps={STEPS}",
            f"--save-every={SAVE_EVERY}", *extra]  # fmt: skip


def losses(logs: Path, rank: int) -> dict[int, float]:
    """step -> loss, the last record of each step winning (a resumed run recomputes)."""
    out: dict[int, float] = {}
    for line in (logs / f"rank-{rank}.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record and "event" not in record:
            out[int(record["step"])] = float(record["loss"])
    return out


def step_reached(logs: Path, step: int) -> bool:
    try:
        return max(losses(logs, 0), default=0) >= step
    except (FileNotFoundError, ValueError):
        return False


def test_a_killed_rank_restarts_in_place_from_the_pinned_step_bit_for_bit(
    pod: Pod, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RTJ_", "AWS_"))}
    clean = tmp_path / "clean-logs"
    subprocess.run(torchrun(tmp_path / "clean", clean), cwd=REPO, env=env, check=True,
                   timeout=600, capture_output=True)  # fmt: skip

    root, logs = tmp_path / "ckpt", tmp_path / "logs"
    sup = pod.supervise(*torchrun(root, logs, "--step-sleep=0.05"), deadline=120)
    until("step 60", lambda: step_reached(logs, 60), 300)
    ranks = [p for p in descendants(sup.pid) if b"ddp_train" in _cmdline(p)]
    trainers = [p for p in ranks if b"torch.distributed.run" not in _cmdline(p)]
    assert len(trainers) == 2
    os.kill(max(trainers), signal.SIGKILL)  # one rank dies; torchrun ends the other
    until("the supervisor to report the exit",
          lambda: (pod.supervisor() or {}).get("state") == "exited", 120)  # fmt: skip

    assert pod.post(Order(UID, 1, "stop"))[0] == 202
    until("stopped", lambda: (pod.supervisor() or {}).get("state") == "stopped", 60)
    assert not [p for p in descendants(sup.pid)], "no process of the old world is left"
    pinned = resolve(open_store(f"file://{root}")).step
    assert pinned is not None and pinned % SAVE_EVERY == 0 and pinned >= SAVE_EVERY
    assert pod.post(Order(UID, 1, "run", attempt=2, step=pinned))[0] == 202
    assert sup.wait(600) == 0, "the restarted training ran to the end"

    restores = [json.loads(line) for line in (logs / "rank-0.jsonl").read_text().splitlines()
                if '"restore"' in line]  # fmt: skip
    assert restores and restores[-1]["step"] == pinned, restores
    for rank in (0, 1):
        got, want = losses(logs, rank), losses(clean, rank)
        assert got == want, f"rank {rank}: {sorted(s for s in want if got.get(s) != want[s])}"
    run = json.loads((root / "run.json").read_text())
    assert str(run["writer_attempt"]) == "2.1", run  # attempt 2, generation 1


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
