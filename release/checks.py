"""The release's checks before anything is built: versions agree everywhere, the chart names the
images built, every dependency is locked, and where the sources come from."""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import tomllib
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from images import build as images
from release.common import (
    CHART_IMAGES,
    REPO,
    SEMVER,
    ReleaseError,
    run,
)

# ---------------------------------------------------------------------------- checks


def project_meta(project: images.Project, sources: images.Sources) -> dict[str, Any]:
    """The ``[project]`` table of a project's pyproject.toml, from the snapshot."""
    path = "pyproject.toml" if project.directory == "." else f"{project.directory}/pyproject.toml"
    return tomllib.loads(sources[project.directory][path].decode())["project"]  # type: ignore[no-any-return]


def module_version(project: images.Project, sources: images.Sources) -> tuple[str, str | None]:
    """``__version__`` of the project's package (path, value; None when it has none)."""
    path = f"{project.sources[1]}/__init__.py"
    text = sources[project.directory].get(path, b"").decode()
    match = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.MULTILINE)
    return path, match.group(1) if match else None


def version_problems(
    distributions: Mapping[str, str],
    modules: Mapping[str, tuple[str, str | None]],
    chart: Mapping[str, Any],
) -> list[str]:
    """The versions a release ties together: both distributions (released together, the
    operator image carries both), each package's ``__version__``, and the chart's appVersion
    (the image tag the chart deploys)."""
    problems = []
    named = ", ".join(f"{n} {v}" for n, v in sorted(distributions.items()))
    versions = sorted(set(distributions.values()))
    if len(versions) > 1:
        problems.append(
            f"the Python distributions have different versions ({named}); they are released "
            "together: give both pyproject.toml files the same version"
        )
    for name, (path, value) in sorted(modules.items()):
        if value is not None and value != distributions[name]:
            problems.append(
                f"{path}: __version__ = {value!r}, but its pyproject.toml says "
                f"{name} {distributions[name]}"
            )
    chart_file = "charts/resilient-training-operator/Chart.yaml"
    app_version = str(chart.get("appVersion", ""))
    if app_version not in versions or len(versions) > 1:
        problems.append(
            f"{chart_file}: appVersion {app_version!r} differs from the Python distributions' "
            f"version ({named}); the chart would deploy an image tag this release does not build"
        )
    chart_version = str(chart.get("version", ""))
    if not SEMVER.match(chart_version):
        problems.append(
            f"{chart_file}: version {chart_version!r} is not SemVer 2 (helm package and the "
            "OCI tag of `helm push` need one)"
        )
    return problems


def chart_image_problems(
    values: Mapping[str, Any], references: Mapping[str, str], version: str
) -> list[str]:
    """The chart's default images are the ones this release builds (repository and tag)."""
    problems = []
    for key, image in CHART_IMAGES.items():
        entry = values.get(key) or {}
        repository = entry.get("repository", "")
        where = f"charts/resilient-training-operator/values.yaml: {key}"
        if key != "image" and not repository:
            continue  # the resolver image may be left to the trainer's image on purpose
        if repository != references[image]:
            problems.append(
                f"{where}.repository is {repository!r}, but the release's {image} image is "
                f"named {references[image]!r}"
            )
        tag = entry.get("tag") or ""
        if tag and tag != version:
            problems.append(f"{where}.tag is {tag!r}; the release builds {image}:{version}")
    return problems


def dependency_problems(
    distributions: Mapping[str, tuple[str, Sequence[str]]],
    locked: Collection[str],
    installed: Callable[[str], bool],
) -> list[str]:
    """Every name our distributions ask for is one nobody else can answer for us.

    ``distributions``: name -> (version, Requires-Dist lines of its wheel). A requirement on
    one of ours must accept the version in this release (else pip takes that name from an
    index: whatever is registered under it there). A third-party runtime requirement must be
    in the images' lock (resolved from PyPI, pinned by sha256); one behind an extra must at
    least be installed here (``make install`` resolved it)."""
    ours = {canonicalize_name(n): v for n, (v, _) in distributions.items()}
    problems = []
    for dist, (_, requires) in sorted(distributions.items()):
        for line in requires:
            try:
                req = Requirement(line)
            except InvalidRequirement as exc:
                problems.append(f"{dist}: cannot read the requirement {line!r}: {exc}")
                continue
            name = canonicalize_name(req.name)
            behind_extra = req.marker is not None and "extra" in str(req.marker)
            if name in ours:
                if not req.specifier.contains(ours[name], prereleases=True):
                    problems.append(
                        f"{dist} requires {line!r}, but this release builds {req.name} "
                        f"{ours[name]}: an install would take {req.name} from an index"
                    )
            elif behind_extra:
                if not installed(name):
                    problems.append(
                        f"{dist} requires {line!r}: {req.name} is not installed here, so no index "
                        "has answered for that name (run `make install`)"
                    )
            elif name not in locked:
                problems.append(
                    f"{dist} requires {line!r}: {req.name} is not pinned in "
                    "images/python.lock.json (run `python -m images lock`)"
                )
    return problems


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def git_source() -> dict[str, Any]:
    """The commit the tree is at and whether it has changes (untracked files included)."""
    try:
        commit = run(["git", "rev-parse", "HEAD"], "git rev-parse", cwd=REPO).strip()
        status = run(["git", "status", "--porcelain"], "git status", cwd=REPO)
    except (OSError, ReleaseError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(status.strip())}
