"""The Checkpointer reports to the pod's progress record: each completed step from
`step_boundary`, and its saves as the `checkpoint` section (issue 12)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from rtj_shim import progress
from rtj_shim.progress import Progress
from rtj_shim.torch import Checkpointer
from rtj_shim.wire import milestones
from rtj_shim.wire.progress_record import read_file


def test_step_boundary_and_saves_reach_the_progress_record(tmp_path: Path) -> None:
    record_dir = tmp_path / "progress"
    progress.install(Progress(record_dir, rank=0, local_rank=0))
    try:
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        objects = {"model": model, "opt": opt}
        ckpt = Checkpointer(str(tmp_path / "ckpt"))
        ckpt.restore(objects)
        for step in range(1, 4):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            ckpt.step_boundary(step, objects)
        ckpt.save(3, objects)
        ckpt.close()
        (path,) = record_dir.glob("*.progress")
        record = read_file(path)
        assert record.step == 3 and record.steps_completed == 3
        assert record.checkpoints == 1 and record.last_checkpoint_ns > 0
        assert record.section != "checkpoint", "the save's section was left again"
        # beside it, the process's start-up milestones (the recovery ledger's last phases)
        marks = milestones.read(milestones.path_for(path))
        assert marks is not None and marks.pid == record.pid
        assert [(m.value, marks.marks[m].step) for m in marks.marks] == [
            ("restore_began", None), ("restored", 0), ("first_step", 1),
        ]  # fmt: skip
        at = [mark.at for mark in marks.marks.values()]
        assert at == sorted(at)
    finally:
        progress.install(None)
