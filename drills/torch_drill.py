"""The exact-resume drill: real torchrun jobs (2 ranks, gloo, CPU) killed and resumed.

Scenarios (each a fresh checkpoint root unless noted):

1. baseline: 200 steps, a checkpoint every 50, no fault;
2. kill: rank 1 is SIGKILLed after step 135; torchrun restarts the group, which resumes from
   step 100; losses, learning rates and sample ids of steps 101-200 must equal the
   baseline's bit for bit, and every epoch must see every sample exactly once;
3. corrupt (on scenario 2's root): one shard of step 150 gets a flipped byte and step 200
   loses its COMMITTED; a restart resumes from 100, reports why it skipped 200 and 150,
   replaces them, and again matches the baseline;
4. kill in save: rank 1 is SIGKILLed inside its shard write of step 150; the restart
   resumes from 100 (the half-written step is never resumed) and matches the baseline;
5. fsdp: a 2-rank FSDP2 job saves step 20; one process (plain module) restores it and
   its full model and optimizer state equal the 2-rank job's.

Prints a summary table (resume step, lost steps, save and load times) and exits non-zero if
any check fails. Every subprocess has a timeout: a hang is a failure, never a stuck CI.

    python drills/torch_drill.py [--workdir DIR] [--repeat N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "ddp_train.py"
STEPS = 200
SAVE_EVERY = 50
KILL_STEP = 135
SAMPLES = 512
RUN_TIMEOUT_S = 240.0
COMMON = ["--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--shard-kib", "16"]


@dataclass
class Result:
    scenario: str
    ok: bool
    resume_step: int | None = None
    lost_steps: int | None = None
    save_s: float | None = None
    load_s: float | None = None
    seconds: float = 0.0
    detail: list[str] = field(default_factory=list)


class DrillFailure(AssertionError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(args: list[str], out: Path, nproc: int = 2, restarts: int = 1) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        str(restarts),
        "--monitor-interval",
        "0.2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(EXAMPLE),
        *args,
    ]
    run(cmd, out)


def run(cmd: list[str], out: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("RTJ_RESUME_FILE", None)
    with out.open("w") as fh:
        try:
            proc = subprocess.run(
                cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=RUN_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            raise DrillFailure(f"timed out after {RUN_TIMEOUT_S:.0f}s (see {out})") from exc
    if proc.returncode != 0:
        tail = "\n".join(out.read_text(errors="replace").splitlines()[-25:])
        raise DrillFailure(f"exit code {proc.returncode} (see {out}):\n{tail}")


def records(log_dir: Path, rank: int) -> list[dict[str, Any]]:
    path = log_dir / f"rank-{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_by_incarnation(recs: list[dict[str, Any]]) -> dict[int, dict[int, dict[str, Any]]]:
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for r in recs:
        if "event" not in r:
            out.setdefault(r["restart"], {})[r["step"]] = r
    return out


def events(recs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in recs if r.get("event") == name]


def timeline(log_dir: Path, rank: int) -> dict[int, dict[str, Any]]:
    """The steps that count: each step as logged by the newest incarnation that ran it."""
    merged: dict[int, dict[str, Any]] = {}
    for _, steps in sorted(steps_by_incarnation(records(log_dir, rank)).items()):
        merged.update(steps)
    return merged


def check(cond: bool, message: str) -> None:
    if not cond:
        raise DrillFailure(message)


def compare_to_baseline(base: Path, run_dir: Path, first: int, result: Result) -> None:
    for rank in (0, 1):
        want = timeline(base, rank)
        got = timeline(run_dir, rank)
        check(sorted(got) == list(range(1, STEPS + 1)), f"rank {rank}: steps missing in {run_dir}")
        for step in range(first, STEPS + 1):
            a, b = want[step], got[step]
            for key in ("loss", "lr", "samples", "seen"):
                check(
                    a[key] == b[key],
                    f"rank {rank} step {step}: {key} {b[key]!r} != baseline {a[key]!r}",
                )
    result.detail.append(f"steps {first}-{STEPS}: loss, lr, samples, seen bit-identical on 2 ranks")
    check_epochs(run_dir)
    result.detail.append("sampler: every epoch saw every sample exactly once")


def check_epochs(run_dir: Path) -> None:
    """Within every epoch each sample is drawn at most once, and complete epochs see all."""
    seen: dict[int, Counter[int]] = {}
    for rank in (0, 1):
        for rec in timeline(run_dir, rank).values():
            # 16 steps per epoch exactly, so a step never straddles two epochs
            seen.setdefault(rec["epoch"], Counter()).update(rec["samples"])
    last = max(seen)
    for epoch, counter in sorted(seen.items()):
        repeated = [s for s, n in counter.items() if n > 1]
        check(not repeated, f"epoch {epoch}: samples {repeated[:5]} drawn more than once")
        if epoch != last:
            check(len(counter) == SAMPLES, f"epoch {epoch}: {SAMPLES - len(counter)} skipped")


def restore_event(log_dir: Path, restart: int) -> dict[str, Any]:
    found = [e for e in events(records(log_dir, 0), "restore") if e["restart"] == restart]
    check(len(found) == 1, f"no restore logged by incarnation {restart} in {log_dir}")
    return found[0]


def mean_save(log_dir: Path) -> float | None:
    saves = [e["seconds"] for e in events(records(log_dir, 0), "save")]
    return sum(saves) / len(saves) if saves else None


# ------------------------------------------------------------------------ scenarios


def baseline(work: Path) -> Result:
    res = Result("1 baseline", ok=False)
    logs = work / "baseline" / "logs"
    torchrun(
        ["--root", str(work / "baseline" / "ckpt"), "--log-dir", str(logs), *COMMON],
        work / "baseline.out",
    )
    check(sorted(timeline(logs, 0)) == list(range(1, STEPS + 1)), "baseline incomplete")
    check_epochs(logs)
    res.resume_step, res.lost_steps = 0, 0
    res.save_s = mean_save(logs)
    res.load_s = restore_event(logs, 0)["seconds"]
    res.detail.append(f"{STEPS} steps, checkpoints at {list(range(50, STEPS + 1, 50))}")
    return res


def kill(work: Path) -> Result:
    res = Result(f"2 SIGKILL rank 1 at step {KILL_STEP}", ok=False)
    base = work / "kill"
    logs = base / "logs"
    torchrun(
        [
            "--root",
            str(base / "ckpt"),
            "--log-dir",
            str(logs),
            *COMMON,
            "--fault-kill-step",
            str(KILL_STEP),
        ],
        work / "kill.out",
    )
    ev = restore_event(logs, 1)
    check(ev["step"] == 100, f"resumed from {ev['step']}, expected 100")
    res.resume_step = ev["step"]
    res.lost_steps = KILL_STEP - ev["step"]
    res.load_s = ev["seconds"]
    res.save_s = mean_save(logs)
    first = steps_by_incarnation(records(logs, 0))[0]
    check(max(first) == KILL_STEP, f"first incarnation ran to {max(first)}")
    compare_to_baseline(work / "baseline" / "logs", logs, 101, res)
    return res


def corrupt(work: Path) -> Result:
    res = Result("3 corrupt shard @150, no COMMITTED @200", ok=False)
    base = work / "kill"
    steps = base / "ckpt" / "steps"
    manifest = json.loads((steps / "step-000000000150" / "manifest.json").read_text())
    shard = next(f["path"] for f in manifest["files"] if "shard" in f["path"])
    target = steps / "step-000000000150" / shard
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only deep verification can tell
    target.write_bytes(bytes(data))
    (steps / "step-000000000200" / "COMMITTED").unlink()
    logs = base / "logs3"
    torchrun(["--root", str(base / "ckpt"), "--log-dir", str(logs), *COMMON], work / "corrupt.out")
    ev = restore_event(logs, 0)
    check(ev["step"] == 100, f"resumed from {ev['step']}, expected 100")
    skipped = {s["step"]: s["reason"] for s in ev["skipped"]}
    check(200 in skipped and "COMMITTED" in skipped[200], f"step 200 not reported: {skipped}")
    check(150 in skipped and "sha256" in skipped[150], f"step 150 not reported: {skipped}")
    res.detail.extend(f"skipped {s}: {r}" for s, r in sorted(skipped.items(), reverse=True))
    res.resume_step, res.lost_steps = 100, STEPS - 100
    res.load_s, res.save_s = ev["seconds"], mean_save(logs)
    # the resumed run replaced the broken steps with good ones
    for step in (150, 200):
        check((steps / f"step-{step:012d}" / "COMMITTED").exists(), f"step {step} not re-saved")
    verify = subprocess.run(
        [sys.executable, "-m", "rtj_shim.cli", "resolve", "--root", str(base / "ckpt"), "--deep"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    check(json.loads(verify.stdout)["step"] == STEPS, f"root does not resolve to {STEPS}")
    res.detail.append(f"steps 150 and 200 re-published; deep resolve -> {STEPS}")
    merged = base / "logs3-merged"
    merged.mkdir(exist_ok=True)
    for rank in (0, 1):  # steps 1-100 of the original run, 101-200 of this one
        old = [r for r in records(base / "logs", rank) if "event" not in r and r["step"] <= 100]
        new = [r for r in records(logs, rank) if "event" not in r]
        lines = [json.dumps({**r, "restart": 0 if r in old else 1}) for r in old + new]
        (merged / f"rank-{rank}.jsonl").write_text("\n".join(lines) + "\n")
    compare_to_baseline(work / "baseline" / "logs", merged, 101, res)
    return res


def kill_in_save(work: Path) -> Result:
    res = Result("4 SIGKILL inside the save of step 150", ok=False)
    base = work / "killsave"
    logs = base / "logs"
    torchrun(
        [
            "--root",
            str(base / "ckpt"),
            "--log-dir",
            str(logs),
            *COMMON,
            "--fault-kill-in-save",
            "150",
        ],
        work / "killsave.out",
    )
    text = (work / "killsave.out").read_text(errors="replace")
    check("fault: SIGKILL inside the write of common/shard-" in text, "the fault did not fire")
    ev = restore_event(logs, 1)
    check(ev["step"] == 100, f"resumed from {ev['step']}, expected 100")
    reasons = [s["reason"] for s in ev["skipped"] if s["step"] == 150]
    check(bool(reasons) and "in progress" in reasons[0], f"step 150 not reported: {ev}")
    res.detail.append(f"skipped 150: {reasons[0]}")
    res.resume_step, res.lost_steps = 100, 50
    res.load_s, res.save_s = ev["seconds"], mean_save(logs)
    compare_to_baseline(work / "baseline" / "logs", logs, 101, res)
    return res


def fsdp(work: Path) -> Result:
    res = Result("5 FSDP 2 ranks -> 1 rank", ok=False)
    base = work / "fsdp"
    ckpt = base / "ckpt"
    args = ["--root", str(ckpt), "--fsdp", "--steps", "20", "--save-every", "10"]
    torchrun(
        [*args, "--log-dir", str(base / "logs2"), "--dump-state", str(base / "two.pt")],
        work / "fsdp2.out",
        restarts=0,
    )
    run(
        [
            sys.executable,
            str(EXAMPLE),
            *args,
            "--log-dir",
            str(base / "logs1"),
            "--dump-state",
            str(base / "one.pt"),
        ],
        work / "fsdp1.out",
    )
    ev = restore_event(base / "logs1", 0)
    check(ev["step"] == 20, f"1 rank resumed from {ev['step']}, expected 20")
    import torch  # only this scenario needs it in the drill process

    two = torch.load(base / "two.pt", weights_only=True)
    one = torch.load(base / "one.pt", weights_only=True)
    diffs = diff_states(two, one)
    check(not diffs, f"state differs after resharding: {diffs[:5]}")
    n = sum(1 for _ in leaves(two))
    res.detail.append(f"model + optimizer: {n} leaves identical after 2 -> 1 resharding")
    res.detail.extend(ev["notes"])
    res.resume_step, res.lost_steps = 20, 0
    res.load_s, res.save_s = ev["seconds"], mean_save(base / "logs2")
    return res


def leaves(x: Any, path: str = "") -> Any:
    if isinstance(x, dict):
        for k in sorted(x, key=str):
            yield from leaves(x[k], f"{path}.{k}")
    elif isinstance(x, list | tuple):
        for i, v in enumerate(x):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, x


def diff_states(a: Any, b: Any) -> list[str]:
    import torch

    la, lb = dict(leaves(a)), dict(leaves(b))
    if set(la) != set(lb):
        return [f"keys differ: {sorted(set(la) ^ set(lb))[:5]}"]
    out = []
    for k, v in la.items():
        w = lb[k]
        same = torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w
        if not same:
            out.append(k)
    return out


SCENARIOS = [baseline, kill, corrupt, kill_in_save, fsdp]


def run_all(work: Path) -> list[Result]:
    results = []
    for scenario in SCENARIOS:
        started = time.monotonic()
        try:
            res = scenario(work)
            res.ok = True
        except DrillFailure as exc:
            res = Result(scenario.__name__, ok=False, detail=[str(exc)])
        res.seconds = time.monotonic() - started
        results.append(res)
        if not res.ok and scenario is baseline:
            break
    return results


def table(results: list[Result]) -> str:
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f} ms"

    head = (
        f"{'scenario':<42} {'result':<6} {'resume':>6} {'lost':>5} "
        f"{'save':>8} {'load':>8} {'wall':>6}"
    )
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(
            f"{r.scenario:<42} {'PASS' if r.ok else 'FAIL':<6} "
            f"{'-' if r.resume_step is None else r.resume_step:>6} "
            f"{'-' if r.lost_steps is None else r.lost_steps:>5} "
            f"{f(r.save_s):>8} {f(r.load_s):>8} {r.seconds:>5.1f}s"
        )
        rows.extend(f"    {d}" for d in r.detail)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="exact-resume drill (torchrun, 2 ranks, gloo)")
    p.add_argument("--workdir", type=Path, help="keep everything here (default: a temp dir)")
    p.add_argument("--repeat", type=int, default=1, help="run the whole drill N times")
    p.add_argument("--json", type=Path, help="write the results as JSON")
    args = p.parse_args(argv)
    passes = 0
    all_results = []
    for i in range(args.repeat):
        work = (
            (args.workdir / f"run-{i}")
            if args.workdir
            else Path(tempfile.mkdtemp(prefix="rtj-drill-"))
        )
        if work.exists() and args.workdir:
            shutil.rmtree(work)
        work.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        results = run_all(work)
        ok = all(r.ok for r in results) and len(results) == len(SCENARIOS)
        passes += ok
        print(
            f"\n== drill run {i + 1}/{args.repeat}: {'PASS' if ok else 'FAIL'} "
            f"in {time.monotonic() - started:.1f}s ({work})"
        )
        print(table(results), flush=True)
        all_results.append([asdict(r) for r in results])
        if ok and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\ndrill: {passes} of {args.repeat} run(s) passed")
    if args.json:
        args.json.write_text(json.dumps({"passes": passes, "runs": all_results}, indent=2))
    return 0 if passes == args.repeat else 1


if __name__ == "__main__":
    sys.exit(main())
