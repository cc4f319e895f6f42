"""Hang detection at scale (issue 12, "Benchmarks"), as figures (never assertions):

1. The poller at scale: one asyncio process stands in for the progress sidecars of `--pods`
   pods of 8 ranks (1,250 = a 10k-GPU job) on 127.3.x.y:9478, serving bodies made by the
   product's `rank_json` from simulated records of a synchronous job. `RankPolls.poll_once`
   (real HTTP) reads them every `--interval` s and the operator's per-round decisions run on
   what it read; then a rank freezes mid-`forward`: freeze -> first `hang_verdict`, fixed 30 s
   allowance and automatic; last, `--silent` pods that accept and never answer. Not
   simulated: kubelets, pod networking, the network between nodes, the trainers.
2. API-server writes in steady state: the operator as a process against KWOK, one job of N
   pods Running (`--api-sizes`): its `rtj_api_requests_total` by verb over `--window` s.
3. Today's defaults: torch's collective timeouts (read from its source in this virtualenv)
   and the trainer's per-step cost (bench.progress_overhead's `per_step_cost`).

    python -m bench.hang_detection [--quick] [--markdown F] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench.hang_api_writes import api_bench
from bench.hang_defaults import torch_defaults, trainer_cost
from bench.hang_poller import poller_bench
from bench.hang_report import markdown, summarize

OPTIONS: tuple[tuple[str, Any, Any, str], ...] = (
    ("--pods", int, 1250, "simulated pods (8 ranks each)"),
    ("--step-seconds", float, 10.0, "the simulated job's step time"),
    ("--interval", float, 5.0, "the poll period (the product's default)"),
    ("--warm-rounds", int, 6, "rounds before the first freeze"),
    ("--trials", int, 2, "freezes (each gives both allowances)"),
    ("--silent", int, 125, "pods that accept and never answer (0: none)"),
    ("--silent-rounds", int, 4, "rounds with them"),
    ("--api-sizes", lambda v: [int(x) for x in v.split(",")], [32, 125], "N pods, a,b,..."),
    ("--window", float, 60.0, "steady-state window (s)"),
    ("--settle", float, 15.0, "seconds after Running before the window"),
    ("--startup-budget", float, 300.0, "seconds for N pods to be Running, else N is skipped"),
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hang_detection", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    for flag, kind, default, text in OPTIONS:
        ap.add_argument(flag, type=kind, default=default, help=f"{text} ({default})")
    for flag in ("--skip-poller", "--skip-api", "--quick"):
        ap.add_argument(flag, action="store_true")
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.warm_rounds, a.trials, a.silent_rounds, a.api_sizes, a.window = 3, 1, 2, [125], 30.0
    r: dict[str, Any] = {
        "args": {k: v for k, v in vars(a).items() if not isinstance(v, Path)},
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.python_version()})",
        "started": time.strftime("%Y-%m-%d %H:%M %Z"), "load_start": os.getloadavg()[0],
        "defaults": torch_defaults(), "trainer_cost_s": trainer_cost(),
    }  # fmt: skip
    print(f"hang detection bench: {r['machine']}, load {r['load_start']:.2f}", flush=True)
    if not a.skip_poller:
        r["poller"] = asyncio.run(poller_bench(a))
        r["poller"]["summary"] = summarize(r["poller"]["rounds"], a.pods, a.interval)
    if not a.skip_api:
        try:
            r["api"] = api_bench(a)
        except Exception as exc:  # the other figures still count
            r["api"] = {"sizes": {}, "notes": [f"failed: {type(exc).__name__}: {exc}"]}
    r["load_end"] = os.getloadavg()[0]
    text = markdown(r)
    print(text)
    if a.markdown:
        a.markdown.write_text(text)
    if a.json:
        a.json.write_text(json.dumps(r, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
