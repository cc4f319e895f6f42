"""Where a soak's CPU went: CPU seconds by component, sampled from /proc while it runs.

On a machine whose cores the trainers fill, every CPU second spent beside them (the
operator, the shim's sidecars and supervisors, the warm standby interpreters, the control
plane) is taken from training: the operator run's steps were 6-11% slower than the JobSet
baseline's (stop 25) with the cause unmeasured. The soak harnesses run a `CpuSampler`
beside the run and report its totals, both systems alike, so the difference has names.

A process is counted from its first sample to its last: one that lives shorter than the
sampling interval, or the last interval of one that exits, is missed (at most `every`
seconds of CPU per process; the report says so). Classification is a pure function of the
command line.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from e2e.demo.drills import waiting_standby

TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")
LAUNCHERS = ("torchrun", "torch.distributed.run")
CONTROL_PLANE = (
    "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
    "jobset", "kueue",
)  # fmt: skip
VERSIONED = re.compile(r"-v\d+(\.\d+)*$")
MODULES = {"e2e.podrunner": "pod runner", "moto.server": "S3 server (moto)"}


WAITING = "fork server / warm standby (waiting)"
"""A warm interpreter not running a trainer: its imports (once per pod for a fork server)."""
WARM_TRAINER = "trainer (forked or handed over warm)"


def component(argv: Sequence[str], waiting: bool = False) -> str | None:
    """The component a process belongs to, from its command line (`waiting`: a warm
    standby not yet handed its generation); None: not the soak's."""
    if not argv:
        return None
    words = [os.path.basename(a) for a in argv]
    joined = " ".join(argv)
    if any(w in LAUNCHERS for w in words) or "torch.distributed.run" in argv:
        return "torchrun agent"
    if "supervise" in argv and any("rtj-shim" in w for w in words[:3]):
        return "rtj-shim supervise"
    if "ddp_train.py" in joined:  # the trainer, directly or handed to a warm standby
        if "rtj_shim.agent.preload" not in argv:
            return "trainer"
        return WAITING if waiting else WARM_TRAINER
    if "rtj_operator" in joined:
        return "operator"
    for i, w in enumerate(words[:3]):
        if w == "rtj-shim" and i + 1 < len(argv):
            return f"rtj-shim {argv[i + 1]}"
    if "-m" in argv and (i := argv.index("-m")) + 1 < len(argv):
        module = argv[i + 1]
        if module in MODULES:
            return MODULES[module]
        if module.startswith(("rtj_shim", "e2e.", "bench.")):
            return module
    program = VERSIONED.sub("", words[0])  # the harness's binaries: kube-apiserver-v1.35.4
    if program in CONTROL_PLANE:
        return f"control plane: {program}"
    return None


def _sample(proc: Path) -> tuple[int, int, bytes] | None:
    """(start time, utime + stime in clock ticks, raw cmdline) of one /proc/<pid>."""
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    # fields[0] is field 3 (state): utime 14, stime 15, starttime 22 (proc(5))
    return int(fields[19]), int(fields[11]) + int(fields[12]), cmdline


class CpuSampler(threading.Thread):
    """Samples every `every` seconds the processes started after it (one that `component`
    does not know counts as `other: <program>`); `totals()` once stopped. The CPU a process
    used since its previous sample goes to its component at this sample, so a warm standby
    interpreter's import counts as `WAITING` and its training, once forked from it or handed
    its generation, as `WARM_TRAINER`. The process that runs the
    sampler is counted as `harness` from its start."""

    def __init__(self, every: float = 2.0) -> None:
        super().__init__(name="cpu-sampler", daemon=True)
        self.every, self.root = every, PROC
        self._halt = threading.Event()
        self._ticks: dict[tuple[int, int], int] = {}
        self._spent: dict[str, int] = {}
        own = _sample(PROC / str(os.getpid()))
        self._harness_from = own[1] if own else 0
        self._harness = 0
        self._after = self._boot_ticks_now()

    def _boot_ticks_now(self) -> int:
        """Now, in clock ticks since boot (the unit of a process's start time)."""
        try:
            uptime = float((self.root / "uptime").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0
        return int(uptime * TICKS)

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.every)

    def sample(self) -> None:
        for proc in self.root.iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            got = _sample(proc)
            if got is None or got[0] < self._after:
                continue
            start, ticks, cmdline = got
            argv = [a for a in cmdline.decode(errors="replace").split("\0") if a]
            name = component(argv, waiting=waiting_standby(int(proc.name), cmdline))
            name = name or f"other: {os.path.basename(argv[0]) if argv else '?'}"
            key = (int(proc.name), start)
            self._spent[name] = self._spent.get(name, 0) + ticks - self._ticks.get(key, 0)
            self._ticks[key] = ticks
        own = _sample(self.root / str(os.getpid()))
        if own is not None:
            self._harness = own[1] - self._harness_from

    def stop(self) -> dict[str, float]:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=10)
        self.sample()
        return self.totals()

    def totals(self) -> dict[str, float]:
        return totals([*self._spent.items(), ("harness", self._harness)])


def totals(seen: Iterable[tuple[str, int]]) -> dict[str, float]:
    """CPU seconds per component, largest first."""
    out: dict[str, float] = {}
    for name, ticks in seen:
        out[name] = out.get(name, 0.0) + ticks / TICKS
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def markdown_rows(runs: Mapping[str, Mapping[str, float]]) -> list[str]:
    """A table, one column per run: component -> CPU seconds."""
    names = list(runs)
    components: list[str] = []
    for cpu in runs.values():
        components += [c for c in cpu if c not in components]
    rows = [
        "| component | " + " | ".join(f"{n} CPU s" for n in names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for c in components:
        rows.append(f"| {c} | " + " | ".join(
            f"{runs[n][c]:.1f}" if c in runs[n] else "-" for n in names) + " |")  # fmt: skip
    rows.append("| **all** | " + " | ".join(
        f"**{sum(runs[n].values()):.1f}**" for n in names) + " |")  # fmt: skip
    return rows
