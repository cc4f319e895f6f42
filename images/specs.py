"""The images we build (rtj-operator, rtj-resolver), the distributions of ours they hold,
and the settings every image shares (paths, registry, environment, user, annotations)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from images import debian

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEBIAN_LOCK = HERE / "debian.lock.json"
PYTHON_LOCK = HERE / "python.lock.json"
DEFAULT_OUT = REPO / "dist" / "images"
DEFAULT_REGISTRY = "ghcr.io/resilient-training"
FORMAT = 1  # bump when the output changes for the same inputs
ENV = [
    "PATH=/usr/local/bin:/usr/bin:/bin",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
    "LANG=C.UTF-8",
    "SSL_CERT_FILE=/" + debian.CA_BUNDLE,
]
USER = f"{debian.NONROOT}:{debian.NONROOT}"
ANNOTATION = "dev.resilient.training"


@dataclass(frozen=True)
class Project:
    """One of our distributions: where its pyproject.toml is and which files it builds from."""

    directory: str  # relative to the repository ("." or "trainer-shim")
    sources: tuple[str, ...]  # paths (relative to the repository) copied for the build


SHIM = Project("trainer-shim", ("trainer-shim/pyproject.toml", "trainer-shim/rtj_shim"))
OPERATOR = Project(".", ("pyproject.toml", "operator/rtj_operator"))


@dataclass(frozen=True)
class ImageSpec:
    name: str
    description: str
    projects: tuple[Project, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    # extras of our projects whose requirements `lock` resolves too
    extras: tuple[str, ...] = field(default=())
    # (distribution, path below site-packages, why): files left out of the image
    prune: tuple[tuple[str, str, str], ...] = field(default=())


IMAGES = {
    "rtj-operator": ImageSpec(
        name="rtj-operator",
        description="Resilient Training Operator (python -m rtj_operator run; rtj)",
        projects=(SHIM, OPERATOR),
        entrypoint=("/usr/bin/python3", "-m", "rtj_operator", "run"),
        extras=("s3",),  # the operator reads checkpoint stores (rtj_operator.selection)
        prune=(
            (
                "kubernetes",
                "kubernetes/aio",
                "the asyncio copy of the client (68 MB with its .pyc): neither rtj_operator "
                "nor kopf imports it",
            ),
        ),
    ),
    "rtj-resolver": ImageSpec(
        name="rtj-resolver",
        description="rtj-shim with S3: the resume init container and the progress sidecar",
        projects=(SHIM,),
        entrypoint=("/usr/local/bin/rtj-shim",),
        cmd=("--help",),
        extras=("s3",),
    ),
}


class BuildError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"images: {msg}", flush=True)
