"""What the silent-corruption defences cost a training step, how many steps they take to
catch a fault, and whether they ever cry wolf (issue 43 section 2: step-time overhead below
1% at the default interval, detection latency in steps, no false positive in the bench's
runs), in real worlds of gloo ranks on this machine.

Each world trains the same DDP model (an MLP of ``--hidden`` units, AdamW, a fixed batch
stream) for ``--steps`` steps after a warm-up, calling ``Checkpointer.step_boundary`` with
the loss and the gradient norm every step and saving every ``--save-every`` steps. The
worlds, interleaved, ``--rounds`` times each (the fastest round of each counts):

* ``baseline``: the Checkpointer with its defaults (the non-finite check and the exact
  replica checksums at each save, the data alignment bookkeeping);
* ``guard``: plus an ``AnomalyGuard`` and ``watch_gradients`` (each rank's gradient norm
  before DDP's all-reduce, a communication hook), judged at each save;
* ``guard+every-K``: the same with ``IntegrityOptions(every_steps=K)``, the verdict between
  saves, for each K of ``--every``.

Then the detection worlds: a bit flipped in rank 1's weights, and rank 1's gradient scaled
ten thousand times before the all-reduce, at step ``--fault-at``, with the verdict every K
steps: the step at which every rank raised ``SuspectState``, and the ranks it named.

    python -m bench.sdc_overhead [--steps 400] [--every 10,100] [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import free_port

TARGET = 0.01
WARMUP = 30


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from rtj_shim.torch import AnomalyGuard, Checkpointer, IntegrityOptions, SuspectState

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, args.hidden), nn.GELU(), nn.Linear(args.hidden, 256),
                        nn.GELU(), nn.Linear(256, 1))  # fmt: skip
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guarded = args.mode != "baseline"
    integrity = IntegrityOptions(
        anomaly_guard=AnomalyGuard() if guarded else None, every_steps=args.every or None
    )
    ckpt = Checkpointer(Path(args.root), every_steps=args.save_every, integrity=integrity)
    if guarded:
        ckpt.watch_gradients(model)
    scale = {"now": False}
    if args.fault == "scaled" and rank == 1:
        for p in net.parameters():
            p.register_hook(lambda g: g * 1e4 if scale["now"] else g)
    data = torch.Generator().manual_seed(100 + rank)
    w = torch.randn(256, 1, generator=torch.Generator().manual_seed(7))
    objects = {"model": model, "opt": opt}
    times: list[float] = []
    caught: dict[str, Any] | None = None
    for step in range(1, args.steps + WARMUP + 1):
        started = time.perf_counter()
        x = torch.randn(64, 256, generator=data)
        loss = (model(x) - torch.tanh(x @ w)).pow(2).mean()
        scale["now"] = args.fault == "scaled" and step == args.fault_at
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        opt.step()
        opt.zero_grad()
        if args.fault == "flip" and step == args.fault_at and rank == 1:
            with torch.no_grad():
                net[0].weight.view(-1).view(torch.int32)[4097] ^= 1 << 20
        try:
            ckpt.step_boundary(step, objects, loss=loss.detach(), grad_norm=norm)
        except SuspectState as exc:
            verdict = exc.verdict
            caught = {"step": step, "ranks": list(verdict.ranks) if verdict else None,
                      "kind": verdict.kind.value if verdict else None}  # fmt: skip
            break
        if step > WARMUP:
            times.append(time.perf_counter() - started)
    ckpt.close()
    out = {"rank": rank, "seconds": sum(times), "steps": len(times), "caught": caught,
           "median_step_ms": statistics.median(times) * 1e3 if times else None}  # fmt: skip
    Path(args.out, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def _world(
    args: argparse.Namespace, mode: str, every: int = 0, fault: str = "", steps: int = 0
) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        port, procs = free_port(), []
        for rank in range(args.ranks):
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "RANK": str(rank), "WORLD_SIZE": str(args.ranks), "OMP_NUM_THREADS": "1",
                   "RTJ_PROGRESS_DIR": str(Path(tmp, f"progress-{rank}")),
                   "RTJ_RESUME_FILE": str(Path(tmp, f"resume-{rank}.json"))}  # fmt: skip
            argv = [sys.executable, "-m", "bench.sdc_overhead", "--rank-main", "--mode", mode,
                    "--root", str(Path(tmp, "ckpt")), "--out", tmp, "--every", str(every),
                    "--steps", str(steps or args.steps), "--save-every", str(args.save_every),
                    "--hidden", str(args.hidden), "--fault", fault,
                    "--fault-at", str(args.fault_at)]  # fmt: skip
            procs.append(subprocess.Popen(argv, env=env))
        codes = [proc.wait() for proc in procs]
        if any(codes):
            raise SystemExit(f"sdc_overhead: a rank of {mode} failed: {codes}")
        return [json.loads(Path(tmp, f"rank-{r}.json").read_text()) for r in range(args.ranks)]


def _per_step(ranks: list[dict[str, Any]]) -> float:
    """The slowest rank's mean step time (seconds)."""
    return max(r["seconds"] / r["steps"] for r in ranks)


def _overheads(args: argparse.Namespace) -> dict[str, Any]:
    """Every world ``--rounds`` times, interleaved (baseline, guard, each K, then again), so
    a drift of the machine touches every world alike; each world's figure is its fastest
    round (the one least disturbed)."""
    plan = [("baseline", "baseline", 0), ("guard", "guard", 0)]
    plan += [(f"guard+every-{k}", "guard", k) for k in args.every]
    rounds: dict[str, list[list[dict[str, Any]]]] = {name: [] for name, _, _ in plan}
    for _ in range(args.rounds):
        for name, mode, every in plan:
            rounds[name].append(_world(args, mode, every=every))
    base = min(_per_step(ranks) for ranks in rounds["baseline"])
    rows = {
        name: {"ms_per_step": min(_per_step(r) for r in runs) * 1e3,
               "ratio": min(_per_step(r) for r in runs) / base,
               "rounds_ms": [_per_step(r) * 1e3 for r in runs],
               "false_positives": sum(1 for r in runs for rank in r if rank["caught"])}
        for name, runs in rounds.items()
    }  # fmt: skip
    return {"baseline_ms_per_step": base * 1e3, "worlds": rows}


def _detections(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    steps = args.fault_at + max(args.every) + 5
    for fault in ("flip", "scaled"):
        for k in args.every:
            ranks = _world(args, "guard", every=k, fault=fault, steps=steps)
            caught = [r["caught"] for r in ranks]
            first = caught[0]
            out.append({"fault": fault, "every": k, "fault_at": args.fault_at,
                        "caught_at": first["step"] if first else None,
                        "latency_steps": first["step"] - args.fault_at if first else None,
                        "named": first["ranks"] if first else None,
                        "kind": first["kind"] if first else None,
                        "every_rank_agreed": all(c == first for c in caught)})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--every", type=lambda s: [int(x) for x in s.split(",") if x], default=[10, 100])
    p.add_argument("--fault-at", type=int, default=WARMUP + 57)
    p.add_argument("--json", type=Path)
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--fault", default="", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_main:
        args.every = args.every[0] if args.every else 0
        rank_main(args)
        return 0
    overheads = _overheads(args)
    detections = _detections(args)
    result = {"ranks": args.ranks, "steps": args.steps, "save_every": args.save_every,
              "hidden": args.hidden, "target": TARGET, **overheads,
              "detections": detections}  # fmt: skip
    print(f"baseline {overheads['baseline_ms_per_step']:.2f} ms/step ({args.ranks} ranks)")
    for name, row in overheads["worlds"].items():
        print(f"  {name}: {row['ms_per_step']:.2f} ms/step, {row['ratio']:.4f}x "
              f"(rounds {', '.join(f'{x:.2f}' for x in row['rounds_ms'])}), "
              f"false positives {row['false_positives']}")  # fmt: skip
    for d in detections:
        print(
            f"  {d['fault']} at step {d['fault_at']}, verdict every {d['every']}: caught at "
            f"{d['caught_at']} (+{d['latency_steps']}), named {d['named']} ({d['kind']})"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
