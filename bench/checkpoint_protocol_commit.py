"""bench.checkpoint_protocol, sections 3 and 4: what a publish costs beyond its copy, the
fixed commit (manifest, COMMITTED, rename, directory fsyncs) of a step whose shards are
written, and the peak memory of a child process publishing the largest shape."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.checkpoint_protocol_report import Report, Row, fmt_ms, fmt_s
from bench.checkpoint_protocol_sources import RUN_ID, Shape, rmtree
from bench.checkpoint_protocol_timing import RUN_LOG, busy_note, timed
from bench.common import REPO, KiB, MiB, fsync_path, loadavg_text, med, quiesce
from rtj_shim.checkpoint.manifest import Manifest, committed_marker, encode_manifest, utc_now
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.storage.filesystem import FilesystemStepWriter, FilesystemStore

N_FILES = 8  # tiny shards of the commit benchmark

COMMIT_MAX_MS = 5.0
RSS_MAX_MIB = 100.0


def manifest_bytes(step: int, entries: Sequence[Any]) -> tuple[bytes, bytes]:
    manifest = Manifest(
        run_id=RUN_ID,
        step=step,
        created_at=utc_now(),
        files=tuple(sorted(entries, key=lambda f: f.path)),
    )
    raw = encode_manifest(manifest)
    return raw, committed_marker(raw)


def prepared_step(proto: CommitProtocol, step: int) -> tuple[FilesystemStepWriter, bytes, bytes]:
    writer = proto.begin(step)
    assert isinstance(writer, FilesystemStepWriter)
    entries = [writer.write_file(f"shard-{i:02d}.bin", [b"x" * 64]) for i in range(N_FILES)]
    raw, marker = manifest_bytes(step, entries)
    return writer, raw, marker


def tiny_write_fsync(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"x" * 64)
        os.fsync(fd)
    finally:
        os.close(fd)


def bench_commit(report: Report, work: Path, reps: int) -> None:
    RUN_LOG.clear()
    print(f"\n[3] fixed commit cost, median of {reps} (8 tiny shards already written)")
    print(f"  load average now: {loadavg_text()}")
    store = FilesystemStore(work / "commit-store")
    proto = CommitProtocol(store, run_id=RUN_ID, attempt="0")
    proto.claim_run()
    unit_dir = work / "commit-unit"
    unit_dir.mkdir()
    tiny_src = work / "tiny-src"
    tiny_src.mkdir()
    (tiny_src / "model.bin").write_bytes(b"x" * 64)
    plain_dst = work / "tiny-plain"

    commit_t: list[float] = []
    fsync_t: list[float] = []
    publish_t: list[float] = []
    plain_t: list[float] = []
    step = 0

    def plain_publish() -> None:
        plain_dst.mkdir()
        shutil.copyfile(tiny_src / "model.bin", plain_dst / "model.bin")
        fsync_path(plain_dst / "model.bin")
        fsync_path(plain_dst, directory=True)

    for rep in range(reps):
        step += 1
        writer, raw, marker = prepared_step(proto, step)
        quiesce()
        start = time.perf_counter()
        writer.commit(raw, marker)
        commit_t.append(time.perf_counter() - start)
        fsync_t.append(timed(partial(tiny_write_fsync, unit_dir / f"u{rep}")))
        step += 1
        publish_t.append(timed(partial(proto.publish_directory, step, tiny_src)))
        rmtree(plain_dst)
        plain_t.append(timed(plain_publish))
    rmtree(plain_dst)
    report.samples.update(
        {
            "commit.commit": commit_t,
            "commit.tiny_write_fsync": fsync_t,
            "commit.publish_1file": publish_t,
            "commit.plain_1file": plain_t,
        }
    )
    busy_note(report, "commit")
    print(f"  commit        p10/p50/p90 {pct_text(commit_t)}")
    print(f"  write+fsync   p10/p50/p90 {pct_text(fsync_t)}")
    print(f"  publish tiny  p10/p50/p90 {pct_text(publish_t)}")
    print(f"  plain tiny    p10/p50/p90 {pct_text(plain_t)}")
    cand, unit = med(commit_t), med(fsync_t)
    report.add(
        Row(
            "3 commit",
            "writer.commit: manifest+COMMITTED+rename+dir fsyncs vs 1 tiny write+fsync",
            fmt_ms(cand),
            fmt_ms(unit),
            cand / unit,
            "time",
            f"< {COMMIT_MAX_MS:g} ms",
            cand * 1e3 < COMMIT_MAX_MS,
            {"candidate_s": cand, "baseline_s": unit, "reps": reps},
        )
    )
    cand, base = med(publish_t), med(plain_t)
    report.add(
        Row(
            "3 commit",
            "publish_directory of a 1-file tiny step vs mkdir+copy+fsync file+fsync dir",
            fmt_ms(cand),
            fmt_ms(base),
            cand / base,
            "time",
            "(report)",
            None,
            {"candidate_s": cand, "baseline_s": base, "reps": reps},
        )
    )


def pct_text(xs: Sequence[float]) -> str:
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    return f"{q[0] * 1e3:.2f} / {med(xs) * 1e3:.2f} / {q[8] * 1e3:.2f} ms"


# --------------------------------------------------------------------------- 4. memory

MEMORY_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from rtj_shim.checkpoint.protocol import CommitProtocol
    from rtj_shim.checkpoint.storage.filesystem import FilesystemStore

    def hwm():
        with open("/proc/self/status") as fh:
            return [int(line.split()[1]) for line in fh if line.startswith("VmHWM:")][0]

    root, source = sys.argv[1:3]
    protocol = CommitProtocol(
        FilesystemStore(Path(root)), run_id="bench-mem", attempt="0", retention=None
    )
    protocol.claim_run()
    before = hwm()
    start = time.perf_counter()
    protocol.publish_directory(1, Path(source))
    took = time.perf_counter() - start
    print(json.dumps({"hwm_before": before, "hwm_after": hwm(), "publish_s": took}))
    """
)


def bench_memory(report: Report, work: Path, shape: Shape, source: Path) -> None:
    RUN_LOG.clear()
    print(f"\n[4] peak RSS of a child process publishing {shape.text}, before vs after")
    print(f"  load average now: {loadavg_text()}")
    root = work / "mem-store"
    quiesce(shape.total + shape.total // 4 + 256 * MiB)
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(root), str(source)],
        capture_output=True,
        cwd=REPO,
        check=False,
    )
    rmtree(root)
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"memory child exited {proc.returncode}: {tail}")
    out = json.loads(proc.stdout)
    before, after = out["hwm_before"] * KiB / MiB, out["hwm_after"] * KiB / MiB
    delta = after - before
    print(
        f"  VmHWM {after:.1f} MiB after publishing vs {before:.1f} MiB before (+{delta:.1f}); "
        f"publish {fmt_s(out['publish_s'], shape.total)}"
    )
    report.samples["memory.vmhwm_mib"] = [before, after]
    report.add(
        Row(
            "4 memory",
            f"publish_directory: peak RSS growth, {shape.text}",
            f"{after:.1f} MiB (+{delta:.1f})",
            f"{before:.1f} MiB before",
            after / before,
            "RSS",
            f"< +{RSS_MAX_MIB:g} MiB",
            delta < RSS_MAX_MIB,
            {"vmhwm_mib": after, "before_mib": before, "delta_mib": delta},
        )
    )
