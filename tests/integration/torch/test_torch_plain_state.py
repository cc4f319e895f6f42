"""Plain values as training state, without wrapper classes, still refusing arbitrary pickles."""

from __future__ import annotations

import enum
import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rtj_shim.torch import Checkpointer, CheckpointError, UnsafeStateError
from rtj_shim.torch.checkpointer import replica_mismatches

WORKER = Path(__file__).with_name("plain_worker.py")


@pytest.fixture(autouse=True)
def _no_resume_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RTJ_RESUME_FILE", str(tmp_path / "absent-resume.json"))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)


def saved_state() -> dict[str, Any]:
    return {
        "model": nn.Linear(3, 2),
        "epoch": 4,
        "best": 0.125,
        "name": "run-a",
        "nothing": None,
        "history": [1.5, 2.5, {"lr": 3e-4}],
        "meta": {"tokens": 10**12, "tags": ("a", "b"), "blob": b"\x00\x01"},
        "ema": torch.arange(6, dtype=torch.float64).reshape(2, 3),
        "batch": (torch.ones(2, 3), torch.tensor([1, 0])),
    }


def test_plain_values_restore_into_the_mapping_and_keep_mutable_objects(tmp_path: Path) -> None:
    state = saved_state()
    Checkpointer(tmp_path).save(7, state)

    meta: dict[str, Any] = {}
    history: list[Any] = []
    ema = torch.zeros(2, 3, dtype=torch.float64)
    fresh: dict[str, Any] = {
        "model": nn.Linear(3, 2),
        "epoch": 0,
        "best": float("inf"),
        "name": "",
        "nothing": None,
        "history": history,
        "meta": meta,
        "ema": ema,
        "batch": None,
    }
    assert Checkpointer(tmp_path).restore(fresh) == 7
    for key in ("epoch", "best", "name", "nothing", "history", "meta"):
        assert fresh[key] == state[key], key
        assert type(fresh[key]) is type(state[key]), key
    assert fresh["history"] is history and fresh["meta"] is meta  # updated in place
    assert fresh["ema"] is ema and torch.equal(ema, state["ema"])
    assert isinstance(fresh["batch"], tuple)
    assert all(torch.equal(a, b) for a, b in zip(fresh["batch"], state["batch"], strict=True))


class Color(enum.IntEnum):
    RED = 1


class Config:
    pass


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (Color.RED, "colour"),  # an int subclass pickles as its class: would not load
        ({"cfg": Config()}, r"settings\.cfg"),
        ([1, {"x": Config()}], r"settings\[1\]\.x"),
    ],
)
def test_values_that_would_need_arbitrary_unpickling_are_refused_at_save(
    tmp_path: Path, value: Any, where: str
) -> None:
    name = "colour" if where == "colour" else "settings"
    with pytest.raises(UnsafeStateError, match=where):
        Checkpointer(tmp_path).save(1, {name: value})
    assert not (tmp_path / "steps").exists() or not any((tmp_path / "steps").iterdir())


def test_an_object_that_is_neither_stateful_nor_plain_is_named(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"plain_state\.Config has no state_dict\(\)"):
        Checkpointer(tmp_path).save(1, {"cfg": Config()})


def test_values_need_a_mapping_that_can_take_them_back(tmp_path: Path) -> None:
    Checkpointer(tmp_path).save(1, {"epoch": 3})
    frozen = types.MappingProxyType({"epoch": 0})
    with pytest.raises(CheckpointError, match="pass a dict"):
        Checkpointer(tmp_path).restore(frozen)


def test_replica_mismatches_names_what_differs_between_ranks() -> None:
    same = {"meta": "aa", "epoch": "bb"}
    assert replica_mismatches([same, dict(same)]) == []
    assert replica_mismatches([same, {"meta": "aa", "epoch": "cc"}]) == ["epoch"]
    assert replica_mismatches([same, {"meta": "aa"}]) == ["epoch"]


def test_placement_per_object_under_torchrun_and_on_a_new_world_size(tmp_path: Path) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(port),
        str(WORKER), str(root), str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RTJ_RESUME_FILE": "/nonexistent/resume.json"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    seen = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for rank, row in enumerate(seen):
        assert "['batch'] differ between ranks" in row["replicated_batch"], row
        assert "rank_local=('batch',)" in row["replicated_batch"]
        assert row["restored_step"] == 2
        assert row["batch"] == [float(rank)] * 2  # each rank its own
        assert row["epoch"] == 3 and row["meta"]["config"] == {"hidden": 64}

    one: dict[str, Any] = {"model": nn.Linear(2, 2), "epoch": 0, "meta": {}}
    assert Checkpointer(root).restore(one) == 2  # replicated values: any world size
    assert one["epoch"] == 3 and one["meta"] == {"config": {"hidden": 64}, "tokens": 1234}
    with pytest.raises(CheckpointError, match=r"rank-local state of \['batch'\]"):
        Checkpointer(root).restore({**one, "batch": None})
