"""peek(): the step restore() would resume and its saved arguments, before the model exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from rtj_shim.checkpoint.storage import open_store
from rtj_shim.torch import Checkpointer
from rtj_shim.torch.options import IoOptions


@pytest.fixture(autouse=True)
def _no_resume_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RTJ_RESUME_FILE", str(tmp_path / "absent-resume.json"))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


class ReadRecorder:
    """A real filesystem store that remembers which keys were read."""

    def __init__(self, root: Path) -> None:
        self._inner = open_store(str(root))
        self.reads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read(self, key: str) -> bytes | None:
        self.reads.append(key)
        return self._inner.read(key)  # type: ignore[no-any-return]


def build(config: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(8, config["hidden"])]
    layers += [nn.Linear(config["hidden"], config["hidden"]) for _ in range(config["depth"])]
    model = nn.Sequential(*layers)
    return {
        "model": model,
        "opt": torch.optim.AdamW(model.parameters()),
        "config": config,
        "norm": np.zeros(3),
    }


def test_peek_reads_the_saved_arguments_and_restore_resumes_that_step(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path).peek() is None  # fresh: nothing to read

    config = {"hidden": 48, "depth": 3, "name": "small"}
    state = build(config)
    state["norm"] = np.array([0.5, 1.5, 2.5])
    Checkpointer(tmp_path, io=IoOptions(shard_bytes=4096)).save(
        10, state
    )  # the model spans many shards

    ckpt = Checkpointer(tmp_path)
    info = ckpt.peek()
    assert info is not None and info.step == 10 and info.source == "resolved"
    assert info.values["config"] == config
    assert info.values["norm"].tolist() == [0.5, 1.5, 2.5]
    assert info.world_size == 1 and info.framework["name"] == "pytorch"
    assert info.objects["model"] == {"kind": "module", "placement": "common"}
    assert info.uri.endswith("steps/step-000000000010")

    Checkpointer(tmp_path).save(20, state)  # published between peek() and restore()
    fresh = build({"hidden": info.values["config"]["hidden"], "depth": 3, "name": ""})
    assert ckpt.restore(fresh) == 10  # the step peek() saw, not verified again
    assert fresh["config"] == config
    assert ckpt.restore(build(config)) == 20  # a later restore decides afresh


def test_peek_reads_only_the_shards_its_values_are_in(tmp_path: Path) -> None:
    state = build({"hidden": 64, "depth": 4, "name": "x"})
    state["norm"] = np.arange(3.0)
    Checkpointer(tmp_path, io=IoOptions(shard_bytes=4096)).save(1, state)
    shards = sorted(p.name for p in (tmp_path / "steps/step-000000000001/common").iterdir())
    assert len(shards) > 8

    store = ReadRecorder(tmp_path)
    info = Checkpointer(store).peek()  # type: ignore[arg-type]
    assert info is not None and info.values["norm"].tolist() == [0.0, 1.0, 2.0]
    read = [k.rsplit("/", 1)[-1] for k in store.reads if "/common/" in k]
    assert "skeleton.pt" in read
    assert 1 <= len([k for k in read if k.startswith("shard-")]) < len(shards) - 1
