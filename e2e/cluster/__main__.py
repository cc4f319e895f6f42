"""``python -m e2e.cluster build|up|down|status|env`` (see docs/cluster.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import build
from .cluster import LocalCluster
from .cluster_state import DEFAULT_NAME, ClusterState
from .processes import StartupError
from .versions import CLUSTER_PROGRAMS, NODE_PROGRAMS, TOOL_PROGRAMS, load_versions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the programs into the cache (skips cached ones)")
    b.add_argument(
        "programs", nargs="*", help=f"default: the cluster's ({', '.join(CLUSTER_PROGRAMS)})"
    )
    b.add_argument("--tools", action="store_true", help=f"also {', '.join(TOOL_PROGRAMS)}")
    b.add_argument(
        "--node", action="store_true", help=f"also the real node's {', '.join(NODE_PROGRAMS)}"
    )
    b.add_argument("--all", action="store_true", help="every program, kind included")
    b.add_argument(
        "--sync-gomod",
        action="store_true",
        help="rewrite e2e/cluster/gomod/go.mod from e2e/versions.env first",
    )
    b.add_argument("--print-path", metavar="NAME", help="print the cached binary path of NAME")
    for name in ("up", "down", "status"):
        p = sub.add_parser(name)
        p.add_argument("--name", default=DEFAULT_NAME)
        if name == "up":
            p.add_argument("--nodes", type=int, default=8)
            p.add_argument("--gpus-per-node", type=int, default=8)
    sub.add_parser("versions", help="print the pinned versions as JSON")
    args = ap.parse_args(argv)

    if args.cmd == "versions":
        print(json.dumps(load_versions(), indent=2))
        return 0
    if args.cmd == "build":
        if args.print_path:
            print(build.binary_path(args.print_path))
            return 0
        if args.sync_gomod:
            build.sync_gomod()
        names = list(args.programs) or list(CLUSTER_PROGRAMS)
        if args.tools:
            names += [n for n in TOOL_PROGRAMS if n not in names]
        if args.node:
            names += [n for n in NODE_PROGRAMS if n not in names]
        if args.all:
            names = build.all_program_names()
        t0 = time.monotonic()
        try:
            times = build.build(names)
        except build.BuildError as exc:
            print(f"BUILD FAILED: {exc}", file=sys.stderr)
            return 1
        for n, s in times.items():
            print(f"{n:<26} {'cached' if s == 0 else f'built in {s:.0f}s'}", file=sys.stderr)
        print(f"total {time.monotonic() - t0:.0f}s", file=sys.stderr)
        return 0
    if args.cmd == "up":
        cluster = LocalCluster(args.name, nodes=args.nodes, gpus_per_node=args.gpus_per_node)
        try:
            kubeconfig = cluster.up()
        except (StartupError, build.BuildError, TimeoutError) as exc:
            print(f"cluster up failed: {exc}", file=sys.stderr)
            return 1
        print(
            f"cluster {args.name!r} up in {cluster.state.startup_seconds:.1f}s "
            f"({args.nodes} nodes); timings {cluster.state.timings}",
            file=sys.stderr,
        )
        print(kubeconfig)
        return 0
    if args.cmd == "down":
        problems = LocalCluster(args.name).down(check=False)
        if problems:
            print("teardown left: " + "; ".join(problems), file=sys.stderr)
            return 1
        print(f"cluster {args.name!r} down: no process, no listening port left", file=sys.stderr)
        return 0
    if args.cmd == "status":
        st = LocalCluster(args.name).status()
        print(json.dumps(st, indent=2))
        return 0 if st.get("running") else 3
    return 2


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["ClusterState", "main"]
