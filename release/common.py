"""What every part of the release shares: paths, the error, logging and running tools."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from images import build as images

REPO = images.REPO
CHART = REPO / "charts" / "resilient-training-operator"
DEFAULT_OUT = REPO / "dist" / "release"
FORMAT = 1  # of release-info.json
PROJECTS = (images.SHIM, images.OPERATOR)
# a requirement file per distribution: ours and the locked dependencies of the image that
# carries the distribution (its Python content, extras included)
REQUIREMENT_IMAGES = {"resilient-training-operator": "rtj-operator", "rtj-shim": "rtj-resolver"}
# chart values that name an image -> the image
CHART_IMAGES = {"image": "rtj-operator", "resolverImage": "rtj-resolver"}
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"
)
# run by the interpreter running the release with -S: only the pinned setuptools is importable
BACKEND = (
    "import sys; from setuptools import build_meta; "
    "print(getattr(build_meta, sys.argv[1])(sys.argv[2]))"
)


class ReleaseError(RuntimeError):
    """What is wrong with the tree or the build, in words."""


def log(msg: str) -> None:
    print(f"release: {msg}", flush=True)


@contextmanager
def step(what: str) -> Iterator[None]:
    started = time.monotonic()
    log(f"{what} ...")
    yield
    log(f"{what}: done in {time.monotonic() - started:.1f} s")


def run(cmd: Sequence[str], what: str, **kwargs: Any) -> str:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False, **kwargs)
    if proc.returncode != 0:
        raise ReleaseError(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"{(proc.stdout + proc.stderr)[-3000:]}"
        )
    stdout: str = proc.stdout
    return stdout
