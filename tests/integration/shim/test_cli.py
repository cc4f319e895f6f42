"""The rtj-shim CLI contract: every command, its JSON and its exit codes, as a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RTJ_SHIM = str(Path(sys.executable).with_name("rtj-shim"))


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RTJ_SHIM, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def ok_json(*args: str | Path) -> object:
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    (d / "model").mkdir(parents=True)
    (d / "model" / "w.bin").write_bytes(os.urandom(5000))
    (d / "rank-0.json").write_text("{}")
    return d


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ckpt"


def test_commit_prints_json_and_leaves_source_alone(src: Path, root: Path) -> None:
    before = sorted((p.relative_to(src), p.read_bytes()) for p in src.rglob("*") if p.is_file())
    out = ok_json("commit", "--root", root, "--step", "100", "--from", src, "--run-id", "r1")
    assert out == {
        "step": 100,
        "uri": f"file://{root}/steps/step-000000000100",
        "files": 2,
        "bytes": 5002,
    }
    after = sorted((p.relative_to(src), p.read_bytes()) for p in src.rglob("*") if p.is_file())
    assert before == after
    manifest = json.loads((root / "steps/step-000000000100/manifest.json").read_text())
    assert manifest["run_id"] == "r1" and manifest["world_size"] == 1


def test_commit_accepts_file_uri_and_world_size(src: Path, root: Path) -> None:
    ok_json("commit", "--root", f"file://{root}", "--step", "5", "--from", src, "--world-size", "4")
    manifest = json.loads((root / "steps/step-000000000005/manifest.json").read_text())
    assert manifest["world_size"] == 4


def test_commit_refusals_exit_1(src: Path, root: Path, tmp_path: Path) -> None:
    ok_json("commit", "--root", root, "--step", "100", "--from", src, "--run-id", "r1")
    again = run("commit", "--root", root, "--step", "100", "--from", src, "--run-id", "r1")
    assert again.returncode == 1 and "already published" in again.stderr
    other_run = run("commit", "--root", root, "--step", "200", "--from", src, "--run-id", "r2")
    assert other_run.returncode == 1 and "belongs to run 'r1'" in other_run.stderr
    (src / "link").symlink_to(src / "rank-0.json")
    linked = run("commit", "--root", root, "--step", "300", "--from", src)
    assert linked.returncode == 1 and "symlinks are refused" in linked.stderr
    (src / "link").unlink()
    os.mkfifo(src / "fifo")
    fifo = run("commit", "--root", root, "--step", "300", "--from", src)
    assert fifo.returncode == 1 and "not a regular file" in fifo.stderr
    (src / "fifo").unlink()
    (src / "manifest.json").write_text("{}")
    reserved = run("commit", "--root", root, "--step", "300", "--from", src)
    assert reserved.returncode == 1 and "reserved" in reserved.stderr
    missing = run("commit", "--root", root, "--step", "300", "--from", tmp_path / "nope")
    assert missing.returncode == 1 and "--from" in missing.stderr
    assert sorted(p.name for p in (root / "steps").iterdir()) == ["step-000000000100"]


def test_resolve_no_checkpoint_is_success(root: Path) -> None:
    out = ok_json("resolve", "--root", root)
    assert out == {"step": None, "uri": None, "verification": None, "skipped": []}


def test_resolve_deep_skips_corrupt_and_writes_file(src: Path, root: Path, tmp_path: Path) -> None:
    for step in ("100", "200"):
        ok_json("commit", "--root", root, "--step", step, "--from", src)
    shard = root / "steps/step-000000000200/model/w.bin"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert ok_json("resolve", "--root", root)["step"] == 200  # shallow cannot see a flipped byte
    resume = tmp_path / "run" / "resume.json"
    out = ok_json("resolve", "--root", root, "--deep", "--write", resume)
    assert out["step"] == 100 and out["verification"] == "deep"
    assert out["uri"] == f"file://{root}/steps/step-000000000100"
    assert out["skipped"][0]["step"] == 200 and "sha256" in out["skipped"][0]["reason"]
    assert json.loads(resume.read_text()) == out


def test_resolve_pinned_step(src: Path, root: Path) -> None:
    for step in ("100", "200"):
        ok_json("commit", "--root", root, "--step", step, "--from", src)
    assert ok_json("resolve", "--root", root, "--step", "100", "--deep")["step"] == 100
    (root / "steps/step-000000000200/COMMITTED").unlink()
    bad = run("resolve", "--root", root, "--step", "200", "--deep")
    assert bad.returncode == 1
    out = json.loads(bad.stdout)
    assert out["step"] is None and "COMMITTED is missing" in out["skipped"][0]["reason"]
    absent = run("resolve", "--root", root, "--step", "300")
    assert absent.returncode == 1 and "not published" in absent.stdout


def test_verify(src: Path, root: Path) -> None:
    ok_json("commit", "--root", root, "--step", "100", "--from", src)
    assert ok_json("verify", "--root", root, "--step", "100", "--deep") == {
        "step": 100,
        "valid": True,
        "reason": "deep verification passed",
    }
    (root / "steps/step-000000000100/model/w.bin").write_bytes(b"short")
    bad = run("verify", "--root", root, "--step", "100")
    assert bad.returncode == 1
    assert (
        json.loads(bad.stdout)["reason"]
        == "file 'model/w.bin' has 5 bytes, manifest.json records 5000"
    )
    assert run("verify", "--root", root, "--step", "7").returncode == 1


def test_ls_lists_states(src: Path, root: Path) -> None:
    for step in ("100", "200"):
        ok_json("commit", "--root", root, "--step", step, "--from", src)
    (root / "steps/step-000000000200/COMMITTED").unlink()
    (root / "steps/step-000000000300.tmp-4").mkdir()
    rows = ok_json("ls", "--root", root, "--json")
    assert isinstance(rows, list)
    assert [(r["step"], r["state"]) for r in rows] == [
        (300, "in progress"),
        (200, "broken"),
        (100, "published"),
    ]
    assert all(r["age_seconds"] >= 0 for r in rows)
    table = run("ls", "--root", root)
    assert table.returncode == 0
    assert "published" in table.stdout and "COMMITTED is missing" in table.stdout
    again = ok_json("ls", "--root", root, "-o", "json")
    assert isinstance(again, list) and [r["dir"] for r in again] == [r["dir"] for r in rows]


def test_every_command_prints_yaml_with_o_yaml(src: Path, root: Path) -> None:
    """`-o yaml` (issue 44): the same data as the JSON, read back by a YAML parser."""
    import yaml

    committed = run("commit", "--root", root, "--step", "100", "--from", src, "-o", "yaml")
    assert committed.returncode == 0, committed.stderr
    assert yaml.safe_load(committed.stdout)["step"] == 100
    resolved = run("resolve", "--root", root, "-o", "yaml")
    assert yaml.safe_load(resolved.stdout) == ok_json("resolve", "--root", root)
    listed = run("ls", "--root", root, "-o", "yaml")
    assert [r["step"] for r in yaml.safe_load(listed.stdout)] == [100]
    assert run("verify", "--root", root, "--step", "100", "-o", "xml").returncode == 2


def test_gc_dry_run_then_delete(src: Path, root: Path) -> None:
    for step in range(100, 700, 100):
        ok_json("commit", "--root", root, "--step", str(step), "--from", src)
    args = ("gc", "--root", root, "--keep-last", "2", "--keep-every", "300", "--protect", "100")
    plan = ok_json(*args, "--dry-run")
    assert isinstance(plan, dict) and plan["dry_run"] is True
    assert sorted(d["step"] for d in plan["delete"]) == [200, 400]
    assert len(list((root / "steps").iterdir())) == 6
    done = ok_json(*args)
    assert isinstance(done, dict) and done["delete"] == plan["delete"]
    assert sorted(p.name for p in (root / "steps").iterdir()) == [
        "step-000000000100",
        "step-000000000300",
        "step-000000000500",
        "step-000000000600",
    ]
    assert ok_json("resolve", "--root", root, "--deep")["step"] == 600


@pytest.mark.parametrize(
    "args",
    [
        ("resolve",),
        ("commit", "--root", "x", "--step", "-1", "--from", "."),
        ("commit", "--root", "x", "--step", "abc", "--from", "."),
        ("commit", "--root", "x", "--step", "1", "--from", ".", "--attempt", "../evil"),
        ("gc", "--root", "x", "--keep-last", "0"),
        ("frobnicate",),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    proc = run(*args)
    assert proc.returncode == 2, proc.stderr
    assert "usage:" in proc.stderr


def test_unreadable_store_exits_3(tmp_path: Path, src: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    for args in (
        ("resolve", "--root", not_a_dir),
        ("ls", "--root", not_a_dir),
        ("verify", "--root", not_a_dir, "--step", "1"),
        ("gc", "--root", not_a_dir, "--keep-last", "1"),
        ("commit", "--root", not_a_dir, "--step", "1", "--from", src),
        ("resolve", "--root", not_a_dir / "below"),
    ):
        proc = run(*args)
        assert proc.returncode == 3, (args, proc.stdout, proc.stderr)
        assert "store error" in proc.stderr and str(not_a_dir) in proc.stderr


@pytest.mark.parametrize(
    ("root", "message"),
    [("gs://bucket/x", "unsupported scheme 'gs'"), ("file://host/x", "must not name a host"),
     # a typo of a URI is never a relative path that holds no checkpoint (rc 0, a fresh start)
     ("s3:/bucket/x", "starts like a URI (s3:) without '//'"),
     ("s3:bucket", "starts like a URI (s3:) without '//'"),
     ("file:/ckpt", "starts like a URI (file:) without '//'")],
)  # fmt: skip
def test_unusable_root_is_a_usage_error(root: str, message: str) -> None:
    proc = run("resolve", "--root", root)
    assert proc.returncode == 2 and message in proc.stderr
    assert "--root: " in proc.stderr, "the CLI's error names its flag"


def test_resolve_termination_log_reports_result_and_errors(
    src: Path, root: Path, tmp_path: Path
) -> None:
    ok_json("commit", "--root", root, "--step", "100", "--from", src)
    log = tmp_path / "termination-log"
    out = ok_json("resolve", "--root", root, "--step", "100", "--deep", "--termination-log", log)
    assert json.loads(log.read_text()) == out
    (root / "steps/step-000000000100/COMMITTED").unlink()
    bad = run("resolve", "--root", root, "--step", "100", "--termination-log", log)
    assert bad.returncode == 1
    assert "COMMITTED is missing" in json.loads(log.read_text())["skipped"][0]["reason"]
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    broken = run("resolve", "--root", not_a_dir, "--termination-log", log)
    assert broken.returncode == 3
    assert "not a directory" in json.loads(log.read_text())["error"]
