"""bench.fast_tier, section 2's restore from a buddy: the fast tier's peer replica (issue 16).

Three pods of one job, on loopback: the *source* (this process's trainer, whose fast tier
the stalls of section 1 wrote), a *holder* keeping a copy of the source's newest fast step in
its own fast-tier volume (``<fast dir>/peer/rank-NNNNN/...``), and the source's pod
*replaced* on another node, whose sidecar copies the step back into its empty fast tier
(``peer_pull.fetch_back``, as ``ProgressServer`` does before it hands the run order on)
before its trainer restores from there exactly as from its own fast tier.

The source's and the holder's progress sidecars are real ones, each its own process
(``rtj-shim progress-server --fast-tier-dir``, with the job's control key and uid in its
environment, as in a pod), serving ``GET /fast-tier/...`` on 127.0.0.1. The copies run in
this process, as the holder's and the replaced pod's sidecars run them:

- the holder's replication of one step: ``ReplicaPuller.pull_once`` against the source's
  sidecar (the holdings, then each rank's manifest and shards streamed into a new step
  directory under the commit protocol, hashed as written, then its retention), into a
  replica emptied before each copy;
- the copy-back: ``fetch_back`` from the holder's sidecar into a new, empty fast tier.

All of it in tmpfs beside the fast tier (pod memory); removed afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rtj_shim.agent.progress_cli import ENV_CONTROL_KEY, ENV_JOB_UID
from rtj_shim.fast import fast_tier
from rtj_shim.fast.peer_pull import PeerClient, ReplicaPuller, copy_step, fetch_back
from rtj_shim.fast.peer_replica import PEER_DIR, SOURCE_FILE, Assignment
from rtj_shim.wire.control import job_key, write_json

JOB_UID = "bench-fast-tier-buddy"
KEY = job_key(b"bench.fast_tier", JOB_UID)
SOURCE_INDEX = 0
START_TIMEOUT_S = 30.0


@contextlib.contextmanager
def sidecar(pod: Path, fast_dir: Path) -> Iterator[str]:
    """A pod's progress sidecar in its own process, serving ``fast_dir`` on 127.0.0.1 (any
    free port); yields its address, ``HOST:PORT``. SIGTERM when done."""
    progress = pod / "progress"
    progress.mkdir(parents=True, exist_ok=True)
    fast_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, ENV_CONTROL_KEY: KEY, ENV_JOB_UID: JOB_UID}
    env.pop(fast_tier.ENV_KEEP, None)
    argv = [sys.executable, "-m", "rtj_shim.cli", "progress-server", "--dir", str(progress),
            "--host", "127.0.0.1", "--port", "0", "--fast-tier-dir", str(fast_dir)]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # {"listening": {"host": ..., "port": ...}, ...}
        if not line:
            raise RuntimeError(f"sidecar for {fast_dir} exited with {proc.wait(10)}")
        port = int(json.loads(line)["listening"]["port"])
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@dataclass
class Buddy:
    """The source's and the holder's sidecars and the directories of the copies."""

    source: str  # the source pod's sidecar: its own fast tier (the trainer's)
    holder: str  # the holder pod's sidecar: its replica of the source's steps
    step: int  # the fast step held and copied
    puller: ReplicaPuller  # the holder's side, timed into a replica of its own
    pull_dir: Path
    replaced_dir: Path  # the replaced pods' fast tiers, one per copy-back
    last_bytes: int = 0  # what the last copy-back moved

    def replicate(self) -> None:
        """The holder's copy of the source's newest step into an empty replica (its
        retention included, as ``pull_once`` does it)."""
        got = self.puller.pull_once()
        if got != self.step:
            raise RuntimeError(f"replication: copied step {got}, expected {self.step}")

    def reset_replica(self) -> None:
        """Untimed: empty the replica the next ``replicate`` copies into (its source.json
        stays, so the puller keeps its assignment)."""
        for rank in fast_tier.ranks(self.pull_dir / PEER_DIR):
            shutil.rmtree(fast_tier.rank_dir(self.pull_dir / PEER_DIR, rank))

    def new_tier(self, n: int) -> Path:
        """A replaced pod's empty fast tier."""
        path = self.replaced_dir / f"pod-{n}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def copy_back(self, dest: Path) -> None:
        """``fetch_back`` of the step from the holder into ``dest`` (``last_bytes``: the
        bytes it copied)."""
        report = fetch_back(dest, self.holder, KEY, self.step)
        if not report.get("ok"):
            raise RuntimeError(f"copy-back: {report.get('error')}")
        self.last_bytes = int(report["bytes"])


@contextlib.contextmanager
def buddy(fast_root: Path, step: int) -> Iterator[Buddy]:
    """The source's sidecar serving ``fast_root``, a holder's sidecar whose replica holds
    ``step`` (copied once from the source with ``copy_step``, untimed), and a holder's
    puller assigned to the source; everything under ``<fast_root>-buddy``, removed after."""
    base = fast_root.parent / f"{fast_root.name}-buddy"
    shutil.rmtree(base, ignore_errors=True)
    try:
        with contextlib.ExitStack() as stack:
            source = stack.enter_context(sidecar(base / "source", fast_root))
            holder_fast = base / "holder" / "fast"
            client = PeerClient(source, KEY)
            for rank in fast_tier.ranks(fast_root):
                replica = fast_tier.rank_store(holder_fast / PEER_DIR, rank)
                copy_step(client, "own", rank, step, replica)
            holder = stack.enter_context(sidecar(base / "holder", holder_fast))
            pull_dir = base / "puller" / "fast"
            (pull_dir / PEER_DIR).mkdir(parents=True)
            assignment = Assignment(JOB_UID, source, SOURCE_INDEX)
            write_json(pull_dir / PEER_DIR / SOURCE_FILE, assignment.to_json())
            puller = ReplicaPuller(pull_dir, KEY)  # takes its assignment up; no thread
            yield Buddy(source, holder, step, puller, pull_dir, base / "replaced")
    finally:
        shutil.rmtree(base, ignore_errors=True)
