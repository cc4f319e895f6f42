"""The build's inputs: our projects' files (read once), their requirements, the locks'
SOURCE_DATE_EPOCH, and the input key that says whether an earlier build is still fresh."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from typing import Any

import tomllib

from images import wheels
from images.specs import (
    DEBIAN_LOCK,
    FORMAT,
    HERE,
    OPERATOR,
    PYTHON_LOCK,
    REPO,
    SHIM,
    BuildError,
    ImageSpec,
    Project,
)

Sources = dict[str, dict[str, bytes]]  # project directory -> path in the repo -> content


def _pyproject(project: Project, sources: Sources | None = None) -> dict[str, Any]:
    path = "pyproject.toml" if project.directory == "." else f"{project.directory}/pyproject.toml"
    data = sources[project.directory][path] if sources else (REPO / path).read_bytes()
    return tomllib.loads(data.decode())["project"]  # type: ignore[no-any-return]


def requirements(spec: ImageSpec, sources: Sources | None = None) -> list[str]:
    """Third-party requirements of the image: our projects' dependencies and extras, less
    our own distributions (built from the tree, not taken from an index)."""
    own = {wheels.normalize(_pyproject(p, sources)["name"]) for p in spec.projects}
    reqs: list[str] = []
    for project in spec.projects:
        meta = _pyproject(project, sources)
        deps = list(meta.get("dependencies", []))
        for extra in spec.extras:
            deps += meta.get("optional-dependencies", {}).get(extra, [])
        for dep in deps:
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", dep)
            if match is None:
                raise BuildError(f"cannot read the requirement {dep!r}")
            name = wheels.normalize(match.group(1))
            if name not in own and dep not in reqs:
                reqs.append(dep)
    return reqs


def source_files(project: Project) -> list[str]:
    """The files of a project as git sees the working tree: tracked or untracked but not
    ignored (a .dockerignore's job), and present."""
    try:
        out = subprocess.run(
            [
                "git",
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
                "--",
                *project.sources,
            ],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout.decode()
        names = {n for n in out.split("\0") if n}
    except (OSError, subprocess.CalledProcessError):
        names = set()
        for src in project.sources:
            path = REPO / src
            candidates = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            for p in candidates:
                if "__pycache__" not in p.parts and p.suffix != ".pyc":
                    names.add(str(p.relative_to(REPO)))
    return sorted(n for n in names if (REPO / n).is_file())


def source_date_epoch(lock: dict[str, Any]) -> int:
    env = os.environ.get("SOURCE_DATE_EPOCH")
    return int(env) if env else int(lock["source_date_epoch"])


def snapshot_sources() -> Sources:
    """Our projects' files, read once: the key and the wheels come from the same bytes even
    while someone edits the tree."""
    return {
        p.directory: {name: (REPO / name).read_bytes() for name in source_files(p)}
        for p in (SHIM, OPERATOR)
    }


def input_key(epoch: int, registry: str, sources: Sources) -> str:
    h = hashlib.sha256()
    h.update(f"format={FORMAT}\nepoch={epoch}\nregistry={registry}\n".encode())
    for path in [*sorted(HERE.glob("*.py")), DEBIAN_LOCK, PYTHON_LOCK]:
        h.update(f"{path.name}\n".encode() + hashlib.sha256(path.read_bytes()).digest())
    for files in sources.values():
        for name, data in sorted(files.items()):
            h.update(f"{name}\n".encode() + hashlib.sha256(data).digest())
    return h.hexdigest()
