"""Any mix of corruptions: deep resolution returns exactly the newest intact step.

Steps are published through the real protocol into real directories, then damaged the way
disks, people and crashed writers damage them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rtj_shim.checkpoint.layout import (
    COMMITTED_FILE,
    LATEST_FILE,
    MANIFEST_FILE,
    step_dir_name,
    tmp_dir_name,
)
from rtj_shim.checkpoint.manifest import committed_marker
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.resolver import resolve
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.checkpoint.verification import Depth

CORRUPTIONS = (
    "intact",
    "missing_committed",
    "missing_manifest",
    "truncated_shard",
    "missing_shard",
    "flipped_byte",
    "edited_manifest",
    "swapped_manifest",
    "swapped_manifest_and_committed",
    "malformed_manifest",
    "escaping_path",
    "garbage_committed",
)
# Damage a shallow check cannot see (sizes are intact): only deep verification catches it.
DEEP_ONLY = {"flipped_byte"}


def publish(root: Path, step: int) -> None:
    src = root.parent / f"src-{step}"
    (src / "model").mkdir(parents=True)
    (src / "model" / "weights.bin").write_bytes(bytes([step % 251]) * (1000 + step))
    (src / "rank-0.json").write_text(json.dumps({"step": step}))
    CommitProtocol(FilesystemStore(root), run_id="run-prop").publish_directory(step, src)
    shutil.rmtree(src)


def corrupt(root: Path, step: int, how: str, other: Path) -> None:
    d = root / "steps" / step_dir_name(step)
    o = other
    weights = d / "model" / "weights.bin"
    if how == "missing_committed":
        (d / COMMITTED_FILE).unlink()
    elif how == "missing_manifest":
        (d / MANIFEST_FILE).unlink()
    elif how == "truncated_shard":
        weights.write_bytes(weights.read_bytes()[:-7])
    elif how == "missing_shard":
        weights.unlink()
    elif how == "flipped_byte":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0x01
        weights.write_bytes(bytes(data))
    elif how == "edited_manifest":
        m = json.loads((d / MANIFEST_FILE).read_text())
        m["world_size"] = 99
        (d / MANIFEST_FILE).write_text(json.dumps(m, sort_keys=True, indent=2) + "\n")
    elif how == "swapped_manifest":
        shutil.copy(o / MANIFEST_FILE, d / MANIFEST_FILE)
    elif how == "swapped_manifest_and_committed":
        shutil.copy(o / MANIFEST_FILE, d / MANIFEST_FILE)
        shutil.copy(o / COMMITTED_FILE, d / COMMITTED_FILE)
    elif how in ("malformed_manifest", "escaping_path"):
        if how == "malformed_manifest":
            raw = b'{"schema_version": 1, "step": '
        else:
            m = json.loads((d / MANIFEST_FILE).read_text())
            m["files"][0]["path"] = f"../{other.name}/model/weights.bin"
            raw = json.dumps(m).encode()
        # A COMMITTED that matches: only the manifest's own validation can refuse it.
        (d / MANIFEST_FILE).write_bytes(raw)
        (d / COMMITTED_FILE).write_bytes(committed_marker(raw))
    elif how == "garbage_committed":
        (d / COMMITTED_FILE).write_bytes(b"\x00garbage")
    else:
        assert how == "intact"


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    damage=st.lists(st.sampled_from(CORRUPTIONS), min_size=1, max_size=5),
    latest=st.sampled_from(["valid", "garbage", "missing", "points_to_oldest", "points_nowhere"]),
    leftover_tmp=st.booleans(),
)
def test_deep_resolution_returns_newest_intact_step(
    damage: list[str], latest: str, leftover_tmp: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ckpt"
        steps = [100 * (i + 1) for i in range(len(damage))]
        for step in steps:
            publish(root, step)
        donor = Path(tmp) / "donor"
        publish(donor, 7)  # another run's step: the source of swapped manifests
        for step, how in zip(steps, damage, strict=True):
            corrupt(root, step, how, other=donor / "steps" / step_dir_name(7))
        hint = root / LATEST_FILE
        if latest == "garbage":
            hint.write_bytes(b"{not json")
        elif latest == "missing":
            hint.unlink()
        elif latest == "points_to_oldest":
            hint.write_text(json.dumps({"step": steps[0]}))
        elif latest == "points_nowhere":
            hint.write_text(json.dumps({"step": 999_999}))
        if leftover_tmp:
            (root / "steps" / tmp_dir_name(steps[-1] + 50, "7") / "model").mkdir(parents=True)

        store = FilesystemStore(root)
        intact = [s for s, how in zip(steps, damage, strict=True) if how == "intact"]
        deep = resolve(store, Depth.DEEP)
        assert deep.step == (max(intact) if intact else None)
        newer_damaged = {
            s
            for s, how in zip(steps, damage, strict=True)
            if how != "intact" and (deep.step is None or s > deep.step)
        }
        skipped = {s.step for s in deep.skipped}
        assert newer_damaged <= skipped
        assert all(s.reason for s in deep.skipped)
        if leftover_tmp:
            assert steps[-1] + 50 in skipped
        if deep.step is not None:
            assert deep.uri == store.key_uri(f"steps/{step_dir_name(deep.step)}")

        shallow_ok = [
            s for s, how in zip(steps, damage, strict=True) if how == "intact" or how in DEEP_ONLY
        ]
        assert resolve(store, Depth.SHALLOW).step == (max(shallow_ok) if shallow_ok else None)
