"""Deep verification shared by the pods of an attempt (issue 13: each pod used to hash the
whole checkpoint, N times the store's read volume per restart). With `--deep-share i/N`
every file is hashed by exactly one pod, so the group reads the step once; a corrupt file
still fails its owner's verification. Real files, the real resolver and CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth, Share

FILES = 24


def _publish(root: Path) -> None:
    src = root.parent / "src"
    src.mkdir()
    for i in range(FILES):
        (src / f"rank-{i:05d}.pt").write_bytes(bytes([i]) * (1000 + i))
    CommitProtocol(open_store(str(root)), run_id="r", attempt="1").publish_directory(300, src)


class CountingStore:
    """The real filesystem store, recording which files it hashes (from several threads)."""

    def __init__(self, root: str) -> None:
        self.inner = open_store(root)
        self.paths: list[str] = []  # list.append is atomic

    @property
    def hashed(self) -> int:
        return sum(int(p.split("-")[1].split(".")[0]) + 1000 for p in self.paths)

    def sha256(self, name: object, path: str) -> str:
        self.paths.append(path)
        return self.inner.sha256(name, path)  # type: ignore[arg-type]

    def __getattr__(self, attr: str) -> object:
        return getattr(self.inner, attr)


def test_every_file_is_hashed_by_exactly_one_share() -> None:
    paths = [f"model/__{i}_0.distcp" for i in range(200)] + ["meta.json"]
    for count in (1, 2, 8, 128):
        owners = [[i for i in range(count) if Share(i, count).owns(p)] for p in paths]
        assert all(len(o) == 1 for o in owners)
    assert Share.parse("3/8") == Share(3, 8)
    for bad in ("8/8", "x/2", "3", "1/0"):
        with pytest.raises(ValueError):
            Share.parse(bad)


def test_the_group_reads_the_step_once_and_a_corrupt_file_fails_its_owner(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _publish(root)
    total = sum(1000 + i for i in range(FILES))
    hashed = 0
    for i in range(4):
        store = CountingStore(str(root))
        assert resolve(store, Depth.DEEP, step=300, share=Share(i, 4)).step == 300  # type: ignore[arg-type]
        hashed += store.hashed
    assert hashed == total, "the whole group hashed every byte exactly once"
    # bit rot in one file (same size: a size check cannot see it)
    victim = root / "steps" / "step-000000000300" / "rank-00007.pt"
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF
    victim.write_bytes(bytes(data))
    verdicts = [resolve(open_store(str(root)), Depth.DEEP, step=300, share=Share(i, 4)).step
                for i in range(4)]  # fmt: skip
    assert verdicts.count(None) == 1 and verdicts.count(300) == 3, verdicts
    # through the CLI the init container runs (its share from the pod's index)
    owner = next(i for i in range(4) if Share(i, 4).owns("rank-00007.pt"))
    cmd = [sys.executable, "-m", "rtj_shim.cli", "resolve", "--root", str(root), "--step", "300",
           "--deep", "--deep-share", f"{owner}/4"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out
    assert "rank-00007.pt" in out.stdout + out.stderr
    other = (owner + 1) % 4
    ok = subprocess.run([*cmd[:-1], f"{other}/4"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok
    assert json.loads(ok.stdout)["step"] == 300
