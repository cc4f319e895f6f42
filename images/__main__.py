"""``python -m images build|lock``: see the package docstring."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    if sys.version_info < (3, 11):  # tomllib, tarfile's extraction filters
        print("images: needs Python >= 3.11 (make images PYTHON=python3.11)", file=sys.stderr)
        return 2
    from images import build

    p = argparse.ArgumentParser(prog="python -m images", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build dist/images/{rtj-operator,rtj-resolver}.oci.tar")
    b.add_argument("--out", type=Path, default=build.DEFAULT_OUT)
    b.add_argument("--force", action="store_true", help="rebuild even if the output is fresh")
    b.add_argument(
        "--registry",
        default=build.DEFAULT_REGISTRY,
        help="name prefix recorded in the archives (io.containerd.image.name)",
    )
    lk = sub.add_parser("lock", help="re-resolve images/debian.lock.json and python.lock.json")
    lk.add_argument("--source-date-epoch", type=int, default=None)
    args = p.parse_args(argv)
    try:
        if args.command == "build":
            build.build(args.out, force=args.force, registry=args.registry)
        else:
            build.lock(args.source_date_epoch)
    except (build.BuildError, RuntimeError) as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
