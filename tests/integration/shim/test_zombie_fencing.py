"""A rank of an old world that wakes up after a newer attempt claimed the run (a node that
was partitioned and fenced, a process frozen by SIGSTOP) cannot publish a step: the
commit protocol re-checks run ownership right before COMMITTED (issue 12, the zombie).
Both backends: a real filesystem and the loopback S3 server."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtj_shim.checkpoint.protocol import CommitProtocol, StepMetadata
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage import open_store
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.errors import RunOwnershipConflict

RUN = "team-a.llm"


@pytest.fixture(params=["file", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'ckpt'}"
    return str(request.getfixturevalue("s3_root"))


def _shard(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_zombie_of_an_old_attempt_never_publishes(root: str, tmp_path: Path) -> None:
    old = CommitProtocol(open_store(root), run_id=RUN, attempt="1")
    old.publish_directory(100, _dir(tmp_path, "a", b"step 100"))
    # attempt 1 is writing step 200 when its node goes silent...
    writer = old.begin(200)
    entries = [writer.copy_file("model.pt", _shard(tmp_path, "zombie.pt", b"stale weights"))]
    # ...the operator fences it and starts attempt 2, which claims the run
    new = CommitProtocol(open_store(root), run_id=RUN, attempt="2")
    new.claim_run()
    # the zombie wakes up and tries to publish what it wrote
    with pytest.raises(RunOwnershipConflict, match="attempt 1 is stale"):
        old.publish(writer, entries, StepMetadata.from_env())
    assert resolve(open_store(root), Depth.DEEP).step == 100, "resolution never picks it"
    # the new world publishes that step number itself, cleanly
    new.publish_directory(200, _dir(tmp_path, "b", b"step 200 by attempt 2"))
    assert resolve(open_store(root), Depth.DEEP).step == 200


def _dir(tmp_path: Path, name: str, data: bytes) -> Path:
    d = tmp_path / f"src-{name}"
    d.mkdir()
    (d / "model.pt").write_bytes(data)
    return d
