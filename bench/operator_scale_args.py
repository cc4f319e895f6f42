"""The command line of `python -m bench.operator_scale`: its flags, and the checks that
refuse a run the cluster cannot hold."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import large_cluster
from bench.operator_scale_workload import PROGRESS_MODES
from e2e.cluster.cluster import NODE_LEASE_SECONDS

GPUS_PER_NODE = 8


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    """The run's settings; an impossible one exits with the flag named (argparse's error)."""
    ap = argparse.ArgumentParser(prog="python -m bench.operator_scale", description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--faults", type=int, default=10)
    ap.add_argument("--gpus-per-worker", type=int, default=1)
    ap.add_argument("--stagger", type=float, default=0.5,
                    help="seconds between faults (0: all at once)")  # fmt: skip
    ap.add_argument("--baseline-strategy", default="BlockingRecreate",
                    choices=("Recreate", "BlockingRecreate"))  # fmt: skip
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--progress", choices=PROGRESS_MODES, default="unanswered",
                    help="the jobs' progress monitoring: on with nothing answering (KWOK runs "
                    "no sidecar), off, or answered by bench.sidecar_sim")  # fmt: skip
    large_cluster.add_arguments(ap, lease=NODE_LEASE_SECONDS)
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR",
                    help="sample the operator with py-spy over the fault window into DIR "
                    "(raw collapsed stacks) and print its top frames")  # fmt: skip
    args = ap.parse_args(argv)
    if not 0 < args.faults <= args.jobs:
        ap.error("--faults must be between 1 and --jobs")
    if args.workers > args.nodes:
        ap.error("one worker of a group per node: --workers must not exceed --nodes")
    gpus = args.jobs * args.workers * args.gpus_per_worker
    if gpus > args.nodes * GPUS_PER_NODE or args.gpus_per_worker > GPUS_PER_NODE:
        ap.error(f"{gpus} GPUs requested, the cluster has {args.nodes * GPUS_PER_NODE}")
    return args
