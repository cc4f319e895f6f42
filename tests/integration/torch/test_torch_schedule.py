"""Save scheduling through step_boundary(): every N steps, every T seconds, if improved;
keep-best retention in the trainer; the decision shared by every rank (torchrun)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rtj_shim import progress
from rtj_shim.checkpoint.layout import step_key
from rtj_shim.progress import Progress
from rtj_shim.torch import Checkpointer
from rtj_shim.wire import interval_order, save_costs

WORKER = Path(__file__).with_name("schedule_worker.py")


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("RTJ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RTJ_RESUME_FILE", str(tmp_path / "absent-resume.json"))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


def job() -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}


def train_step(state: dict[str, Any]) -> float:
    loss = state["model"](torch.randn(4, 3)).pow(2).mean()
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad()
    return float(loss.detach())


def published(root: Path) -> list[int]:
    steps = root / "steps"
    return sorted(int(p.name[5:]) for p in steps.iterdir() if ".tmp-" not in p.name)


def manifest_extra(root: Path, step: int) -> dict[str, Any]:
    raw = json.loads((root / step_key(step, "manifest.json")).read_text())
    return raw["extra"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"every_steps": 5}, [5, 10, 15]),
        ({"every_seconds": 1e-9}, list(range(1, 18))),  # always due
        ({"every_seconds": 3600.0, "every_steps": 8}, [8, 16]),  # never due by time here
    ],
)
def test_step_boundary_saves_on_schedule(
    tmp_path: Path, kwargs: dict[str, Any], expected: list[int]
) -> None:
    state = job()
    ckpt = Checkpointer(tmp_path, **kwargs)
    reports = []
    for step in range(1, 18):
        loss = train_step(state)
        report = ckpt.step_boundary(step, state, loss=loss)
        if report is not None:
            reports.append(report.step)
    assert published(tmp_path) == expected == reports


def test_save_if_improved_keep_best_and_the_best_survives_a_resume(tmp_path: Path) -> None:
    state = job()
    ckpt = Checkpointer(
        tmp_path, every_steps=4, monitor="val_loss", mode="min", keep_last=1, keep_best=2
    )
    evaluations = {2: 0.9, 4: 0.5, 6: 0.7, 8: 0.6, 10: 0.4, 12: 0.8}
    for step in range(1, 13):
        train_step(state)
        ckpt.step_boundary(step, state, metric=evaluations.get(step))
    # saved: 2 (improved), 4 (both), 8 (schedule), 10 (improved), 12 (schedule);
    # kept: 12 newest, 10 previous and best, 4 second best; 2 and 8 deleted by retention
    assert published(tmp_path) == [4, 10, 12]
    extra = manifest_extra(tmp_path, 12)
    assert extra["metric"] == {"name": "val_loss", "mode": "min", "value": 0.8}
    assert extra["best"] == {"name": "val_loss", "mode": "min", "value": 0.4, "step": 10}

    resumed = job()
    again = Checkpointer(tmp_path, monitor="val_loss", mode="min", keep_last=1, keep_best=2)
    assert again.restore(resumed) == 12
    train_step(resumed)
    assert again.step_boundary(13, resumed, metric=0.45) is None  # the best is 0.4, from before
    train_step(resumed)
    report = again.step_boundary(14, resumed, metric=0.3)
    assert report is not None and report.step == 14
    assert published(tmp_path) == [10, 12, 14]  # 14 newest and best, 12 previous, 10 2nd best


def test_every_rank_takes_the_same_decision(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(port),
        str(WORKER), str(tmp_path / "ckpt"), str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RTJ_RESUME_FILE": "/nonexistent/resume.json"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    seen = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert seen[0] == seen[1] == {
        "time": [2, 4], "metric": [1, 3], "slow": [2, 4, 5, 6, 7, 8], "sparse": [2, 7, 15],
    }  # fmt: skip
    assert published(tmp_path / "ckpt" / "time") == [2, 4]
    assert published(tmp_path / "ckpt" / "metric") == [1, 3]


def test_every_seconds_auto_follows_the_operators_order_and_reports_the_save_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`plannedIntervalSeconds: auto`: the interval the sidecar wrote into the progress
    directory (`rtj_shim.wire.interval_order`), followed without a restart; each durable
    save's cost lands beside the rank's record for the operator (`rtj_shim.wire.save_costs`)."""
    record_dir = tmp_path / "progress"
    monkeypatch.setenv(progress.ENV_DIR, str(record_dir))
    monkeypatch.setattr(interval_order, "RECHECK_S", 0.0)  # look at every boundary here
    progress.install(Progress(record_dir, rank=0, local_rank=0))
    try:
        state = job()
        ckpt = Checkpointer(tmp_path / "ckpt", every_seconds="auto")
        assert ckpt.schedule.every_seconds == interval_order.START_SECONDS
        for step in range(1, 4):  # before any order: 600 s, nothing due
            assert ckpt.step_boundary(step, state, loss=train_step(state)) is None
        interval_order.write(record_dir, interval_order.IntervalOrder("job-uid", 1))
        time.sleep(1.05)  # the order's second has passed since the restore
        saved = []
        for step in range(4, 8):
            if (report := ckpt.step_boundary(step, state, loss=train_step(state))) is not None:
                saved.append(report.step)
        assert ckpt.schedule.every_seconds == 1.0
        assert saved and published(tmp_path / "ckpt") == saved
        ckpt.close()
        (record,) = record_dir.glob("*.progress")
        costs = save_costs.read(save_costs.path_for(record))
        assert costs is not None and costs.tiers[save_costs.SaveTier.DURABLE].saves == len(saved)
        with pytest.raises(ValueError, match="every_seconds: expected seconds > 0 or 'auto'"):
            Checkpointer(tmp_path / "other", every_seconds="often")  # type: ignore[arg-type]
    finally:
        progress.install(None)
