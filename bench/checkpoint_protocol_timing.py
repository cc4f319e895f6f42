"""bench.checkpoint_protocol's timing on a shared machine: the machine's description, and
each timed run's own CPU, page faults and the CPU everything else used meanwhile, so a
section timed while the machine was busy says so."""

from __future__ import annotations

import os
import platform
import resource
import shutil
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.checkpoint_protocol_report import Report, fmt_s
from bench.common import GiB, KiB, MiB, med, mount_of, quiesce
from rtj_shim.checkpoint.storage.base import CHUNK_BYTES

BUSY_CPUS = 0.5  # other load (in CPUs) above which a section gets a "machine was busy" note


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


RUN_LOG: list[tuple[float, Usage]] = []  # (wall, usage) of every timed run of a section


def last_usage() -> Usage:
    """The last timed run's usage (printed beside it)."""
    return RUN_LOG[-1][1] if RUN_LOG else Usage()


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
    quiesce(prefault_bytes)
    before = resource.getrusage(resource.RUSAGE_SELF)
    busy = cpu_busy_seconds()
    start = time.perf_counter()
    fn()
    took = time.perf_counter() - start
    busy = cpu_busy_seconds() - busy
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, sys_ = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    usage = Usage(user, sys_, after.ru_minflt - before.ru_minflt, max(0.0, busy - user - sys_))
    RUN_LOG.append((took, usage))
    return took
