"""``python -m release build [--out DIR] [--require-clean]``: see the package docstring."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    if sys.version_info < (3, 11):  # the images build needs tomllib and tarfile filters
        print("release: needs Python >= 3.11 (make release uses .venv)", file=sys.stderr)
        return 2
    from images.build import BuildError
    from images.fetch import FetchError
    from release import build

    p = argparse.ArgumentParser(prog="python -m release", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser(
        "build", help="build every release artifact into --out (nothing is published)"
    )
    b.add_argument("--out", type=Path, default=build.DEFAULT_OUT, help="default: dist/release")
    b.add_argument(
        "--require-clean",
        action="store_true",
        help="fail when the git working tree has changes (what a tagged release in CI uses)",
    )
    args = p.parse_args(argv)
    try:
        build.build(args.out, require_clean=args.require_clean)
    except (build.ReleaseError, BuildError, FetchError) as exc:
        print(f"release: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
