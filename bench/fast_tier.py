"""What the fast checkpoint tier (issue 16) costs and buys, against the durable saves and a
plain ``torch.save``, side by side on the same model, in one process (world size 1, CPU).

The model is the example trainer's own (``examples/ddp_train.py``: ``make_model(hidden)``,
an MLP with GELU, dropout and LayerNorm, AdamW, the warm-up + cosine ``LambdaLR``) at
several widths (``--hidden``; the default 1000, 5000, 7070 is ~1M, ~25M and ~50M
parameters, so ~12 MB, ~300 MB and ~600 MB of state with AdamW's two moments). One
training step is forward + backward + ``optimizer.step()`` + ``scheduler.step()`` on a
fixed batch of 16 (the example's 8 x 2 accumulation). Not ~100M: with ``fast_keep=2`` the
tmpfs holds two copies of the state and three while a save runs (3.6 GB at 100M), beside
the trainer's own 1.6 GB and the async save's staging copy, over this machine's share.

1. Training-thread stall per save, every method in each round, the order rotated from round
   to round (one untimed warm-up round first), medians and p90 (nearest rank):
   a. fast tier: ``Checkpointer.step_boundary`` with ``fast_tier_dir`` on a tmpfs
      (``/dev/shm`` when writable) and ``fast_every_steps=2``, ``fast_keep=2``: the time
      of a ``step_boundary`` that saves, less that of the one before it, which did not;
   b. plain ``torch.save`` of the state dicts to a new file on local disk (what a user
      writes; no fsync), and the same with flush + fsync;
   c. the durable blocking ``Checkpointer.save`` to a filesystem root on the same disk;
   d. the durable ``save(blocking=False)``: the call plus the wait for staging at the next
      ``optimizer.step()`` (``SaveReport.stall_seconds``); also when it was published, and
      how much longer the steps trained meanwhile took than plain ones (the background
      save shares the two cores).
   Each against one plain training step of that model, and as a ratio to b.
2. Restore time (``Checkpointer.restore`` of the newest step, a fresh Checkpointer each
   time, as a restarted trainer): from the fast tier (a resume file with ``fast_step``, as
   the in-place supervisor writes it), from the durable filesystem store (a resume file
   with ``step``: deep verification in the trainer, page cache warm and evicted; and the
   step the init container verified, shallow in the trainer), and from S3 on the loopback
   moto server of ``e2e.s3server`` (``--no-s3`` skips it).
3. Lost steps per failure: arithmetic from the measured stalls (see ``lost_rows``).

Durable steps go under ``<repo>/.bench/`` (git-ignored), the fast tier under ``/dev/shm``;
both are removed afterwards. Figures only, no targets: nothing here fails on a number.

    python -m bench.fast_tier [--hidden 1000,5000,7070] [--rounds 8] [--restore-reps 3]
        [--no-s3] [--quick] [--json FILE] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import logging
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from rtj_shim.fast_tier import holdings
from rtj_shim.torch import Checkpointer, SaveReport

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
SHM = Path("/dev/shm")  # the tmpfs the fast tier is meant for
MiB = 1 << 20
BATCH = 16  # the example's --batch 8 x --accum 2
FAST_EVERY = 2  # in this bench: every other step_boundary saves, so both kinds are timed
FAST_KEEP = 2
MAX_OVERLAP = 64  # steps trained at most while one background save is in flight
DEFAULT_HIDDEN = (1000, 5000, 7070)
QUICK_HIDDEN = (64, 256)

METHODS = ("fast", "torch.save", "torch.save+fsync", "durable", "durable async")
LABELS = {
    "fast": "fast tier: step_boundary into tmpfs (staged, written in the background)",
    "torch.save": "torch.save to local disk (no fsync)",
    "torch.save+fsync": "torch.save + fsync to local disk",
    "durable": "durable save, blocking, local fs",
    "durable async": "durable save(blocking=False): call + fence",
}
RESTORES = ("fast", "fs deep warm", "fs deep cold", "fs shallow warm", "s3 deep")
RESTORE_LABELS = {
    "fast": "fast tier (resume file `fast_step`; deep-verified in the trainer)",
    "fs deep warm": "durable local fs (resume file `step`; deep), page cache warm",
    "fs deep cold": "durable local fs (resume file `step`; deep), pages evicted",
    "fs shallow warm": "durable local fs, step the init container verified (shallow), warm",
    "s3 deep": "durable S3, loopback moto server (resume file `step`; deep)",
}


# ====================================================================== the model


def example_trainer() -> ModuleType:
    """``examples/ddp_train.py``, loaded from its file (it is a script, not a package)."""
    name = "rtj_bench_ddp_train"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / "ddp_train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass
class Trainer:
    model: nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    x: torch.Tensor
    y: torch.Tensor
    objects: dict[str, Any]

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def state_bytes(self) -> int:
        total = sum(p.numel() * p.element_size() for p in self.model.parameters())
        for st in self.opt.state.values():
            total += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
        return total

    def step(self) -> None:
        self.model.train()
        (self.model(self.x) - self.y).square().mean().backward()  # mse_loss
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        self.objects["samples_seen"] += BATCH

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "samples_seen": self.objects["samples_seen"],
        }


def build(hidden: int) -> Trainer:
    ex = example_trainer()
    torch.manual_seed(0)
    model = ex.make_model(hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, ex.lr_lambda(100_000, 100))
    x = torch.randn(BATCH, ex.DIM)
    y = torch.randn(BATCH, 1)
    objects = {"model": model, "optimizer": opt, "scheduler": sched, "samples_seen": 0}
    trainer = Trainer(model, opt, sched, x, y, objects)
    trainer.step()  # materialize AdamW's moments
    return trainer


# ====================================================================== statistics


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def p90(xs: Sequence[float]) -> float:
    """Nearest rank: with fewer than 10 samples, the largest."""
    ordered = sorted(xs)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def fmt_s(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(n: float) -> str:
    return f"{n / MiB:.1f} MiB" if n < 1 << 30 else f"{n / (1 << 30):.2f} GiB"


def quiesce() -> None:
    """Before every timed operation: no garbage to collect, no dirty pages of another
    measurement's to write back."""
    gc.collect()
    os.sync()


def timed(fn: Callable[[], object]) -> float:
    quiesce()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def fstype(path: Path) -> str:
    """The filesystem type ``path`` is on (the longest mount point above it)."""
    best, kind = "", "?"
    with contextlib.suppress(OSError), open("/proc/mounts") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) < 3:
                continue
            mount = parts[1]
            inside = str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best):
                best, kind = mount, parts[2]
    return kind


def evict(root: Path) -> None:
    """Drop the pages of every file under ``root`` from the page cache (they are fsynced),
    as for the first restore after a node loss; nothing else is touched."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


# ====================================================================== results


@dataclass
class SizeResult:
    hidden: int
    params: int
    state_bytes: int
    step_s: list[float] = field(default_factory=list)  # plain training steps
    stalls: dict[str, list[float]] = field(default_factory=dict)  # METHODS
    boundary_idle_s: list[float] = field(default_factory=list)  # step_boundary, not due
    async_published_s: list[float] = field(default_factory=list)  # save() to published
    fast_written_s: list[float] = field(default_factory=list)  # fast save to published
    # (steps trained while the save was in flight, their seconds less the stall)
    async_overlap: list[tuple[int, float]] = field(default_factory=list)
    fast_step_bytes: int = 0
    fast_held_steps: list[int] = field(default_factory=list)
    fast_held_bytes: int = 0
    durable_step_bytes: int = 0
    restores: dict[str, list[float]] = field(default_factory=dict)  # RESTORES
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after
    s3_save_s: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"MLP h={self.hidden} ({self.params / 1e6:.1f}M params)"

    @property
    def step_median(self) -> float:
        return med(self.step_s)


def contention_s(r: SizeResult) -> float:
    """Training time one background save takes from the steps it overlaps on these shared
    cores (their time less as many plain steps; the stall is counted apart)."""
    if not r.async_overlap:
        return 0.0
    extra = [seconds - n * r.step_median for n, seconds in r.async_overlap]
    return max(0.0, med(extra))


def publish_steps(r: SizeResult) -> int:
    """Steps one background save takes to publish: the shortest async interval (the next
    save waits for it)."""
    return max(1, math.ceil(med(r.async_published_s) / r.step_median))


def durable_options(r: SizeResult) -> list[tuple[str, float, int]]:
    """(the durable tier, its cost per save in seconds of training time, its shortest
    interval in steps)."""
    options = [("blocking, local fs", med(r.stalls["durable"]), 1)]
    if r.s3_save_s:
        options.append(("blocking, S3 (loopback moto)", med(r.s3_save_s), 1))
    stall, floor = med(r.stalls["durable async"]), publish_steps(r)
    options.append(("async, local fs: stall only (a GPU trainer)", stall, floor))
    options.append(
        ("async, local fs: stall + the CPU it takes from training (this trainer)",
         stall + contention_s(r), floor)
    )  # fmt: skip
    return options


@dataclass(frozen=True)
class LostRow:
    """One durable tier at one interval, alone and with the fast tier beside it: the stall
    overhead and the steps a failure loses on average (half the interval of the tier the
    job resumes from)."""

    durable: str
    durable_every: int  # M
    fast_every: int  # K
    overhead: float  # the durable tier's cost, a fraction of training time
    fast_overhead: float  # the fast tier's, added when it runs beside
    lost_alone: float  # M / 2: any failure, durable tier alone
    lost_with_fast: float  # min(K, M) / 2: a failure the pod survives, both tiers
    step_s: float


def fast_floor(r: SizeResult) -> int:
    """The fewest steps between fast saves: one is written in the background, and the next
    due while it is still being written is skipped."""
    if not r.fast_written_s or r.step_median <= 0:
        return 1
    return max(1, math.ceil(med(r.fast_written_s) / r.step_median - 1e-9))


def practical_interval(cost_s: float, step_s: float, budget: float, floor: int = 1) -> int:
    """The most frequent interval (in steps) whose cost is at most ``budget`` of the
    training time: ``cost / (interval * step) <= budget``; at least ``floor``."""
    if step_s <= 0:
        return floor
    return max(floor, math.ceil(cost_s / (budget * step_s) - 1e-9))


def lost_rows(
    r: SizeResult, budget: float | None, save_every: int, fast_every: int
) -> list[LostRow]:
    """With ``budget``: every tier at the most frequent interval whose cost is at most
    ``budget`` of training time (an async durable tier also at least the steps one save
    takes to publish). Without: the durable tier every ``save_every`` steps (the example
    trainer's ``--save-every``, or the async floor), the fast tier every ``fast_every``.

    With both tiers, a failure the pod survives resumes from the newer step of the two
    (the operator pins a fast step only when it is newer than the durable one): half of
    min(K, M) is lost; a node loss takes the pod's memory and still loses M / 2."""
    step = r.step_median
    fast = med(r.stalls["fast"])
    floor = fast_floor(r)
    k = max(fast_every, floor) if budget is None else practical_interval(fast, step, budget, floor)
    rows = []
    for name, cost, floor in durable_options(r):
        if budget is None:
            m = max(save_every, floor)
        else:
            m = practical_interval(cost, step, budget, floor)
        rows.append(
            LostRow(name, m, k, cost / (m * step), fast / (k * step), m / 2, min(k, m) / 2, step)
        )
    return rows


# ====================================================================== 1. stalls


def published(ckpt: Checkpointer, step: int) -> bool:
    report = ckpt.last_save
    return report is not None and report.step == step


def save_baseline(tr: Trainer, path: Path, fsync: bool) -> None:
    """What a user writes: ``torch.save`` of the state dicts to a new file."""
    with path.open("wb") as fh:
        torch.save(tr.state_dict(), fh)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())


def measure_stalls(
    tr: Trainer, result: SizeResult, work: Path, fast_root: Path, rounds: int
) -> SaveReport:
    """Rounds of every method, rotated; round 0 is an untimed warm-up. Returns the report of
    the newest durable step (the Checkpointers go, and the async save's staging buffers
    with them, before the restores)."""
    no_resume = work / "no-resume.json"
    durable = Checkpointer(
        work / "durable", keep_last=FAST_KEEP, resume_file=no_resume, restore_report=False
    )
    fast = Checkpointer(
        work / "fast-only-root", resume_file=no_resume, restore_report=False,
        fast_tier_dir=fast_root, fast_every_steps=FAST_EVERY, fast_keep=FAST_KEEP,
    )  # fmt: skip
    result.stalls = {m: [] for m in METHODS}
    fast_step = 0  # fast's step_boundary counter: odd ones do not save, even ones do
    durable_step = 0
    base_files: list[Path] = []

    def train() -> float:
        return timed(tr.step)

    for rnd in range(rounds + 1):
        keep = rnd > 0
        order = METHODS[rnd % len(METHODS) :] + METHODS[: rnd % len(METHODS)]
        for method in order:
            plain = train()
            if keep:
                result.step_s.append(plain)
            if method == "fast":
                fast_step += 1
                assert fast_step % FAST_EVERY != 0
                idle = timed(partial(fast.step_boundary, fast_step, tr.objects))
                train()
                fast_step += 1
                timed(partial(fast.step_boundary, fast_step, tr.objects))
                train()  # its optimizer.step() passes the fence (waits if not yet staged)
                tier = fast.fast_tier
                assert tier is not None
                tier.wait()
                fast_report = tier.last
                assert fast_report is not None and fast_report.step == fast_step
                if keep:  # the capture and copies on the training thread, plus the fence
                    result.boundary_idle_s.append(idle)
                    result.stalls["fast"].append(fast_report.stall)
                    result.fast_written_s.append(fast_report.seconds)
            elif method in ("torch.save", "torch.save+fsync"):
                path = work / f"baseline-{len(base_files)}.pt"
                base_files.append(path)
                fsync = method == "torch.save+fsync"
                took = timed(partial(save_baseline, tr, path, fsync))
                while len(base_files) > FAST_KEEP:  # untimed: a user's own cleanup
                    base_files.pop(0).unlink()
                if keep:
                    result.stalls[method].append(took)
            elif method == "durable":
                durable_step += 1
                took = timed(partial(durable.save, durable_step, tr.objects))
                if keep:
                    result.stalls["durable"].append(took)
            else:
                durable_step += 1
                quiesce()
                start = time.perf_counter()
                durable.save(durable_step, tr.objects, blocking=False)
                overlapped = 0  # training goes on until the save is published
                while overlapped < MAX_OVERLAP and not published(durable, durable_step):
                    tr.step()  # the first one's optimizer.step() waits for the staging
                    overlapped += 1
                took = time.perf_counter() - start
                durable.wait()
                report = durable.last_save
                assert report is not None and report.step == durable_step
                if keep:
                    result.stalls["durable async"].append(report.stall_seconds)
                    result.async_published_s.append(report.seconds)
                    result.async_overlap.append((overlapped, took - report.stall_seconds))
        print(
            f"  round {rnd}{' (warm-up)' if not keep else ''}: "
            + ", ".join(
                f"{m} {fmt_s(result.stalls[m][-1])}" for m in METHODS if keep and result.stalls[m]
            )
            + f"; step {fmt_s(result.step_s[-1]) if keep else '-'}; load {os.getloadavg()[0]:.2f}"
        )
    for path in base_files:
        path.unlink(missing_ok=True)
    if fast.fast_tier is not None:
        fast.fast_tier.wait()
    held = holdings(fast_root)
    result.fast_held_steps = held
    result.fast_held_bytes = tree_bytes(fast_root)
    result.fast_step_bytes = result.fast_held_bytes // max(1, len(held))
    newest = durable.last_save
    assert newest is not None
    result.durable_step_bytes = newest.bytes
    durable.close()
    fast.close()
    return newest


# ====================================================================== 2. restores


def resume_file(path: Path, body: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"skipped": [], "source": "bench.fast_tier", **body}))
    return path


@contextlib.contextmanager
def s3_server(work: Path) -> Iterator[tuple[str, Any]]:
    """The loopback moto server of the e2e tests, its credentials in this process's
    environment while it runs; yields (bucket, server)."""
    from e2e.s3server import S3Server, aws_env

    server = S3Server(work).start()
    saved = dict(os.environ)
    try:
        os.environ.update(aws_env(server.url, server.allowed))
        yield server.create_bucket(), server
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


def measure_restores(
    tr: Trainer,
    result: SizeResult,
    work: Path,
    fast_root: Path,
    durable: SaveReport,
    reps: int,
    s3_root: str | None,
) -> None:
    fast_held = holdings(fast_root)
    assert fast_held, "the fast tier holds no step"
    fast_step = fast_held[-1]
    durable_step = durable.step
    durable_uri = durable.uri
    pins = {
        "fast": resume_file(
            work / "resume-fast.json", {"step": durable_step, "fast_step": fast_step}
        ),
        "fs deep warm": resume_file(work / "resume-durable.json", {"step": durable_step}),
        "fs shallow warm": resume_file(
            work / "resume-verified.json",
            {"step": durable_step, "uri": durable_uri, "verification": "deep"},
        ),
    }
    pins["fs deep cold"] = pins["fs deep warm"]
    expected = {"fast": fast_step}
    kinds = [k for k in RESTORES if k != "s3 deep"]
    if s3_root is not None:
        s3 = Checkpointer(
            s3_root, keep_last=FAST_KEEP, resume_file=work / "no-resume.json", restore_report=False
        )
        for n in (1, 2):  # the same state twice: a new step each time (two saves timed)
            result.s3_save_s.append(timed(partial(s3.save, durable_step + n, tr.objects)))
        s3.close()
        pins["s3 deep"] = resume_file(work / "resume-s3.json", {"step": durable_step + 2})
        expected["s3 deep"] = durable_step + 2
        kinds.append("s3 deep")
    result.restores = {k: [] for k in kinds}
    for rep in range(reps):
        order = kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]
        for kind in order:
            root: Any = s3_root if kind == "s3 deep" else work / "durable"
            extra: dict[str, Any] = {}
            if kind == "fast":
                extra = {"fast_tier_dir": fast_root, "fast_every_steps": FAST_EVERY,
                         "fast_keep": FAST_KEEP}  # fmt: skip
            ckpt = Checkpointer(root, resume_file=pins[kind], restore_report=False, **extra)
            if kind == "fs deep cold":
                evict(work / "durable")
            took = timed(partial(ckpt.restore, tr.objects))
            report = ckpt.last_restore
            assert report is not None
            want = expected.get(kind, durable_step)
            if report.step != want or (kind == "fast") != (report.source == "fast-tier"):
                raise RuntimeError(f"restore {kind}: got step {report.step} from {report.source}")
            ckpt.close()
            result.restores[kind].append(took)
        print(
            f"  restore {rep + 1}: "
            + ", ".join(f"{k} {fmt_s(v[-1])}" for k, v in result.restores.items())
            + f"; load {os.getloadavg()[0]:.2f}"
        )


# ====================================================================== the run


def fast_dir_for(requested: Path | None) -> Path:
    base = requested
    if base is None:
        base = SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else Path(tempfile.gettempdir())
    return Path(tempfile.mkdtemp(prefix="rtj-bench-fast-tier-", dir=base))


def run(args: argparse.Namespace, context: dict[str, Any]) -> list[SizeResult]:
    logging.getLogger("rtj_shim").setLevel(logging.WARNING)
    example_trainer()
    gc.collect()
    gc.freeze()  # what the imports made: every quiesce() would walk it again (~0.2 s)
    base = args.work_dir or BENCH_DIR
    base.mkdir(parents=True, exist_ok=True)
    work_top = Path(tempfile.mkdtemp(prefix="fast-tier-", dir=base))
    fast_top = fast_dir_for(args.fast_dir)
    context.update(
        {
            "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "fast_dir": str(fast_top.parent),
            "fast_fs": fstype(fast_top),
            "durable_dir": str(work_top.parent),
            "durable_fs": fstype(work_top),
            "rounds": args.rounds,
            "restore_reps": args.restore_reps,
            "budget": args.budget,
            "save_every": args.save_every,
            "fast_every": args.fast_every,
        }
    )
    results: list[SizeResult] = []
    server: contextlib.AbstractContextManager[tuple[str, Any]] | None = None
    stack = contextlib.ExitStack()
    try:
        bucket = None
        if args.s3:
            server = s3_server(work_top)
            bucket, _ = stack.enter_context(server)
            context["s3"] = "moto (e2e.s3server), auth enforced, loopback on this machine"
        for hidden in args.hidden:
            tr = build(hidden)
            result = SizeResult(hidden, tr.params, tr.state_bytes())
            load_before = os.getloadavg()[0]
            print(f"\n{result.label}: {fmt_bytes(result.state_bytes)} of state")
            work = work_top / f"h{hidden}"
            fast_root = fast_top / f"h{hidden}"
            work.mkdir()
            try:
                newest = measure_stalls(tr, result, work, fast_root, args.rounds)
                gc.collect()
                s3_root = None if bucket is None else f"s3://{bucket}/h{hidden}"
                measure_restores(tr, result, work, fast_root, newest, args.restore_reps, s3_root)
            finally:
                shutil.rmtree(work, ignore_errors=True)
                shutil.rmtree(fast_root, ignore_errors=True)
            result.load = (load_before, os.getloadavg()[0])
            results.append(result)
            del tr
            gc.collect()
    finally:
        stack.close()
        shutil.rmtree(work_top, ignore_errors=True)
        shutil.rmtree(fast_top, ignore_errors=True)
    return results


# ====================================================================== output


def stall_table(results: list[SizeResult]) -> list[str]:
    out = [
        "| model (state) | method | median | p90 | % of one step | vs torch.save |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        step = r.step_median
        base = med(r.stalls["torch.save"])
        out.append(
            f"| {r.label} ({fmt_bytes(r.state_bytes)}) | one training step (no save) | "
            f"{fmt_s(step)} | {fmt_s(p90(r.step_s))} | 100% | - |"
        )
        for m in METHODS:
            xs = r.stalls[m]
            out.append(
                f"| | {LABELS[m]} | {fmt_s(med(xs))} | {fmt_s(p90(xs))} | "
                f"{100 * med(xs) / step:.1f}% | {med(xs) / base:.2f}x |"
            )
    return out


def restore_table(results: list[SizeResult]) -> list[str]:
    out = [
        "| model (state) | restore from | median | p90 | vs durable fs (deep, warm) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        base = med(r.restores["fs deep warm"])
        first = True
        for kind in RESTORES:
            xs = r.restores.get(kind)
            if not xs:
                continue
            model = f"{r.label} ({fmt_bytes(r.state_bytes)})" if first else ""
            first = False
            out.append(
                f"| {model} | {RESTORE_LABELS[kind]} | {fmt_s(med(xs))} | {fmt_s(p90(xs))} | "
                f"{med(xs) / base:.2f}x |"
            )
    return out


def lost_table(results: list[SizeResult], budget: float | None, save_every: int,
               fast_every: int) -> list[str]:  # fmt: skip
    out = [
        "| model (step) | durable tier | every M | overhead | lost steps per failure, "
        "alone | + fast every K | overhead, both | lost steps, failure the pod survives | "
        "lost work | lost steps, node loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for i, row in enumerate(lost_rows(r, budget, save_every, fast_every)):
            model = f"{r.label} ({fmt_s(r.step_median)})" if i == 0 else ""
            both = row.overhead + row.fast_overhead
            out.append(
                f"| {model} | {row.durable} | {row.durable_every} | "
                f"{100 * row.overhead:.2f}% | {row.lost_alone:g} | K = {row.fast_every} | "
                f"{100 * both:.2f}% | {row.lost_with_fast:g} | "
                f"{fmt_s(row.lost_alone * row.step_s)} → "
                f"{fmt_s(row.lost_with_fast * row.step_s)} | {row.lost_alone:g} |"
            )
    return out


def arithmetic_text(results: list[SizeResult], budget: float) -> list[str]:
    out = []
    for r in results:
        step = r.step_median
        fast = med(r.stalls["fast"])
        floor = fast_floor(r)
        k = practical_interval(fast, step, budget, floor)
        written = f", at least {floor} (its background write)" if floor > 1 else ""
        terms = [
            f"fast K = ⌈{fmt_s(fast)} / ({budget:.0%} x {fmt_s(step)})⌉{written} = {k}"
        ]  # fmt: skip
        gains = []
        for name, cost, floor in durable_options(r):
            m = practical_interval(cost, step, budget, floor)
            floor_text = f", at least {floor} (publish)" if floor > 1 else ""
            terms.append(f"{name} M = ⌈{fmt_s(cost)} / ({budget:.0%} x {fmt_s(step)})⌉"
                         f"{floor_text} = {m}")  # fmt: skip
            if k < m:
                gains.append(f"{name}: {m / 2:g} → {k / 2:g}")
        verdict = (
            "the fast tier lowers the expected loss of a failure the pod survives beside "
            + "; ".join(gains)
            if gains
            else "K is no shorter than any durable M: the fast tier saves no steps here"
        )
        out.append(f"- {r.label}, step {fmt_s(step)}: " + "; ".join(terms) + f". So {verdict}.")
    return out


def summary_table(results: list[SizeResult]) -> list[str]:
    out = [
        "| model (state) | step | fast-tier stall | ÷ durable blocking | ÷ durable async "
        "stall | ÷ torch.save | fast restore | ÷ durable fs (deep, warm) | ÷ S3 | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        fast = med(r.stalls["fast"])
        restore = med(r.restores["fast"])
        s3 = r.restores.get("s3 deep")
        out.append(
            f"| {r.label} ({fmt_bytes(r.state_bytes)}) | {fmt_s(r.step_median)} | "
            f"{fmt_s(fast)} | {fast / med(r.stalls['durable']):.2f}x | "
            f"{fast / med(r.stalls['durable async']):.2f}x | "
            f"{fast / med(r.stalls['torch.save']):.2f}x | {fmt_s(restore)} | "
            f"{restore / med(r.restores['fs deep warm']):.2f}x | "
            f"{'-' if not s3 else f'{restore / med(s3):.2f}x'} | "
            f"{r.load[0]:.2f} → {r.load[1]:.2f} |"
        )
    return out


def markdown(results: list[SizeResult], context: dict[str, Any]) -> str:
    loads = context.get("loadavg_start", ()), context.get("loadavg_end", ())
    start, end = (" ".join(f"{x:.2f}" for x in values) for values in loads)
    budget, save_every = context["budget"], context["save_every"]
    fast_every = context["fast_every"]
    s3 = context.get("s3")
    out = [
        "# Fast checkpoint tier benchmark (issue 16)",
        "",
        f"`python -m bench.fast_tier`: one process (world size 1), CPU, {context['cpus']} CPUs "
        f"({context['threads']} torch threads), torch {context['torch']}, Python "
        f"{context['python']}. Load average at start {start}, at end {end}; "
        f"{context.get('started', '?')} to {context.get('ended', '?')} UTC.",
        "",
        f"The model is the example trainer's (`examples/ddp_train.py` `make_model`, AdamW, "
        f"LambdaLR), a fixed batch of {BATCH}. Fast tier: `{context['fast_dir']}` "
        f"({context['fast_fs']}), `fast_every_steps={FAST_EVERY}`, `fast_keep={FAST_KEEP}`. "
        f"Durable store and `torch.save` files: `{context['durable_dir']}` "
        f"({context['durable_fs']}, local disk). {context['rounds']} timed rounds after one "
        f"untimed warm-up, every method once a round, the order rotated; "
        f"{context['restore_reps']} restores of each kind. p90 is the nearest rank (with "
        "fewer than 10 samples, the largest).",
        "",
        "## Summary",
        "",
        "Medians; the load column is the 1-minute load average before and after the model's "
        "measurements (other work shares this machine).",
        "",
        *summary_table(results),
        "",
        "## 1. Training-thread stall per save",
        "",
        "Fast tier: what the training thread spends on a fast save "
        "(`Checkpointer.fast_tier.last.stall`): the capture and the copies of what the next "
        "forward and backward may change, in the `step_boundary` that saves, plus the fence's "
        "wait at the next `optimizer.step()` if the writer thread had not yet copied the "
        "optimizer-owned tensors. The serialization with SHA-256 into tmpfs, manifest, "
        "COMMITTED, rename and retention run on the writer thread. Durable async: the "
        "`save()` call plus the wait for staging at the next `optimizer.step()` "
        "(`SaveReport.stall_seconds`).",
        "",
        *stall_table(results),
        "",
    ]
    for r in results:
        out.append(
            f"- {r.label}: non-saving `step_boundary` {fmt_s(med(r.boundary_idle_s))}; "
            f"a fast step published {fmt_s(med(r.fast_written_s))} after its `step_boundary` "
            f"(p90 {fmt_s(p90(r.fast_written_s))}); "
            f"durable async published {fmt_s(med(r.async_published_s))} after the call "
            f"(p90 {fmt_s(p90(r.async_published_s))}), while training went on for "
            f"{med([n for n, _ in r.async_overlap]):g} step(s) that took "
            f"{fmt_s(contention_s(r))} longer than as many plain steps (the background save "
            f"shares the two cores). The fast tier holds steps {r.fast_held_steps}: "
            f"{fmt_bytes(r.fast_held_bytes)} of tmpfs ({fmt_bytes(r.fast_step_bytes)} a step; "
            f"a durable step is {fmt_bytes(r.durable_step_bytes)}); while a save runs, before "
            f"retention removes the oldest, it holds {FAST_KEEP + 1}."
        )
    out += [
        "",
        "## 2. Restore time",
        "",
        "A fresh `Checkpointer` each time (as a restarted trainer), `restore()` of the "
        "newest step into the live model, optimizer and scheduler. The fast tier is always "
        "in memory (tmpfs); the durable filesystem restore twice, with the step's pages in "
        "the page cache and evicted (`posix_fadvise(DONTNEED)`). "
        + (f"S3: {s3}." if s3 else "S3: not measured in this run (`--no-s3`)."),
        "",
        *restore_table(results),
        "",
    ]
    if any(r.s3_save_s for r in results):
        out.append(
            "Durable blocking saves to that S3 server (the two that put the restored steps "
            "there): "
            + "; ".join(
                f"{r.label} {', '.join(fmt_s(x) for x in r.s3_save_s)}"
                for r in results
                if r.s3_save_s
            )
            + "."
        )
        out.append("")
    out += [
        "## 3. Lost steps per failure",
        "",
        "A failure loses, on average, half the interval of the tier the job resumes from "
        "(it falls uniformly between two saves), plus the restore of section 2. With both "
        "tiers, a failure the pod survives (a process crash, an in-place restart) resumes "
        "from the newer step of the two, so it loses min(K, M) / 2; a node loss takes the "
        "pod's memory and still loses M / 2. A tier's overhead is its cost per save (the "
        "medians of section 1) over the training time of its interval. Durable tiers: the "
        "blocking save to the local filesystem; to S3 (the blocking saves of section 2, "
        "n = 2); the async save counted by its stall alone (a GPU trainer, whose steps do "
        "not wait for the cores the background save uses) and counted with the training "
        "time it took from the steps it overlapped on these two cores (this CPU trainer). "
        "An async interval is at least the steps one save takes to publish (the next save "
        "waits for it); a fast interval at least the steps one fast save takes to be written "
        "(the next one due meanwhile is skipped). The fast tier's overhead here is its stall; "
        "its background write shares the cores as the async durable save's does (on this CPU "
        "trainer that costs what the async row 'stall + the CPU it takes' shows, per byte).",
        "",
        f"### Each tier at its practical interval: overhead at most {budget:.0%}",
        "",
        f"`interval = ⌈cost / ({budget:.0%} x step)⌉`.",
        "",
        *lost_table(results, budget, save_every, fast_every),
        "",
        *arithmetic_text(results, budget),
        "",
        f"### The example trainer's interval: durable every {save_every}, fast every {fast_every}",
        "",
        f"`examples/ddp_train.py --save-every {save_every}` (an async interval no shorter "
        f"than its publish), the fast tier every {fast_every} steps beside it.",
        "",
        *lost_table(results, None, save_every, fast_every),
        "",
        "2 ranks (gloo) were not run: a fast save has no collective (each rank writes its "
        "own copy into its own directory), so on this 2-core machine a second rank would "
        "only measure the two ranks' contention for the cores.",
    ]
    notes = [n for r in results for n in r.notes]
    if notes:
        out += ["", *notes]
    return "\n".join(out) + "\n"


def print_summary(results: list[SizeResult]) -> None:
    print()
    for line in [*stall_table(results), "", *restore_table(results)]:
        print(line)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hidden", default=",".join(map(str, DEFAULT_HIDDEN)),
                        help="comma-separated MLP widths")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--restore-reps", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0.01,
                        help="stall budget per tier for the practical intervals")  # fmt: skip
    parser.add_argument("--save-every", type=int, default=50,
                        help="the example trainer's durable interval")  # fmt: skip
    parser.add_argument("--fast-every", type=int, default=5,
                        help="the fast interval beside it, in the example scenario")  # fmt: skip
    parser.add_argument("--no-s3", dest="s3", action="store_false")
    parser.add_argument("--quick", action="store_true", help="tiny models, 2 rounds, no S3")
    parser.add_argument("--work-dir", type=Path, help="durable store's parent (.bench/)")
    parser.add_argument("--fast-dir", type=Path, help="fast tier's parent (/dev/shm)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path, help="also write the Markdown report")
    args = parser.parse_args(argv)
    args.hidden = [int(h) for h in str(args.hidden).split(",") if h]
    if args.quick:
        args.hidden, args.rounds, args.restore_reps, args.s3 = list(QUICK_HIDDEN), 2, 1, False
    context: dict[str, Any] = {
        "loadavg_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    try:
        results = run(args, context)
    except KeyboardInterrupt:
        return 130
    except Exception:
        traceback.print_exc()
        print("fast_tier bench: error", file=sys.stderr)
        return 1
    context["loadavg_end"] = os.getloadavg()
    context["ended"] = time.strftime("%H:%M", time.gmtime())
    print_summary(results)
    print(
        "load average: start "
        + " ".join(f"{x:.2f}" for x in context["loadavg_start"])
        + ", end "
        + " ".join(f"{x:.2f}" for x in context["loadavg_end"])
    )
    if args.json:
        body = {"context": context, "results": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(body, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(results, context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
