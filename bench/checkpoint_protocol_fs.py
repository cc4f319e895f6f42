"""bench.checkpoint_protocol, sections 1 and 2 on the filesystem: ``publish_directory`` of
each shape against ``shutil.copyfile`` + fsync, and deep verification against one
``hashlib.sha256`` thread."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from bench.checkpoint_protocol_report import Report, Row, fmt_s, fmt_size
from bench.checkpoint_protocol_sources import RUN_ID, Shape, rmtree, warm
from bench.checkpoint_protocol_timing import RUN_LOG, Usage, last_usage, summarize, timed
from bench.common import MiB, fsync_path, loadavg_text, med, sha256_file
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.checkpoint.verifier import verify_step

PUBLISH_MAX_RATIO = 1.3
VERIFY_MIN_SPEEDUP = 1.7


def copyfile_fsync(files: Sequence[tuple[str, Path]], dst: Path) -> None:
    """Baseline: shutil.copyfile (sendfile in the kernel), fsync per file and directory."""
    dst.mkdir()
    for rel, src in files:
        shutil.copyfile(src, dst / rel)
        fsync_path(dst / rel)
    fsync_path(dst, directory=True)


def step_dir(store: FilesystemStore, step: int) -> Path:
    return store.root / "steps" / f"step-{step:012d}"


def cpu_text(usages: Sequence[Usage]) -> str:
    return f"cpu {med([u.user + u.sys for u in usages]):.2f} s"


def bench_fs_publish(
    report: Report, work: Path, shape: Shape, files: list[tuple[str, Path]], reps: int
) -> tuple[FilesystemStore, int]:
    """Section 1 for one shape; returns the store and the step it published last."""
    RUN_LOG.clear()
    size = shape.total
    print(f"\n[1] filesystem: publish {shape.text} vs shutil.copyfile + fsync")
    print(f"  load average now: {loadavg_text()}")
    warm([p for _, p in files])
    store = FilesystemStore(work / f"store-{shape.tag}")
    proto = CommitProtocol(store, run_id=RUN_ID, attempt="0", retention=None)
    proto.claim_run()  # run.json exists before the first timed publish, as after any first save
    dst = work / "copy-dst"
    src = files[0][1].parent
    last = 0
    times: dict[str, list[float]] = {"copyfile": [], "publish": []}
    usage: dict[str, list[Usage]] = {"copyfile": [], "publish": []}
    prefault_bytes = size + size // 4 + 256 * MiB
    for rep in range(reps):
        for name in ("copyfile", "publish") if rep % 2 == 0 else ("publish", "copyfile"):
            rmtree(dst)
            if last:
                rmtree(step_dir(store, last))
            if name == "copyfile":
                took = timed(partial(copyfile_fsync, files, dst), prefault_bytes)
            else:
                last += 1
                took = timed(partial(proto.publish_directory, last, src), prefault_bytes)
            times[name].append(took)
            usage[name].append(last_usage())
            print(f"  rep {rep + 1} {name:9s} {fmt_s(took, size)}; {last_usage()}")
    rmtree(dst)
    summarize(report, f"publish-fs.{shape.tag}", times, size)
    cand, base = med(times["publish"]), med(times["copyfile"])
    report.add(
        Row(
            "1 publish-fs",
            f"publish_directory, {shape.text} vs copyfile + fsync",
            f"{fmt_s(cand, size)}, {cpu_text(usage['publish'])}",
            f"{fmt_s(base, size)}, {cpu_text(usage['copyfile'])}",
            cand / base,
            "time",
            f"<= {PUBLISH_MAX_RATIO}x",
            cand / base <= PUBLISH_MAX_RATIO,
            {
                "candidate_s": cand,
                "baseline_s": base,
                "bytes": size,
                "reps": reps,
                "candidate_cpu_s": [u.user + u.sys for u in usage["publish"]],
                "baseline_cpu_s": [u.user + u.sys for u in usage["copyfile"]],
                "busy_key": f"publish-fs.{shape.tag}",
            },
        )
    )
    return store, last


def sha256_single(paths: Sequence[Path]) -> list[str]:
    return [sha256_file(path, MiB) for path in paths]


def bench_verify(
    report: Report, store: FilesystemStore, step: int, paths: list[Path], reps: int
) -> None:
    size = sum(p.stat().st_size for p in paths)
    RUN_LOG.clear()
    print(f"\n[2] deep verification of {fmt_size(size)} in {len(paths)} files vs one sha256 thread")
    print(f"  load average now: {loadavg_text()}")
    warm(paths)
    times: dict[str, list[float]] = {"sha256_1thread": [], "workers2": [], "workers1": []}

    def verify(workers: int) -> None:
        verdict = verify_step(store, step, Depth.DEEP, workers=workers)
        if not verdict.valid:
            raise RuntimeError(f"step {step} failed deep verification: {verdict.reason}")

    runs: dict[str, Callable[[], object]] = {
        "sha256_1thread": lambda: sha256_single(paths),
        "workers2": lambda: verify(2),
        "workers1": lambda: verify(1),
    }
    order_a = ["sha256_1thread", "workers2", "workers1"]
    for rep in range(reps):
        order = order_a if rep % 2 == 0 else order_a[::-1]
        for name in order:
            times[name].append(timed(runs[name]))
            print(f"  rep {rep + 1} {name:14s} {fmt_s(times[name][-1], size)}; {last_usage()}")
    summarize(report, "verify", times, size)
    base = med(times["sha256_1thread"])
    for name, workers in (("workers2", 2), ("workers1", 1)):
        cand = med(times[name])
        speedup = base / cand
        target = workers == 2
        report.add(
            Row(
                "2 verify",
                f"verify_step DEEP workers={workers} vs sha256, 1 thread, 1 MiB reads",
                fmt_s(cand, size),
                fmt_s(base, size),
                speedup,
                "speed-up",
                f">= {VERIFY_MIN_SPEEDUP}x" if target else "(report)",
                speedup >= VERIFY_MIN_SPEEDUP if target else None,
                {"candidate_s": cand, "baseline_s": base, "bytes": size, "reps": reps},
            )
        )
