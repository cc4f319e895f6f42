"""Crash consistency of the filesystem commit protocol under SIGKILL at every protocol point.

A child process (``crash_publisher.py``, run by file path with this interpreter) publishes
step 200 into a root that already holds an intact step 100 (or into a fresh root). It
stops at a named point of the protocol (before or after each store call, or after an exact
byte offset inside a shard) and the test SIGKILLs it there. Afterwards deep resolution must
return step 100 (no step for a fresh root) when the kill came before the atomic rename and
step 200 when it came after; in-progress leftovers newer than the chosen step are reported
as skipped; and publishing step 200 again succeeds, or is refused with StepAlreadyPublished
when the child had already published it.

SIGKILL is not power loss: the kernel keeps the dead process's page cache, so every byte
the child wrote reaches the files whether or not it was fsynced. These tests prove the
*ordering* of the protocol (nothing becomes visible before it is complete, and a crash at
any point leaves a root that resolves and accepts the next publish); they do not prove that
the fsync calls are sufficient for durability across a power cut.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

import rtj_shim
from rtj_shim.checkpoint.layout import LATEST_FILE, RUN_FILE, STEPS_DIR, step_dir_name, tmp_dir_name
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.checkpoint.verifier import verify_step
from rtj_shim.errors import StepAlreadyPublished

PUBLISHER = Path(__file__).resolve().parent / "crash_publisher.py"
PREV_STEP = 100
STEP = 200
CHILD_ATTEMPT = "1"
REACH_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 15.0


def _load_publisher() -> ModuleType:
    """Import the helper by path (tests/ has no packages), without running its main()."""
    spec = importlib.util.spec_from_file_location("rtj_crash_publisher", PUBLISHER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cp = _load_publisher()
SHARD_SIZES = [size for _path, size in cp.SHARDS]


@dataclass(frozen=True)
class Case:
    """Where the child dies and what the root must look like afterwards."""

    point: str
    id: str
    fresh_root: bool = False
    published: bool = False  # the rename completed: step 200 is published
    tmp_left: bool = False  # steps/step-200.tmp-1 is left behind
    run_attempt: str | None = CHILD_ATTEMPT  # writer_attempt in run.json (None: absent)
    hint: int | None = PREV_STEP  # the step latest.json names (None: absent)
    leftovers: frozenset[str] = field(default_factory=frozenset)  # '.<key>' temp files in root
    retry_attempt: str = "2"
    shard: tuple[int, int] | None = None  # (index, offset) for a kill inside a shard


def _shard_cases() -> list[Case]:
    """Kills inside shard writes at offsets drawn from a seeded generator (reproducible ids)."""
    rng = random.Random(0x5EED)  # reproducible offsets: the ids name them
    picks = [
        (0, rng.randrange(1, SHARD_SIZES[0])),
        (0, rng.randrange(1, SHARD_SIZES[0])),
        (1, 0),  # file created, nothing written yet
        (1, rng.randrange(1, SHARD_SIZES[1])),
        (2, rng.randrange(1, SHARD_SIZES[2])),
    ]
    cases = []
    for n, (index, offset) in enumerate(sorted(set(picks))):
        path = cp.SHARDS[index][0]
        cases.append(
            Case(
                f"write:{path}:at:{offset}",
                f"shard-{index + 1}of{len(cp.SHARDS)}-at-{offset}",
                tmp_left=True,
                retry_attempt=CHILD_ATTEMPT if n % 2 else "2",
                shard=(index, offset),
            )
        )
    return cases


RUN_TMP = frozenset({".run.json"})
LATEST_TMP = frozenset({".latest.json"})

# Root with an intact step 100 (run.json written by attempt 0); the child is attempt 1, so
# it also moves run.json on. In protocol order.
EXISTING_ROOT_CASES = [
    Case("replace:run.json:before", "run-json-tmp-written", run_attempt="0", leftovers=RUN_TMP),
    Case("replace:run.json:after", "run-json-replaced"),
    Case("begin_step:after", "after-begin", tmp_left=True, retry_attempt=CHILD_ATTEMPT),
    *_shard_cases(),
    Case("shards:done", "after-all-shards", tmp_left=True),
    Case("write:manifest.json:after", "manifest-written", tmp_left=True),
    Case("write:COMMITTED:after", "committed-written", tmp_left=True, retry_attempt=CHILD_ATTEMPT),
    Case("rename:before", "before-rename", tmp_left=True),
    Case("rename:after", "after-rename-before-dir-fsync", published=True),
    Case("commit:after", "after-rename-before-latest", published=True),
    Case("replace:latest.json:before", "latest-tmp-written", published=True, leftovers=LATEST_TMP),
    Case("replace:latest.json:after", "latest-replaced", published=True, hint=STEP),
    Case("publish:done", "after-publish", published=True, hint=STEP),
]

# Fresh root: the child creates run.json, steps/ and latest.json itself.
FRESH_ROOT_CASES = [
    Case(
        "link:run.json:before",
        "fresh-run-json-tmp-written",
        run_attempt=None,
        hint=None,
        leftovers=RUN_TMP,
    ),
    Case("link:run.json:after", "fresh-run-json-linked", hint=None, leftovers=RUN_TMP),
    Case("fsync_dir:.:after", "fresh-run-json-dir-synced", hint=None),
    Case("begin_step:after", "fresh-after-begin", hint=None, tmp_left=True),
    Case("rename:after", "fresh-after-rename", published=True, hint=None),
    Case(
        "link:latest.json:before",
        "fresh-latest-tmp-written",
        published=True,
        hint=None,
        leftovers=LATEST_TMP,
    ),
]
FRESH_ROOT_CASES = [dataclasses.replace(case, fresh_root=True) for case in FRESH_ROOT_CASES]
CASES = EXISTING_ROOT_CASES + FRESH_ROOT_CASES


# --- helpers -------------------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    """The child imports the same rtj_shim as this process."""
    env = dict(os.environ)
    package_root = str(Path(rtj_shim.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def _child_cmd(root: Path, workdir: Path, stop: str | None) -> list[str]:
    cmd = [sys.executable, str(PUBLISHER), "--root", str(root), "--step", str(STEP)]
    cmd += ["--attempt", CHILD_ATTEMPT, "--trace", str(workdir / "trace")]
    if stop is not None:
        cmd += ["--stop", stop, "--reached", str(workdir / "reached")]
    return cmd


def _describe_child(workdir: Path) -> str:
    log = workdir / "child.log"
    trace = workdir / "trace"
    tail = trace.read_text().splitlines()[-5:] if trace.exists() else []
    return f"last points: {tail}\noutput:\n{log.read_text() if log.exists() else ''}"


def kill_child_at(point: str, root: Path, workdir: Path) -> None:
    """Run the child until it reports ``point``, then SIGKILL it. Never waits unbounded."""
    reached = workdir / "reached"
    with (workdir / "child.log").open("wb") as log:
        proc = subprocess.Popen(
            _child_cmd(root, workdir, point), stdout=log, stderr=subprocess.STDOUT, env=_child_env()
        )
        try:
            deadline = time.monotonic() + REACH_TIMEOUT_S
            while not reached.exists():
                if proc.poll() is not None:
                    pytest.fail(
                        f"child exited with {proc.returncode} before reaching {point!r}\n"
                        + _describe_child(workdir)
                    )
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"child did not reach {point!r} within {REACH_TIMEOUT_S}s\n"
                        + _describe_child(workdir)
                    )
                time.sleep(0.005)
            name, pid = reached.read_text().split()
            assert (name, int(pid)) == (point, proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=EXIT_TIMEOUT_S) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=EXIT_TIMEOUT_S)


def _step_dirs(root: Path) -> set[str]:
    steps = root / STEPS_DIR
    return {p.name for p in steps.iterdir()} if steps.is_dir() else set()


def _temp_leftovers(root: Path) -> frozenset[str]:
    """put_if temp files left in the root, by the key they were for ('.latest.json')."""
    if not root.is_dir():
        return frozenset()
    return frozenset(p.name.split(".tmp-")[0] for p in root.glob(".*.tmp-*"))


def _json_field(root: Path, key: str, name: str) -> object:
    path = root / key
    return json.loads(path.read_bytes())[name] if path.exists() else None


def _assert_published_content(root: Path, step: int) -> None:
    base = root / STEPS_DIR / step_dir_name(step)
    for index, (path, _size) in enumerate(cp.SHARDS):
        assert (base / path).read_bytes() == cp.shard_bytes(step, index), path


def _seed_previous_step(store: FilesystemStore) -> None:
    cp.publish_step(CommitProtocol(store, run_id=cp.RUN_ID, attempt="0"), PREV_STEP)
    assert resolve(store, Depth.DEEP).step == PREV_STEP


# --- tests ---------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fresh_root", [False, True], ids=["existing-root", "fresh-root"])
def test_child_passes_every_point_in_protocol_order(tmp_path: Path, fresh_root: bool) -> None:
    """Without a kill the child publishes, and passes the points below in this order."""
    root = tmp_path / "root"
    store = FilesystemStore(root)
    if not fresh_root:
        _seed_previous_step(store)
    with (tmp_path / "child.log").open("wb") as log:
        proc = subprocess.run(
            _child_cmd(root, tmp_path, None),
            check=False,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_child_env(),
            timeout=60,
        )
    assert proc.returncode == 0, _describe_child(tmp_path)
    trace = (tmp_path / "trace").read_text().splitlines()
    cases = FRESH_ROOT_CASES if fresh_root else EXISTING_ROOT_CASES
    expected = [c.point for c in cases if c.shard is None]
    missing = [p for p in expected if p not in trace]
    assert not missing, f"points never reached: {missing}\ntrace: {trace}"
    positions = [trace.index(p) for p in expected]
    assert positions == sorted(positions), f"out of protocol order: {trace}"
    # The design's order: shards, manifest, COMMITTED, rename, steps/ fsync, then the hint.
    order = [
        "begin_step:after",
        "shards:done",
        "write:manifest.json:after",
        "write:COMMITTED:before",
        "fsync_dir:" + f"{STEPS_DIR}/{tmp_dir_name(STEP, CHILD_ATTEMPT)}:after#2",
        "rename:before",
        "rename:after",
        "fsync_dir:steps:after#2",
        f"{'link' if fresh_root else 'replace'}:{LATEST_FILE}:before",
        "publish:done",
    ]
    positions = [trace.index(p) for p in order]
    assert positions == sorted(positions), f"out of protocol order: {trace}"
    assert resolve(store, Depth.DEEP).step == STEP


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_sigkill_at_protocol_point(tmp_path: Path, case: Case) -> None:
    root = tmp_path / "root"
    store = FilesystemStore(root)
    if not case.fresh_root:
        _seed_previous_step(store)

    kill_child_at(case.point, root, tmp_path)

    # Where the kill landed, as the files show it.
    tmp_name = tmp_dir_name(STEP, CHILD_ATTEMPT)
    expected_dirs = set() if case.fresh_root else {step_dir_name(PREV_STEP)}
    if case.published:
        expected_dirs.add(step_dir_name(STEP))
    if case.tmp_left:
        expected_dirs.add(tmp_name)
    assert _step_dirs(root) == expected_dirs
    assert _json_field(root, RUN_FILE, "writer_attempt") == case.run_attempt
    assert _json_field(root, LATEST_FILE, "step") == case.hint
    assert _temp_leftovers(root) == case.leftovers
    if case.shard is not None:
        index, offset = case.shard
        tmp = root / STEPS_DIR / tmp_name
        sizes = {p: (tmp / p).stat().st_size for p, _ in cp.SHARDS if (tmp / p).exists()}
        expected_sizes = {p: s for p, s in cp.SHARDS[:index]}
        expected_sizes[cp.SHARDS[index][0]] = offset
        assert sizes == expected_sizes

    # Resolution after the crash: the previous intact step, or the new one once renamed.
    if not case.fresh_root:
        assert verify_step(store, PREV_STEP, Depth.DEEP).valid
    expected_step = STEP if case.published else (None if case.fresh_root else PREV_STEP)
    after_crash = resolve(store, Depth.DEEP)
    assert after_crash.step == expected_step, after_crash
    assert after_crash.verification is (Depth.DEEP if expected_step is not None else None)
    if case.tmp_left:
        (skipped,) = after_crash.skipped
        assert skipped.step == STEP
        assert "in progress" in skipped.reason and tmp_name in skipped.reason, skipped.reason
    else:
        assert after_crash.skipped == ()
    if case.published:
        _assert_published_content(root, STEP)

    # The next publish of the same step: refused once published, otherwise it succeeds.
    retry = CommitProtocol(store, run_id=cp.RUN_ID, attempt=case.retry_attempt)
    if case.published:
        with pytest.raises(StepAlreadyPublished):
            cp.publish_step(retry, STEP)
    else:
        result = cp.publish_step(retry, STEP)
        assert result.step == STEP
        assert _json_field(root, LATEST_FILE, "step") == STEP
    final = resolve(store, Depth.DEEP)
    assert final.step == STEP, final
    assert final.verification is Depth.DEEP
    assert final.skipped == ()
    if final.step == _json_field(root, LATEST_FILE, "step"):
        assert final.hint_problem is None
    _assert_published_content(root, STEP)
    assert _json_field(root, RUN_FILE, "writer_attempt") == case.retry_attempt
    # A retry by the same attempt reuses (and so removes) its old in-progress directory.
    stale_tmp = case.tmp_left and case.retry_attempt != CHILD_ATTEMPT
    assert (tmp_name in _step_dirs(root)) is stale_tmp
