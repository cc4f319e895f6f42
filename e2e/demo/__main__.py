"""``python -m e2e.demo up|down``: run the demo story, or stop everything it started."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .story import DemoError, Display, Options, down, up


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.demo", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="start what is needed, run the job, inject a fault, summarize")
    u.add_argument(
        "--kubeconfig",
        type=Path,
        default=Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None,
        help="use this cluster instead of starting a local one (default: $KUBECONFIG)",
    )
    u.add_argument("--out", type=Path, default=Options.out, help="summary and loss plot")
    u.add_argument("--fault-step", type=int, default=Options.fault_step)
    u.add_argument("--timeout", type=float, default=Options.timeout, help="seconds per wait")
    sub.add_parser("down", help="stop the operator, runner, S3 server and local cluster")
    args = p.parse_args(argv)
    display = Display()
    try:
        if args.command == "down":
            left = down(Options(), display)
            if left:
                display.line(f"LEFT BEHIND: {', '.join(left)}")
                return 1
            display.line("demo stopped; nothing left running")
            return 0
        opts = Options(
            out=args.out, kubeconfig=args.kubeconfig, fault_step=args.fault_step,
            timeout=args.timeout,
        )  # fmt: skip
        up(opts, display)
        return 0
    except DemoError as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
