"""Plain values as training state, without wrapper classes, still refusing arbitrary pickles."""

from __future__ import annotations

import enum
import json
import logging
import os
import random
import socket
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful

from rtj_shim.torch import Checkpointer, CheckpointError, UnsafeStateError
from rtj_shim.torch.fingerprint import replica_mismatches
from rtj_shim.torch.options import ResumeOptions

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
        assert row["peek"] == {
            "step": 2,
            "meta": {"config": {"hidden": 64}, "tokens": 1234},
            "has_batch": False,
        }
        assert row["restored_step"] == 2
        assert row["batch"] == [float(rank)] * 2  # each rank its own
        assert row["epoch"] == 3 and row["meta"]["config"] == {"hidden": 64}

    one: dict[str, Any] = {"model": nn.Linear(2, 2), "epoch": 0, "meta": {}}
    assert Checkpointer(root).restore(one) == 2  # replicated values: any world size
    assert one["epoch"] == 3 and one["meta"] == {"config": {"hidden": 64}, "tokens": 1234}
    with pytest.raises(CheckpointError, match=r"rank-local state of \['batch'\].*strict=False"):
        Checkpointer(root).restore({**one, "batch": None})
    lenient = Checkpointer(root)
    assert lenient.restore({**one, "batch": None}, strict=False) == 2
    assert lenient.last_restore is not None and lenient.last_restore.missing == ("batch",)


class DataCursor(Stateful):
    """DCP's Stateful protocol, state in NumPy (as many data pipelines keep it)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.weights = np.linspace(0, 1, 5)
        self.position = np.int64(0)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "w": self.weights, "pos": self.position}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state_dict["rng"]
        self.weights, self.position = state_dict["w"], state_dict["pos"]

    def advance(self) -> float:
        self.position += 1
        return float(self.rng.random() * self.weights.sum())


def test_numpy_generators_and_stateful_objects_without_wrappers(tmp_path: Path) -> None:
    def state(seed: int) -> dict[str, Any]:
        return {
            "model": nn.Linear(2, 1),
            "cursor": DataCursor(seed),
            "np_rng": np.random.default_rng(seed),
            "torch_rng": torch.Generator().manual_seed(seed),
            "py_rng": random.Random(seed),
            "mask": np.zeros(4, dtype=bool),
        }

    saved = state(1)
    saved["cursor"].advance()
    saved["mask"][1] = True
    Checkpointer(tmp_path).save(3, saved)
    expected = (
        saved["cursor"].advance(),
        saved["np_rng"].random(),
        torch.rand(1, generator=saved["torch_rng"]).item(),
        saved["py_rng"].random(),
    )

    fresh = state(2)
    np_rng, mask = fresh["np_rng"], fresh["mask"]
    assert Checkpointer(tmp_path).restore(fresh) == 3
    assert fresh["np_rng"] is np_rng and fresh["mask"] is mask  # restored in place
    assert mask.tolist() == [False, True, False, False]
    assert fresh["cursor"].position == 1 and type(fresh["cursor"].position) is np.int64
    got = (
        fresh["cursor"].advance(),
        fresh["np_rng"].random(),
        torch.rand(1, generator=fresh["torch_rng"]).item(),
        fresh["py_rng"].random(),
    )
    assert got == expected


def test_placement_defaults_and_overrides_are_recorded(tmp_path: Path) -> None:
    objects = {"cursor": DataCursor(0), "gen": np.random.default_rng(0), "epoch": 1}
    Checkpointer(tmp_path / "a").save(1, objects)
    Checkpointer(tmp_path / "b", rank_local=("epoch",), replicated=("cursor", "gen")).save(
        1, objects
    )
    placement = {}
    for name in ("a", "b"):
        raw = (tmp_path / name / "steps" / "step-000000000001" / "manifest.json").read_text()
        saved = json.loads(raw)["extra"]["torch"]["objects"]
        placement[name] = {k: v["placement"] for k, v in saved.items()}
    assert placement["a"] == {"cursor": "rank", "gen": "rank", "epoch": "common"}
    assert placement["b"] == {"cursor": "common", "gen": "common", "epoch": "rank"}
    with pytest.raises(ValueError, match=r"\['epoch'\] named both"):
        Checkpointer(tmp_path / "c", rank_local=("epoch",), replicated=("epoch",)).save(1, objects)


def test_an_object_added_after_the_checkpoint_restores_only_when_not_strict(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    Checkpointer(tmp_path).save(4, {"model": model, "epoch": 2, "old": "gone later"})

    ema = {"decay": 0.99, "shadow": torch.zeros(2, 3)}  # added to the script afterwards
    objects: dict[str, Any] = {"model": nn.Linear(3, 2), "epoch": 0, "ema": ema}
    with pytest.raises(CheckpointError, match=r"no state for \['ema'\].*strict=False"):
        Checkpointer(tmp_path).restore(objects)

    ckpt = Checkpointer(tmp_path, resume=ResumeOptions(report=False))  # then the line is a warning
    with caplog.at_level(logging.WARNING, logger="rtj_shim.torch"):
        assert ckpt.restore(objects, strict=False) == 4
    assert "not in the checkpoint, left as they are: ['ema']" in caplog.text
    assert objects["epoch"] == 2 and objects["ema"] is ema and ema["decay"] == 0.99
    assert torch.equal(objects["model"].weight, model.weight)
    report = ckpt.last_restore
    assert report is not None and report.missing == ("ema",) and report.unused == ("old",)
    with pytest.raises(CheckpointError, match=r"\['ema'\] changed since"):
        ckpt.save(4, objects)  # published step 4 has no 'ema': not the same state


def test_a_plain_value_cannot_restore_into_a_stateful_object(tmp_path: Path) -> None:
    Checkpointer(tmp_path).save(1, {"cursor": {"pos": 3}})
    with pytest.raises(CheckpointError, match="'cursor' was saved as a value and is a stateful"):
        Checkpointer(tmp_path).restore({"cursor": DataCursor(0)})
