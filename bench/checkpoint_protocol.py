"""What the checkpoint protocol costs, against a plain durable copy (or upload) of the same bytes.

Everything runs side by side on the same bytes, in a temporary directory under
``<repo>/.bench/`` (the repository's filesystem, git-ignored), removed afterwards. A step
comes in three shapes: 1 file of 4 GiB (one rank's ``torch.save``, or the one ``.distcp``
file per rank that ``torch.distributed.checkpoint`` writes), 8 files of 128 MiB and 64
files of 16 MiB.

1. publish, filesystem: ``CommitProtocol.publish_directory`` (hash while writing, fsync,
   manifest, COMMITTED, rename) of each shape against ``shutil.copyfile`` + fsync of every
   file and of the directory; target <= 1.3x for every shape.
2. deep verification: ``verify_step(..., Depth.DEEP, workers=2)`` (and workers=1) of the
   8 x 128 MiB step against single-threaded ``hashlib.sha256``; target >= 1.7x (2 workers).
3. fixed commit cost: ``StepWriter.commit`` (manifest + COMMITTED + rename + directory
   fsyncs) of a step whose 8 tiny shards are already written; target < 5 ms (median).
   Also: the whole publish of a 1-file tiny step.
4. peak memory: a child process publishing the 4 GiB file; target < 100 MiB above what it
   held before publishing (the filesystem path holds one mapped chunk of 8 MiB).
5. publish, S3: ``publish_directory`` into an ``S3Store`` on the loopback S3 server (moto,
   :mod:`e2e.s3server`, authentication enforced) against boto3's ``upload_file`` of every
   file with the same part size and concurrency. Each run is a child process that reports
   its own time, CPU and peak RSS; the server's CPU is read from /proc. Reported, no
   target: the server (Python, on the same cores) bounds both sides.

Each line prints absolute numbers, the ratio to its baseline, the target, PASS/MISS and
the load average. A miss never fails the run; only an error exits non-zero.

    python -m bench.checkpoint_protocol [--quick] [--reps 3] [--s3-reps 1] [--no-s3]
        [--sections fs,verify,commit,memory,s3] [--json FILE] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
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
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from rtj_shim.manifest import Manifest, committed_marker, encode_manifest, utc_now
from rtj_shim.protocol import CommitProtocol
from rtj_shim.storage.base import CHUNK_BYTES
from rtj_shim.storage.filesystem import FilesystemStepWriter, FilesystemStore
from rtj_shim.storage.s3_upload import DEFAULT_CONCURRENCY, DEFAULT_PART_BYTES
from rtj_shim.verification import Depth
from rtj_shim.verifier import verify_step

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
N_FILES = 8  # tiny shards of the commit benchmark
RUN_ID = "bench-run"
SOURCE_BLOCK = 64 * MiB  # random bytes written once and repeated to build large sources


@dataclass(frozen=True)
class Shape:
    files: int
    file_bytes: int

    @property
    def total(self) -> int:
        return self.files * self.file_bytes

    @property
    def tag(self) -> str:
        return f"{self.files}x{fmt_size(self.file_bytes).replace(' ', '')}"

    @property
    def text(self) -> str:
        return f"{self.files} x {fmt_size(self.file_bytes)}"


SHAPES = (Shape(1, 4 * GiB), Shape(8, 128 * MiB), Shape(64, 16 * MiB))
QUICK_SHAPES = (Shape(1, 128 * MiB), Shape(8, 16 * MiB), Shape(64, 2 * MiB))
VERIFY_SHAPE = 1  # index of the shape whose published step section 2 verifies
SECTIONS = ("fs", "verify", "commit", "memory", "s3")

# Targets (from the issues).
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
    load: float = field(default_factory=lambda: os.getloadavg()[0])  # 1-min, when measured

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
        key = row.values.get("busy_key") or row.section.split()[-1]
        busy = row.passed is not None and key in self.busy
        return row.verdict + ("*" if busy else "")

    def add(self, row: Row) -> None:
        self.rows.append(row)
        ratio = f"{row.ratio:.2f}x {row.ratio_means}" if row.ratio is not None else "-"
        print(
            f"  -> {row.check}: {row.candidate} vs {row.baseline}: {ratio}; {row.verdict} "
            f"(load {row.load:.2f})"
        )

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


def make_source(directory: Path, shape: Shape, block: bytes) -> list[tuple[str, Path]]:
    directory.mkdir(parents=True)
    files = []
    for i in range(shape.files):
        rel = f"shard-{i:02d}.bin"
        write_source_file(directory / rel, shape.file_bytes, block)
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
    """Room for ``needed`` bytes and a margin of as much again (the page cache, the rest)."""
    free = shutil.disk_usage(where).free
    if free < 2 * needed:
        report.note(
            f"SKIPPED {what}: {free / GiB:.1f} GiB free, needs 2 x {needed / GiB:.1f} GiB "
            f"= {2 * needed / GiB:.1f} GiB"
        )
        return False
    return True


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- 1. filesystem


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
            usage[name].append(LAST_USAGE)
            print(f"  rep {rep + 1} {name:9s} {fmt_s(took, size)}; {LAST_USAGE}")
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


# --------------------------------------------------------------------------- 5. S3

S3_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    mode, bucket, prefix, source, part, concurrency = sys.argv[1:7]
    part, concurrency = int(part), int(concurrency)

    def hwm():
        with open("/proc/self/status") as fh:
            return [int(line.split()[1]) for line in fh if line.startswith("VmHWM:")][0]

    if mode == "publish":
        from rtj_shim.protocol import CommitProtocol
        from rtj_shim.storage.s3 import S3Store

        store = S3Store(bucket, prefix, part_size=part, concurrency=concurrency)
        protocol = CommitProtocol(store, run_id="bench-s3", attempt="0", retention=None)
        protocol.claim_run()
        run = lambda: protocol.publish_directory(1, Path(source))
    else:
        import boto3
        from boto3.s3.transfer import TransferConfig

        client = boto3.session.Session().client("s3")
        config = TransferConfig(
            multipart_threshold=part + 1,  # as S3Store: one PUT up to a part's size
            multipart_chunksize=part,
            max_concurrency=concurrency,
        )
        files = sorted(Path(source).iterdir())

        def run():
            for path in files:
                client.upload_file(str(path), bucket, f"{prefix}/{path.name}", Config=config)

    before = hwm()
    cpu = time.process_time()
    start = time.perf_counter()
    run()
    took = time.perf_counter() - start
    out = {"seconds": took, "cpu": time.process_time() - cpu, "hwm_before": before}
    out["hwm_after"] = hwm()
    print(json.dumps(out))
    """
)


def proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class S3Run:
    seconds: float
    cpu: float  # the client process, all threads
    server_cpu: float
    hwm_growth_mib: float  # peak RSS growth of the client while it uploaded


def run_s3_child(
    mode: str, env: dict[str, str], bucket: str, prefix: str, source: Path, server_pid: int
) -> S3Run:
    quiesce()
    server_before = proc_cpu_seconds(server_pid)
    args = [mode, bucket, prefix, str(source), str(DEFAULT_PART_BYTES), str(DEFAULT_CONCURRENCY)]
    proc = subprocess.run(
        [sys.executable, "-c", S3_CHILD, *args],
        capture_output=True,
        cwd=REPO,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"S3 child ({mode}) exited {proc.returncode}: {tail}")
    out = json.loads(proc.stdout)
    return S3Run(
        float(out["seconds"]),
        float(out["cpu"]),
        proc_cpu_seconds(server_pid) - server_before,
        (out["hwm_after"] - out["hwm_before"]) * KiB / MiB,
    )


def delete_prefix(client: Any, bucket: str, prefix: str) -> None:
    """Everything under ``prefix`` (and unfinished uploads), so the server frees it."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


def bench_s3(report: Report, work: Path, sources: list[tuple[Shape, Path]], reps: int) -> None:
    from e2e.s3server import S3Server, aws_env

    RUN_LOG.clear()
    print(
        f"\n[5] S3 (loopback moto server): publish vs boto3 upload_file, part size "
        f"{fmt_size(DEFAULT_PART_BYTES)}, {DEFAULT_CONCURRENCY} parts at once, {reps} rep(s)"
    )
    print(f"  load average now: {loadavg_text()}")
    server = S3Server(work).start()
    try:
        env = {**os.environ, **aws_env(server.url, server.allowed)}
        admin = server.client()
        bucket = server.create_bucket()
        run = 0
        for shape, source in sources:
            results: dict[str, list[S3Run]] = {"upload_file": [], "publish": []}
            for rep in range(reps):
                order = ("upload_file", "publish") if rep % 2 == 0 else ("publish", "upload_file")
                for mode in order:
                    run += 1
                    prefix = f"run-{run}"
                    got = run_s3_child(mode, env, bucket, prefix, source, server.pid)
                    delete_prefix(admin, bucket, prefix)
                    results[mode].append(got)
                    print(
                        f"  {shape.text:12s} rep {rep + 1} {mode:11s} "
                        f"{fmt_s(got.seconds, shape.total)}; client cpu {got.cpu:.2f} s, "
                        f"server cpu {got.server_cpu:.2f} s, peak RSS +{got.hwm_growth_mib:.0f} MiB"
                    )
            add_s3_row(report, shape, results)
        report.context["s3_server"] = "moto (e2e.s3server), auth enforced, on this machine"
    finally:
        server.stop()
    busy_note(report, "publish-s3")


def add_s3_row(report: Report, shape: Shape, results: dict[str, list[S3Run]]) -> None:
    def summary(runs: list[S3Run]) -> tuple[float, str]:
        seconds = med([r.seconds for r in runs])
        text = (
            f"{fmt_s(seconds, shape.total)}, client cpu {med([r.cpu for r in runs]):.2f} s, "
            f"server cpu {med([r.server_cpu for r in runs]):.2f} s, "
            f"RSS +{max(r.hwm_growth_mib for r in runs):.0f} MiB"
        )
        return seconds, text

    cand, cand_text = summary(results["publish"])
    base, base_text = summary(results["upload_file"])
    for name, runs in results.items():
        report.samples[f"publish-s3.{shape.tag}.{name}"] = [r.seconds for r in runs]
    report.add(
        Row(
            "5 publish-s3",
            f"publish_directory to S3, {shape.text} vs boto3 upload_file",
            cand_text,
            base_text,
            cand / base,
            "time",
            "(report)",
            None,
            {
                "candidate_s": cand,
                "baseline_s": base,
                "bytes": shape.total,
                "runs": {k: [asdict(r) for r in v] for k, v in results.items()},
            },
        )
    )


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

MEMORY_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from rtj_shim.protocol import CommitProtocol
    from rtj_shim.storage.filesystem import FilesystemStore

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


# --------------------------------------------------------------------------- table


def cells(report: Report, r: Row) -> list[str]:
    ratio = f"{r.ratio:.2f}x {r.ratio_means}" if r.ratio is not None else "-"
    return [
        r.section,
        r.check,
        r.candidate,
        r.baseline,
        ratio,
        r.target,
        report.result(r),
        f"{r.load:.2f}",
    ]


HEADERS = ["#", "check", "candidate", "baseline", "ratio", "target", "result", "load"]


def print_table(report: Report) -> None:
    rows = [cells(report, r) for r in report.rows]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(HEADERS)]
    line = "  ".join("-" * w for w in widths)
    print("\nResults (medians; ratio 'time' = candidate/baseline, 'speed-up' = baseline/candidate;")
    print("load = 1-minute load average when the row was measured)")
    print(line)
    print("  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True)).rstrip())
    print(line)
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(line)
    if report.busy:
        print("* timed while other work kept the machine busy (see the notes): not conclusive")
    for text in report.notes:
        print(f"note: {text}")


def markdown(report: Report) -> str:
    ctx = report.context
    fs = ctx.get("filesystem", {})
    out = [
        "# Checkpoint protocol benchmark",
        "",
        f"`python -m bench.checkpoint_protocol` on {ctx.get('cpu_count')} CPUs "
        f"({ctx.get('cpu_model')}, sha_ni={'yes' if ctx.get('sha_ni') else 'no'}), "
        f"{ctx.get('mem_total_gib')} GiB, {fs.get('fstype')} on {fs.get('device')}, "
        f"{ctx.get('python')}, Linux {ctx.get('kernel')}.",
        f"Load average at start {fmt_load(ctx.get('loadavg_start'))}, "
        f"at end {fmt_load(ctx.get('loadavg_end'))}.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    for r in report.rows:
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells(report, r)) + " |")
    out.append("")
    out.extend(f"- {text}" for text in report.notes)
    return "\n".join(out).rstrip() + "\n"


def fmt_load(values: Any) -> str:
    return " ".join(f"{x:.2f}" for x in values) if values else "?"


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
    parser.add_argument("--quick", action="store_true", help="small shapes for a smoke run")
    parser.add_argument(
        "--reps", type=int, default=3, help="repetitions of each filesystem measurement (3)"
    )
    parser.add_argument(
        "--s3-reps", type=int, default=1, help="repetitions of each S3 measurement (1)"
    )
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 section")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    parser.add_argument("--markdown", type=Path, metavar="FILE", help="also write a Markdown table")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.s3_reps < 1:
        parser.error("--reps and --s3-reps must be at least 1")
    args.sections = {x.strip() for x in args.sections.split(",") if x.strip()}
    if args.no_s3:
        args.sections.discard("s3")
    if not args.sections or args.sections - set(SECTIONS):
        parser.error(f"--sections: choose from {','.join(SECTIONS)}")
    return args


def make_sources(report: Report, work: Path, shapes: Sequence[Shape]) -> list[tuple[Shape, Path]]:
    """One source directory per shape that fits on the disk (skipped shapes are noted)."""
    block = os.urandom(SOURCE_BLOCK)
    sources = []
    for shape in shapes:
        if not need_disk(work, 2 * shape.total, f"the {shape.text} shape", report):
            continue
        start = time.perf_counter()
        make_source(work / f"src-{shape.tag}", shape, block)
        print(f"  source {shape.text}: written and fsynced in {time.perf_counter() - start:.1f} s")
        sources.append((shape, work / f"src-{shape.tag}"))
    return sources


def run(args: argparse.Namespace, report: Report) -> None:
    shapes = QUICK_SHAPES if args.quick else SHAPES
    commit_reps = 10 if args.quick else 50
    BENCH_DIR.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="checkpoint-protocol-", dir=BENCH_DIR))
    try:
        report.context = machine_context(work)
        report.context.update(
            {
                "quick": args.quick,
                "shapes": [asdict(s) for s in shapes],
                "reps": args.reps,
                "s3_reps": args.s3_reps,
                "commit_reps": commit_reps,
            }
        )
        print_context(report.context)
        print(METHOD_TEXT)
        needs_sources = args.sections - {"commit"}
        sources = make_sources(report, work, shapes) if needs_sources else []
        verify_source: tuple[FilesystemStore, int, list[Path]] | None = None
        for shape, source in sources:
            if "fs" not in args.sections and not (
                "verify" in args.sections and shape == shapes[VERIFY_SHAPE]
            ):
                continue
            files = sorted((p.name, p) for p in source.iterdir())
            store, step = bench_fs_publish(report, work, shape, files, args.reps)
            if shape == shapes[VERIFY_SHAPE]:
                verify_source = (store, step, [step_dir(store, step) / rel for rel, _ in files])
            else:
                rmtree(store.root)
        if verify_source is not None:
            if "verify" in args.sections:
                bench_verify(report, *verify_source, reps=args.reps)
            rmtree(verify_source[0].root)
        if "commit" in args.sections:
            bench_commit(report, work, commit_reps)
        largest = [(shape, source) for shape, source in sources if shape == shapes[0]]
        for shape, source in largest if "memory" in args.sections else []:
            bench_memory(report, work, shape, source)
        if "s3" in args.sections:
            bench_s3(report, work, sources, args.s3_reps)
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
        print("load average at end: " + fmt_load(end))
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
    if args.markdown:
        args.markdown.write_text(markdown(report))
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
