"""The configuration guard on resume with real PyTorch (issue 43 section 4): every manifest
records the run's configuration; a resume whose declared hyperparameters or parameter shapes
changed fails naming the keys, unless the change is declared, which the next manifests
record; a world-size change is allowed and recorded (torchrun, 2 ranks, then 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rtj_shim.checkpoint.layout import step_key
from rtj_shim.checkpoint.manifest import decode_manifest
from rtj_shim.checkpoint.run_config import RUN_CONFIG_EXTRA, ConfigMismatch, RunConfig
from rtj_shim.torch import Checkpointer

WORKER = Path(__file__).with_name("config_worker.py")
CONFIG = {"lr": 0.01, "optim": {"betas": [0.9, 0.95]}, "batch": 4}


def _objects(width: int = 16, seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 1))
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.01)}


def _train(objects: dict[str, Any], steps: int) -> None:
    for _ in range(steps):
        loss = objects["model"](torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        objects["opt"].step()
        objects["opt"].zero_grad()


def _record(root: Path, step: int) -> RunConfig:
    raw = (root / step_key(step) / "manifest.json").read_bytes()
    return RunConfig.parse(decode_manifest(raw).extra[RUN_CONFIG_EXTRA])


def _saved_at_step_2(root: Path) -> None:
    objects = _objects()
    ckpt = Checkpointer(root, config=CONFIG)
    assert ckpt.restore(objects) == 0
    _train(objects, 2)
    ckpt.save(2, objects)
    ckpt.close()


def test_the_manifest_records_world_layout_config_and_parameter_shapes(tmp_path: Path) -> None:
    _saved_at_step_2(tmp_path)
    record = _record(tmp_path, 2)
    assert (record.world_size, record.layout, record.config) == (1, "replicated", CONFIG)
    assert record.params == {
        "model.0.weight": (16, 4),
        "model.0.bias": (16,),
        "model.2.weight": (1, 16),
        "model.2.bias": (1,),
    }
    assert record.history == ()


def test_a_changed_learning_rate_is_refused_naming_it_and_nothing_is_loaded(
    tmp_path: Path,
) -> None:
    _saved_at_step_2(tmp_path)
    objects = _objects(seed=7)
    before = [p.detach().clone() for p in objects["model"].parameters()]
    ckpt = Checkpointer(tmp_path, config={**CONFIG, "lr": 0.02})
    with pytest.raises(ConfigMismatch) as err:
        ckpt.restore(objects)
    assert "config.lr (0.01 in the checkpoint, 0.02 now)" in str(err.value)
    after = list(objects["model"].parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    ckpt.close()


def test_a_changed_layer_is_refused_naming_its_parameters(tmp_path: Path) -> None:
    _saved_at_step_2(tmp_path)
    ckpt = Checkpointer(tmp_path, config=CONFIG)
    with pytest.raises(ConfigMismatch) as err:
        ckpt.restore(_objects(width=32))
    keys = [c.key for c in err.value.changes]
    assert keys == ["params.model.0.bias", "params.model.0.weight", "params.model.2.weight"]
    ckpt.close()


def test_a_declared_change_resumes_and_every_later_manifest_records_it(tmp_path: Path) -> None:
    _saved_at_step_2(tmp_path)
    objects = _objects(seed=7)
    ckpt = Checkpointer(tmp_path, config={**CONFIG, "lr": 0.02}, allow_config_change=["lr"])
    assert ckpt.restore(objects) == 2
    _train(objects, 1)
    ckpt.save(3, objects)
    ckpt.close()
    (accepted,) = _record(tmp_path, 3).history
    assert accepted.step == 2
    assert [(c.key, c.saved, c.now) for c in accepted.changes] == [("config.lr", 0.01, 0.02)]
    # the next resume with the new value compares against step 3's record: nothing to declare
    again = Checkpointer(tmp_path, config={**CONFIG, "lr": 0.02})
    assert again.restore(_objects()) == 3
    again.close()


def test_a_world_size_change_is_allowed_and_recorded(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        str(WORKER),
        str(root),
        "2",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert _record(root, 2).world_size == 2
    one = subprocess.run([sys.executable, str(WORKER), str(root), "3"], capture_output=True,
                         text=True, timeout=240, check=False)  # fmt: skip
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-3000:]
    assert json.loads(one.stdout.strip().splitlines()[-1]) == {"restored": 2, "saved": 3}
    record = _record(root, 3)
    assert record.world_size == 1
    assert [(c.key, c.saved, c.now) for c in record.history[0].changes] == [("world_size", 2, 1)]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
