"""Retention after every publish, on a filesystem root and on the loopback S3 server.

The policy comes from the environment the operator renders into the trainer container
(``RTJ_KEEP_LAST``, ``RTJ_KEEP_EVERY``, ``RTJ_PROTECT_STEP``); without it every step is
kept. Deletion unpublishes first (``COMMITTED``), and a deletion that fails or is cut short
never fails the save and never leaves a step that resolves.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rtj_operator.api import ResilientTrainingJob
from rtj_operator.policy.render import render_jobset
from rtj_shim.checkpoint.layout import COMMITTED_FILE, MANIFEST_FILE, StepDirName, step_key
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.resolver import describe_steps, resolve
from rtj_shim.checkpoint.retention import RetentionPolicy
from rtj_shim.checkpoint.storage import CheckpointStore, open_store
from rtj_shim.checkpoint.verification import Depth

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

RTJ_SHIM = str(Path(sys.executable).with_name("rtj-shim"))
RUN = "run-retention"


@pytest.fixture(params=["filesystem", pytest.param("s3", marks=pytest.mark.s3)])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return str(request.getfixturevalue("s3_root"))
    return f"file://{tmp_path / 'ckpt'}"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("RTJ_")]:
        monkeypatch.delenv(name)


def source(tmp_path: Path, step: int) -> Path:
    rng = random.Random(step)
    d = tmp_path / f"src-{step}"
    (d / "model").mkdir(parents=True)
    (d / "model" / "rank-0.bin").write_bytes(rng.randbytes(3000 + step))
    (d / "state.json").write_text(json.dumps({"step": step}))
    return d


def published(store: CheckpointStore) -> list[int]:
    """Every step directory left, oldest first; each one must be whole and published."""
    listings = describe_steps(store)
    assert all(s.label == "published" for s in listings), [
        (s.entry.name, s.label) for s in listings
    ]
    return sorted(s.entry.name.step for s in listings)


# -- the policy from the environment, through CommitProtocol ---------------------------------


def test_every_publish_applies_the_retention_in_the_environment(
    root: str, tmp_path: Path, clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RTJ_KEEP_LAST", "2")
    monkeypatch.setenv("RTJ_KEEP_EVERY", "50")
    monkeypatch.setenv("RTJ_PROTECT_STEP", "30")
    store = open_store(root)
    protocol = CommitProtocol(store, run_id=RUN, attempt="1")
    assert protocol.retention == RetentionPolicy(2, 50, frozenset({30}))
    done: list[int] = []
    for step in range(10, 130, 10):
        result = protocol.publish_directory(step, source(tmp_path, step))
        done.append(step)
        # the newest two, every 50th (milestones) and the protected step the attempt resumed from
        want = [s for s in done if s in done[-2:] or s % 50 == 0 or s == 30]
        assert published(store) == want, f"after step {step}"
        assert result.retention is not None and result.retention.failed == ()
    assert published(store) == [30, 50, 100, 110, 120]
    assert resolve(store, Depth.DEEP).step == 120


def test_without_retention_in_the_environment_every_step_is_kept(
    root: str, tmp_path: Path, clean_env: None
) -> None:
    store = open_store(root)
    protocol = CommitProtocol(store, run_id=RUN, attempt="1")
    assert protocol.retention is None
    for step in range(1, 7):
        assert protocol.publish_directory(step, source(tmp_path, step)).retention is None
    assert published(store) == [1, 2, 3, 4, 5, 6]


def test_an_abandoned_in_progress_step_older_than_the_newest_is_removed(
    root: str, tmp_path: Path, clean_env: None
) -> None:
    store = open_store(root)
    protocol = CommitProtocol(store, run_id=RUN, attempt="1", retention=RetentionPolicy(1))
    protocol.publish_directory(10, source(tmp_path, 10))
    crashed = protocol.begin(15)  # a writer that died before COMMITTED
    crashed.write_file("model/rank-0.bin", [b"half a shard"])
    crashed.close()
    assert 15 in [d.name.step for d in store.list_step_dirs()]
    result = protocol.publish_directory(20, source(tmp_path, 20))
    assert result.retention is not None
    assert [name.step for name in result.retention.deleted] == [15]
    assert published(store) == [10, 20]  # 10: the verified step before the newest


def test_the_environment_the_operator_renders_keeps_the_documented_steps(
    root: str, tmp_path: Path, clean_env: None
) -> None:
    rtj = ResilientTrainingJob.from_object(job_body(root, retention={"keepLast": 2}))
    # Attempt 1 published 10, 20, 30 and failed; the operator pins 30 for attempt 2.
    first = CommitProtocol(open_store(root), run_id=rtj.run_id, attempt="1", retention=None)
    for step in (10, 20, 30):
        first.publish_directory(step, source(tmp_path, step))
    env = trainer_env(render_jobset(rtj, 2, 30))
    assert {k: env[k] for k in ("RTJ_KEEP_LAST", "RTJ_PROTECT_STEP", "RTJ_ATTEMPT")} == {
        "RTJ_KEEP_LAST": "2",
        "RTJ_PROTECT_STEP": "30",
        "RTJ_ATTEMPT": "2",
    }
    assert "RTJ_KEEP_EVERY" not in env
    out: dict[str, Any] = {}
    for step in range(40, 140, 10):
        out = commit(env, step, source(tmp_path, step))
    # The newest two (the newest and the one before it) and the step attempt 2 resumed from.
    store = open_store(env["RTJ_CHECKPOINT_URI"])
    assert published(store) == [30, 120, 130]
    assert out["retention"] == {"deleted": [110], "failed": []}
    assert resolve(store, Depth.DEEP).step == 130


# -- deletion order and failures ------------------------------------------------------------


@pytest.mark.s3
def test_a_denied_deletion_is_logged_and_the_save_stands(
    s3_root: str,
    s3_admin: S3Client,
    tmp_path: Path,
    clean_env: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bucket = s3_root[len("s3://") :].split("/", 1)[0]
    deny = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:DeleteObject",
                "Resource": f"arn:aws:s3:::{bucket}/*",
            }
        ],
    }
    s3_admin.put_bucket_policy(Bucket=bucket, Policy=json.dumps(deny))
    store = open_store(s3_root)
    protocol = CommitProtocol(store, run_id=RUN, attempt="1", retention=RetentionPolicy(1))
    with caplog.at_level(logging.WARNING, logger="rtj_shim"):
        for step in (10, 20, 30):
            result = protocol.publish_directory(step, source(tmp_path, step))
    assert result.step == 30 and result.retention is not None
    assert [(name.step, "access denied" in why) for name, why in result.retention.failed] == [
        (10, True)
    ]
    assert "could not delete step-000000000010" in caplog.text
    assert published(store) == [10, 20, 30]  # COMMITTED was refused first: 10 is whole
    assert resolve(store, Depth.DEEP, step=10).step == 10

    s3_admin.delete_bucket_policy(Bucket=bucket)
    protocol.publish_directory(40, source(tmp_path, 40))
    assert published(store) == [30, 40]


def test_an_interrupted_filesystem_deletion_leaves_no_resolvable_step(
    tmp_path: Path, clean_env: None
) -> None:
    root = tmp_path / "ckpt"
    store = open_store(str(root))
    protocol = CommitProtocol(store, run_id=RUN, attempt="1", retention=None)
    for step in (10, 20):
        protocol.publish_directory(step, source(tmp_path, step))
    # A process killed right after it unpublished step 10, before removing anything else.
    child = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from rtj_shim.checkpoint.layout import StepDirName\n"
        "from rtj_shim.checkpoint.storage import filesystem as fs\n"
        "fs.shutil.rmtree = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "fs.FilesystemStore(Path(sys.argv[1])).delete_step_dir(StepDirName(10))\n"
    )
    proc = subprocess.run([sys.executable, "-c", child, str(root)], timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL
    step_dir = root / step_key(10)
    assert (step_dir / MANIFEST_FILE).exists() and not (step_dir / COMMITTED_FILE).exists()
    pinned = resolve(store, Depth.DEEP, step=10)
    assert pinned.step is None and "COMMITTED is missing" in pinned.skipped[0].reason
    assert resolve(store, Depth.DEEP).step == 20

    # The next publish's retention removes what the interrupted deletion left.
    protocol.retention = RetentionPolicy(2)
    result = protocol.publish_directory(30, source(tmp_path, 30))
    assert result.retention is not None
    assert result.retention.deleted == (StepDirName(10),)
    assert published(store) == [20, 30]


# -- helpers --------------------------------------------------------------------------------


def job_body(uri: str, **checkpoint: Any) -> dict[str, Any]:
    """A ResilientTrainingJob as `kubectl apply` would send it."""
    return {
        "apiVersion": "training.resilient.dev/v1alpha1",
        "kind": "ResilientTrainingJob",
        "metadata": {"name": "llm", "namespace": "team-a", "uid": "uid-1", "generation": 1},
        "spec": {
            "replicas": 2,
            "queueName": "team-a",
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "registry.example/llm@sha256:" + "a" * 64,
                            "command": ["torchrun", "train.py"],
                        }
                    ]
                }
            },
            "checkpoint": {"uri": uri, **checkpoint},
        },
    }


def trainer_env(jobset: dict[str, Any]) -> dict[str, str]:
    """The literal environment of the rendered trainer container (fieldRefs left out)."""
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
    return {e["name"]: e["value"] for e in trainer["env"] if "value" in e}


def commit(env: dict[str, str], step: int, src: Path) -> dict[str, Any]:
    """`rtj-shim commit` as the trainer container would run it, with the rendered env."""
    proc = subprocess.run(
        [RTJ_SHIM, "commit", "--root", env["RTJ_CHECKPOINT_URI"], "--step", str(step),
         "--from", str(src)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert isinstance(body, dict)
    return body
