"""What the checkpoint protocol costs, measured against a plain durable copy of the same bytes.

Everything runs side by side in one process, on the same bytes, in a temporary directory
under ``<repo>/.bench/`` (the repository's filesystem, git-ignored), removed afterwards:

1. publish: ``CommitProtocol.publish_directory`` (hash + fsync + manifest + rename) of N
   bytes in 8 files, against (a) a userspace read/write loop with the same chunk size and
   (b) ``shutil.copyfile`` (sendfile), each followed by an fsync per file; target <= 1.3x.
2. deep verification: ``verify_step(..., Depth.DEEP, workers=2)`` (and workers=1) against
   single-threaded ``hashlib.sha256`` over the same 8 files; target >= 1.7x with 2 workers.
3. fixed commit cost: ``StepWriter.commit`` (manifest + COMMITTED + rename + directory
   fsyncs) of a step whose 8 tiny shards are already written; target < 5 ms (median).
   Also: the whole publish of a 1-file tiny step.
4. peak memory: a child process publishing one large file (4 GiB) against a child that
   only does the imports; target < 100 MiB above the interpreter's.

Each line prints absolute numbers, the ratio to its baseline, the target and PASS/MISS. A
miss never fails the run; only an error exits non-zero.

    python -m bench.checkpoint_protocol [--size-gib 1.0] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import json
import os
import platform
import queue
import resource
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from rtj_shim.manifest import FileEntry, Manifest, committed_marker, encode_manifest, utc_now
from rtj_shim.protocol import CommitProtocol, PublishResult, StepMetadata, collect_directory
from rtj_shim.storage.base import CHUNK_BYTES
from rtj_shim.storage.filesystem import FilesystemStepWriter, FilesystemStore
from rtj_shim.verification import Depth
from rtj_shim.verifier import verify_step

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
N_FILES = 8
RUN_ID = "bench-run"
SOURCE_BLOCK = 64 * MiB  # random bytes written once and repeated to build large sources

# Targets (from the issue).
PUBLISH_MAX_RATIO = 1.3
VERIFY_MIN_SPEEDUP = 1.7
COMMIT_MAX_MS = 5.0
RSS_MAX_MIB = 100.0
BUSY_CPUS = 0.5  # other load (in CPUs) above which a section gets a "machine was busy" note


# --------------------------------------------------------------------------- results


@dataclass
class Row:
    section: str
    check: str
    candidate: str
    baseline: str
    ratio: float | None
    ratio_means: str  # "time" (candidate/baseline, lower is better), "speed-up", "RSS"
    target: str
    passed: bool | None  # None: reported only, no target
    values: dict[str, Any] = field(default_factory=dict)
    prototype: bool = False  # a proposed change measured in this file, not the package

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "MISS", None: "info"}[self.passed]


@dataclass
class Report:
    context: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    busy: set[str] = field(default_factory=set)  # sections timed while the machine was busy

    def result(self, row: Row) -> str:
        busy = row.passed is not None and row.section.split()[-1] in self.busy
        return row.verdict + ("*" if busy else "")

    def add(self, row: Row) -> None:
        self.rows.append(row)
        ratio = f"{row.ratio:.2f}x {row.ratio_means}" if row.ratio is not None else "-"
        print(f"  -> {row.check}: {row.candidate} vs {row.baseline}: {ratio}; {row.verdict}")

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}")


def loadavg_text() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def fmt_s(seconds: float, nbytes: int | None = None) -> str:
    text = f"{seconds:.3f} s"
    if nbytes:
        text += f" ({nbytes / GiB / seconds:.2f} GiB/s)"
    return text


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def fmt_size(nbytes: int) -> str:
    return f"{nbytes / GiB:g} GiB" if nbytes >= GiB else f"{nbytes / MiB:g} MiB"


# --------------------------------------------------------------------------- context


def mount_of(path: Path) -> dict[str, str]:
    best = {"mount": "?", "device": "?", "fstype": "?", "options": "?"}
    resolved = str(path.resolve())
    longest = -1
    with open("/proc/mounts") as fh:
        for line in fh:
            device, mount, fstype, options = line.split()[:4]
            mount = mount.replace("\\040", " ")
            inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > longest:
                longest = len(mount)
                best = {"mount": mount, "device": device, "fstype": fstype, "options": options}
    return best


def cpu_model() -> tuple[str, bool]:
    model, sha_ni = "?", False
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags") and " sha_ni" in line:
                    sha_ni = True
    except OSError:
        pass
    return model, sha_ni


def mem_total_gib() -> float:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * KiB / GiB
    return 0.0


def machine_context(tmp: Path) -> dict[str, Any]:
    model, sha_ni = cpu_model()
    usage = shutil.disk_usage(tmp)
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "sha_ni": sha_ni,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "openssl": ssl.OPENSSL_VERSION,
        "kernel": platform.release(),
        "mem_total_gib": round(mem_total_gib(), 1),
        "tmp_dir": str(tmp),
        "filesystem": mount_of(tmp),
        "disk_free_gib": round(usage.free / GiB, 1),
        "loadavg_start": os.getloadavg(),
        "chunk_bytes": CHUNK_BYTES,
    }


def print_context(ctx: dict[str, Any]) -> None:
    fs = ctx["filesystem"]
    print("Machine")
    print(f"  cpus: {ctx['cpu_count']} ({ctx['cpus_usable']} usable), {ctx['cpu_model']}, ", end="")
    print(f"sha_ni={'yes' if ctx['sha_ni'] else 'no'}; memory {ctx['mem_total_gib']} GiB")
    print(f"  python: {ctx['python']} ({sys.executable}); {ctx['openssl']}; linux {ctx['kernel']}")
    print(f"  temp dir: {ctx['tmp_dir']}")
    print(f"  filesystem: {fs['fstype']} on {fs['device']} at {fs['mount']} ({fs['options']})")
    print(f"  disk free: {ctx['disk_free_gib']} GiB; load average at start: ", end="")
    print(" ".join(f"{x:.2f}" for x in ctx["loadavg_start"]))
    print(f"  shim chunk size (CHUNK_BYTES): {ctx['chunk_bytes'] // MiB} MiB")


# --------------------------------------------------------------------------- helpers


def fsync_path(path: Path, directory: bool = False) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prefault(nbytes: int) -> None:
    """Touch and free ``nbytes`` of anonymous memory right before a timed run.

    On a VM with free page reporting (virtio-balloon), memory freed a few seconds ago (the
    previous run's destination files) goes back to the host, and a run that fills the page
    cache with it pays host page faults (seen here as seconds of extra system time). Touching
    the memory first lowers the odds for every method alike; it does not remove them."""
    if nbytes > 0:
        block = b"\x01" * nbytes
        del block


def quiesce(prefault_bytes: int = 0) -> None:
    """Flush every dirty page first, so no measurement pays for another's writeback."""
    os.sync()
    prefault(prefault_bytes)


def cpu_busy_seconds() -> float:
    """Busy CPU time of the whole machine (all CPUs, every process and kernel thread)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass
class Usage:
    """What one timed run cost: this process's CPU (all threads), page faults, and the CPU
    that everything else on the machine used meanwhile (other processes, kernel threads)."""

    user: float = 0.0
    sys: float = 0.0
    minflt: int = 0
    others: float = 0.0

    def __str__(self) -> str:
        return (
            f"cpu user {self.user:.2f} sys {self.sys:.2f}, {self.minflt} faults, "
            f"others {self.others:.2f} cpu-s"
        )


LAST_USAGE = Usage()
RUN_LOG: list[tuple[float, Usage]] = []  # (wall, usage) of every timed run of a section


def summarize(report: Report, section: str, times: dict[str, list[float]], nbytes: int) -> None:
    """Per method: median, min and max; and a note when the machine was busy meanwhile."""
    for name, xs in times.items():
        report.samples[f"{section}.{name}"] = xs
        print(
            f"  {name:14s} median {fmt_s(med(xs), nbytes)}  min {min(xs):.3f} s  "
            f"max {max(xs):.3f} s  (n={len(xs)})"
        )
    busy_note(report, section)


def busy_note(report: Report, section: str) -> None:
    """Note how busy the rest of the machine was during this section's timed runs."""
    if RUN_LOG:
        wall = sum(w for w, _ in RUN_LOG)
        busy = sum(u.others for _, u in RUN_LOG) / wall if wall else 0.0
        report.context.setdefault("others_cpus", {})[section] = round(busy, 2)
        if busy > BUSY_CPUS:
            report.busy.add(section)
            report.note(
                f"{section}: while it ran, other processes and kernel threads kept "
                f"{busy:.2f} of {os.cpu_count()} CPUs busy on average; results that need "
                "every core (hashing beside copying, 2 workers) or fsync latency are pessimistic"
            )
        else:
            print(f"  other load during the timed runs: {busy:.2f} CPUs on average")
        RUN_LOG.clear()


def timed(fn: Callable[[], object], prefault_bytes: int = 0) -> float:
    global LAST_USAGE  # diagnostics of the last run, printed beside it
    quiesce(prefault_bytes)
    before = resource.getrusage(resource.RUSAGE_SELF)
    busy = cpu_busy_seconds()
    start = time.perf_counter()
    fn()
    took = time.perf_counter() - start
    busy = cpu_busy_seconds() - busy
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, sys_ = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    LAST_USAGE = Usage(user, sys_, after.ru_minflt - before.ru_minflt, max(0.0, busy - user - sys_))
    RUN_LOG.append((took, LAST_USAGE))
    return took


def write_source_file(path: Path, size: int, block: bytes) -> None:
    with path.open("wb") as fh:
        left = size
        while left:
            n = min(left, len(block))
            fh.write(block[:n] if n < len(block) else block)
            left -= n
        fh.flush()
        os.fsync(fh.fileno())


def make_source(directory: Path, total: int, n_files: int, block: bytes) -> list[tuple[str, Path]]:
    directory.mkdir(parents=True)
    per_file = total // n_files
    files = []
    for i in range(n_files):
        rel = f"shard-{i:02d}.bin"
        write_source_file(directory / rel, per_file, block)
        files.append((rel, directory / rel))
    fsync_path(directory, directory=True)
    return files


def warm(paths: Sequence[Path]) -> None:
    """Read every file once so every method reads it from the page cache."""
    for path in paths:
        with path.open("rb", buffering=0) as fh:
            while fh.read(CHUNK_BYTES):
                pass


def need_disk(where: Path, needed: int, what: str, report: Report) -> bool:
    free = shutil.disk_usage(where).free
    if free < 3 * needed:
        report.note(
            f"SKIPPED {what}: {free / GiB:.1f} GiB free, needs 3 x {needed / GiB:.1f} GiB "
            f"= {3 * needed / GiB:.1f} GiB"
        )
        return False
    return True


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- 1. baselines


def copy_loop_fsync(files: Sequence[tuple[str, Path]], dst: Path) -> None:
    """Baseline (a): userspace read/write loop, same chunk size as the shim, fsync per file."""
    dst.mkdir()
    for rel, src in files:
        with src.open("rb", buffering=0) as fi, (dst / rel).open("wb", buffering=0) as fo:
            while chunk := fi.read(CHUNK_BYTES):
                view = memoryview(chunk)
                while view:
                    view = view[fo.write(view) :]
            os.fsync(fo.fileno())
    fsync_path(dst, directory=True)


def copyfile_fsync(files: Sequence[tuple[str, Path]], dst: Path) -> None:
    """Baseline (b): shutil.copyfile (sendfile in the kernel), fsync per file."""
    dst.mkdir()
    for rel, src in files:
        shutil.copyfile(src, dst / rel)
        fsync_path(dst / rel)
    fsync_path(dst, directory=True)


# --------------------------------------------------------------------------- prototypes
#
# Proposed data path for FilesystemStepWriter.copy_file, measured here beside the package's
# own. It keeps what the package guarantees: the sha256 is of exactly the bytes written
# (hashed from the same buffer, in a helper thread, while that buffer is written), each file
# is fsynced before its FileEntry exists, and manifest/COMMITTED/rename/latest.json go
# through the package's own commit (CommitProtocol.publish). What changes:
#   - two reused buffers (readinto) instead of a fresh 8 MiB bytes object per chunk, and the
#     next chunk is read while the current one is hashed;
#   - sync_file_range(SYNC_FILE_RANGE_WRITE) after each chunk starts writeback at once, so
#     the disk works while the CPU hashes and fsync finds little left (a hint only: fsync
#     still makes the file durable). Without it the package hashes the whole file first and
#     only then makes the disk write it, so hash time and writeback time add up;
#   - optionally, two files at a time (hashlib and the syscalls release the GIL).

_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: Any = None
with contextlib.suppress(OSError, AttributeError):
    _sync_file_range = ctypes.CDLL(None, use_errno=True).sync_file_range
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    _sync_file_range.restype = ctypes.c_int


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing a range back now (no wait; errors ignored: a hint)."""
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


Buffers = tuple[bytearray, bytearray]


def proto_copy(
    target: Path, source: Path, buffers: Buffers, hasher: ThreadPoolExecutor, early_writeback: bool
) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    fd_in = os.open(source, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fd_out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            which = 0
            n = os.readv(fd_in, [buffers[which]])
            while n:
                view = memoryview(buffers[which])[:n]
                hashed = hasher.submit(digest.update, view)
                write_all(fd_out, view)
                if early_writeback:
                    start_writeback(fd_out, size, n)
                size += n
                which ^= 1
                n = os.readv(fd_in, [buffers[which]])  # the other buffer, while hashing
                hashed.result()
            os.fsync(fd_out)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)
    return digest.hexdigest(), size


def prototype_publish_directory(
    proto: CommitProtocol,
    step: int,
    source: Path,
    *,
    early_writeback: bool = True,
    streams: int = 1,
) -> PublishResult:
    """publish_directory with the prototype data path; commit is the package's own."""
    files = collect_directory(source)
    writer = proto.begin(step)
    assert isinstance(writer, FilesystemStepWriter)
    spare: queue.SimpleQueue[Buffers] = queue.SimpleQueue()
    for _ in range(streams):  # two chunk buffers per stream, allocated once per publish
        spare.put((bytearray(CHUNK_BYTES), bytearray(CHUNK_BYTES)))
    try:
        with ThreadPoolExecutor(streams, thread_name_prefix="proto-hash") as hasher:

            def one(item: tuple[str, Path]) -> FileEntry:
                rel, path = item
                # _target confines the path and records parent dirs for the commit's fsyncs.
                target = writer._target(rel)
                buffers = spare.get()
                try:
                    sha, size = proto_copy(target, path, buffers, hasher, early_writeback)
                finally:
                    spare.put(buffers)
                return FileEntry(path=rel, bytes=size, sha256=sha)

            if streams == 1:
                entries = [one(item) for item in files]
            else:
                with ThreadPoolExecutor(streams, thread_name_prefix="proto-copy") as copiers:
                    entries = list(copiers.map(one, files))
        return proto.publish(writer, entries, StepMetadata.from_env())
    except BaseException:
        writer.abort()
        raise


# --------------------------------------------------------------------------- 1. publish


@dataclass(frozen=True)
class Method:
    name: str
    label: str
    kind: str  # "baseline", "candidate" (the package) or "prototype"
    run: Callable[[int], object]  # takes a fresh step number (baselines ignore it)


def bench_publish(
    report: Report, work: Path, size: int, reps: int, prototypes: bool
) -> tuple[FilesystemStore, int, list[Path]] | None:
    RUN_LOG.clear()
    print(f"\n[1] publish {fmt_size(size)} in {N_FILES} files: protocol vs plain copy + fsync")
    print(f"  load average now: {loadavg_text()}")
    if not need_disk(work, 3 * size, "the publish benchmark", report):
        return None
    block = os.urandom(min(SOURCE_BLOCK, size // N_FILES))
    src = work / "publish-src"
    files = make_source(src, size, N_FILES, block)
    del block
    size = sum(p.stat().st_size for _, p in files)
    warm([p for _, p in files])
    store = FilesystemStore(work / "publish-store")
    proto = CommitProtocol(store, run_id=RUN_ID, attempt="0")
    proto.claim_run()  # run.json exists before the first timed publish, as after any first save
    dst = work / "publish-dst"
    published: dict[str, int] = {}  # method -> its last published step

    def step_dir(step: int) -> Path:
        return store.root / "steps" / f"step-{step:012d}"

    methods = [
        Method(
            "copy_loop",
            "(a) read/write loop + fsync",
            "baseline",
            lambda _s: copy_loop_fsync(files, dst),
        ),
        Method(
            "publish",
            "publish_directory (package)",
            "candidate",
            lambda s: proto.publish_directory(s, src),
        ),
        Method(
            "copyfile",
            "(b) shutil.copyfile + fsync",
            "baseline",
            lambda _s: copyfile_fsync(files, dst),
        ),
    ]
    if prototypes:
        methods += [
            Method(
                "proto_bufs",
                "PROTOTYPE reused buffers, no early writeback",
                "prototype",
                lambda s: prototype_publish_directory(proto, s, src, early_writeback=False),
            ),
            Method(
                "proto_wb",
                "PROTOTYPE reused buffers + early writeback",
                "prototype",
                lambda s: prototype_publish_directory(proto, s, src),
            ),
            Method(
                "proto_x2",
                "PROTOTYPE 2 files at once, no early writeback",
                "prototype",
                lambda s: prototype_publish_directory(
                    proto, s, src, early_writeback=False, streams=2
                ),
            ),
            Method(
                "proto_wb_x2",
                "PROTOTYPE early writeback, 2 files at once",
                "prototype",
                lambda s: prototype_publish_directory(proto, s, src, streams=2),
            ),
        ]
    times: dict[str, list[float]] = {m.name: [] for m in methods}
    step = 0
    prefault_bytes = size + size // 4 + 256 * MiB
    for rep in range(reps):
        for method in methods if rep % 2 == 0 else methods[::-1]:
            rmtree(dst)
            if method.name in published:
                rmtree(step_dir(published[method.name]))
            step += 1
            times[method.name].append(timed(partial(method.run, step), prefault_bytes))
            if method.kind != "baseline":
                published[method.name] = step
            print(
                f"  rep {rep + 1} {method.name:11s} {fmt_s(times[method.name][-1], size)}; "
                f"{LAST_USAGE}"
            )
    rmtree(dst)
    summarize(report, "publish", times, size)
    # The prototype must produce the package's manifest entries, byte for byte.
    package_files = proto.store.read(f"steps/step-{published['publish']:012d}/manifest.json")
    assert package_files is not None
    expected = {f["path"]: f["sha256"] for f in json.loads(package_files)["files"]}
    for name, last in published.items():
        raw = proto.store.read(f"steps/step-{last:012d}/manifest.json")
        got = {f["path"]: f["sha256"] for f in json.loads(raw or b"{}")["files"]}
        if got != expected:
            raise RuntimeError(f"{name}: manifest digests differ from the package's")
    baselines = [m for m in methods if m.kind == "baseline"]
    for method in methods:
        if method.kind == "baseline":
            continue
        cand = med(times[method.name])
        for base in baselines:
            base_s = med(times[base.name])
            ratio = cand / base_s
            report.add(
                Row(
                    "1 publish",
                    f"{method.label}: {fmt_size(size)}/{N_FILES} files vs {base.label}",
                    fmt_s(cand, size),
                    fmt_s(base_s, size),
                    ratio,
                    "time",
                    f"<= {PUBLISH_MAX_RATIO}x",
                    ratio <= PUBLISH_MAX_RATIO,
                    {"candidate_s": cand, "baseline_s": base_s, "bytes": size, "reps": reps},
                    prototype=method.kind == "prototype",
                )
            )
    for name, last in published.items():
        if name != "publish":
            rmtree(step_dir(last))
    final = step_dir(published["publish"])
    return store, published["publish"], [final / rel for rel, _ in files]


# --------------------------------------------------------------------------- 2. verify


def sha256_single(paths: Sequence[Path]) -> list[str]:
    out = []
    for path in paths:
        digest = hashlib.sha256()
        with path.open("rb", buffering=0) as fh:
            while chunk := fh.read(MiB):
                digest.update(chunk)
        out.append(digest.hexdigest())
    return out


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
            print(f"  rep {rep + 1} {name:14s} {fmt_s(times[name][-1], size)}; {LAST_USAGE}")
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


# --------------------------------------------------------------------------- 3. commit


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

CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from rtj_shim.protocol import CommitProtocol
    from rtj_shim.storage.filesystem import FilesystemStore
    mode, root, src = sys.argv[1:4]
    if mode.startswith("proto"):
        from bench.checkpoint_protocol import prototype_publish_directory
    took = None
    if mode.endswith("publish"):
        protocol = CommitProtocol(FilesystemStore(Path(root)), run_id="bench-mem", attempt="0")
        protocol.claim_run()
        start = time.perf_counter()
        if mode == "publish":
            protocol.publish_directory(1, Path(src))
        else:
            prototype_publish_directory(protocol, 1, Path(src))
        took = time.perf_counter() - start
    with open("/proc/self/status") as fh:
        hwm = [int(line.split()[1]) for line in fh if line.startswith("VmHWM:")][0]
    print(json.dumps({"vmhwm_kib": hwm, "publish_s": took}))
    """
)


def run_child(mode: str, root: Path, src: Path, prefault_bytes: int = 0) -> tuple[float, float]:
    """(VmHWM in MiB, seconds the publish took) of a fresh interpreter that imports the shim
    and, in a ``*publish`` mode, publishes ``src``. VmHWM is read inside the child: the
    rusage ru_maxrss of a child also counts the parent's image it ran in before exec."""
    quiesce(prefault_bytes)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(root), str(src)],
        capture_output=True,
        cwd=REPO,
        check=False,
    )
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"child ({mode}) exited {proc.returncode}: {tail}")
    out = json.loads(proc.stdout)
    return float(out["vmhwm_kib"]) * KiB / MiB, float(out["publish_s"] or 0.0)


def bench_memory(report: Report, work: Path, size: int, prototypes: bool) -> None:
    RUN_LOG.clear()
    print(f"\n[4] peak RSS publishing one {fmt_size(size)} file (child process) vs imports only")
    print(f"  load average now: {loadavg_text()}")
    if not need_disk(work, 2 * size, f"the {fmt_size(size)} memory benchmark", report):
        return
    src = work / "mem-src"
    src.mkdir()
    start = time.perf_counter()
    write_source_file(src / "model.bin", size, os.urandom(min(SOURCE_BLOCK, size)))
    print(f"  source written and fsynced in {time.perf_counter() - start:.1f} s")
    warm([src / "model.bin"])
    prefault_bytes = size + size // 4 + 256 * MiB
    dst = work / "mem-copy"
    copy_s = timed(lambda: copyfile_fsync([("model.bin", src / "model.bin")], dst), prefault_bytes)
    print(f"  copyfile + fsync (in this process): {fmt_s(copy_s, size)}; {LAST_USAGE}")
    rmtree(dst)
    variants = [("imports", "publish", "publish_directory (package)", False)]
    if prototypes:
        variants.append(("proto-imports", "proto-publish", "PROTOTYPE early writeback", True))
    for imports_mode, publish_mode, label, is_proto in variants:
        base_hwm, _ = run_child(imports_mode, work / "mem-store-unused", src)
        hwm, took = run_child(publish_mode, work / "mem-store", src, prefault_bytes)
        rmtree(work / "mem-store")
        delta = hwm - base_hwm
        print(
            f"  {publish_mode:13s}: VmHWM {hwm:.1f} MiB vs {base_hwm:.1f} MiB imports only "
            f"(+{delta:.1f}); publish {fmt_s(took, size)}"
        )
        report.samples[f"memory.{publish_mode}.vmhwm_mib"] = [hwm]
        report.samples[f"memory.{imports_mode}.vmhwm_mib"] = [base_hwm]
        report.add(
            Row(
                "4 memory",
                f"{label}: peak RSS above imports, 1 file of {fmt_size(size)}",
                f"{hwm:.1f} MiB (+{delta:.1f})",
                f"{base_hwm:.1f} MiB",
                hwm / base_hwm,
                "RSS",
                f"< +{RSS_MAX_MIB:g} MiB",
                delta < RSS_MAX_MIB,
                {"vmhwm_mib": hwm, "imports_vmhwm_mib": base_hwm, "delta_mib": delta},
                prototype=is_proto,
            )
        )
        report.add(
            Row(
                "4 memory",
                f"{label}: time, 1 file of {fmt_size(size)} vs (b) copyfile + fsync",
                fmt_s(took, size),
                fmt_s(copy_s, size),
                took / copy_s,
                "time",
                "(report)",
                None,
                {"candidate_s": took, "baseline_s": copy_s, "bytes": size, "reps": 1},
                prototype=is_proto,
            )
        )
    rmtree(src)


# --------------------------------------------------------------------------- table


def print_table(report: Report) -> None:
    headers = ["#", "check", "candidate", "baseline", "ratio", "target", "result"]

    def cells(r: Row) -> list[str]:
        ratio = f"{r.ratio:.2f}x {r.ratio_means}" if r.ratio is not None else "-"
        return [r.section, r.check, r.candidate, r.baseline, ratio, r.target, report.result(r)]

    groups = [
        ("The package against its targets", [r for r in report.rows if not r.prototype]),
        (
            "PROTOTYPES: proposed changes, implemented in this file (not the package)",
            [r for r in report.rows if r.prototype],
        ),
    ]
    all_rows = [cells(r) for r in report.rows]
    widths = [max(len(h), *(len(row[i]) for row in all_rows)) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    print("\nResults (medians; ratio 'time' = candidate/baseline, 'speed-up' = baseline/candidate)")
    for title, rows in groups:
        if not rows:
            continue
        print(f"\n{title}")
        print(line)
        print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
        print(line)
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(cells(row), widths, strict=True)).rstrip())
        print(line)
    if report.busy:
        print("* timed while other work kept the machine busy (see the notes): not conclusive")
    for text in report.notes:
        print(f"note: {text}")


# --------------------------------------------------------------------------- main


METHOD_TEXT = """\
Method
  Sources are written once, fsynced, and read once: every method reads the same warm page
  cache. Before each timed run: os.sync() (no run pays for another's writeback) and, for the
  large copies, the free memory the run will fill is touched first (a VM that returns freed
  memory to its host otherwise makes a random run pay host page faults). Destinations
  are removed between runs, untimed. Runs are interleaved (baseline, candidate, baseline,
  ...), the order reversed on every other repetition; the table shows medians. 'others' is
  the CPU that other processes and kernel threads used during a run (a busy machine shows)."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.checkpoint_protocol",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--size-gib", type=float, default=1.0, help="publish size (default 1.0)")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    parser.add_argument(
        "--reps", type=int, default=3, help="repetitions of each large measurement (default 3)"
    )
    parser.add_argument(
        "--no-prototypes", action="store_true", help="skip the proposed-change prototypes"
    )
    args = parser.parse_args(argv)
    if args.size_gib <= 0:
        parser.error("--size-gib must be positive")
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    return args


def run(args: argparse.Namespace, report: Report) -> None:
    publish_size = 64 * MiB if args.quick else int(args.size_gib * GiB)
    publish_size -= publish_size % (N_FILES * 4 * KiB)
    mem_size = 256 * MiB if args.quick else 4 * GiB
    reps = args.reps
    commit_reps = 10 if args.quick else 50

    BENCH_DIR.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="checkpoint-protocol-", dir=BENCH_DIR))
    try:
        report.context = machine_context(work)
        report.context.update(
            {
                "quick": args.quick,
                "publish_bytes": publish_size,
                "memory_bytes": mem_size,
                "reps": reps,
                "commit_reps": commit_reps,
            }
        )
        print_context(report.context)
        print(METHOD_TEXT)
        prototypes = not args.no_prototypes
        published = bench_publish(report, work, publish_size, reps, prototypes)
        if published is not None:
            bench_verify(report, *published, reps=reps)
            rmtree(work / "publish-src")
            rmtree(work / "publish-store")
        bench_commit(report, work, commit_reps)
        bench_memory(report, work, mem_size, prototypes)
        report.context["loadavg_end"] = os.getloadavg()
    finally:
        rmtree(work)
        with contextlib.suppress(OSError):
            BENCH_DIR.rmdir()  # only if nothing else lives there


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report()
    try:
        run(args, report)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print("checkpoint_protocol bench: error (not a target miss)", file=sys.stderr)
        return 1
    print_table(report)
    end = report.context.get("loadavg_end")
    if end:
        print("load average at end: " + " ".join(f"{x:.2f}" for x in end))
    if args.json:
        body = {
            "context": report.context,
            "rows": [asdict(r) | {"result": report.result(r)} for r in report.rows],
            "samples": report.samples,
            "notes": report.notes,
            "busy_sections": sorted(report.busy),
        }
        args.json.write_text(json.dumps(body, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
