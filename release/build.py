"""Assemble a release into one directory (see the package docstring for what it holds).

Order: read and check the versions (cheap, before anything is built); build or reuse the
images (``images.build.build``); build both sdists from one snapshot of the tree and each
wheel from its sdist; package and lint the chart; write the hash-pinned requirement files,
``release-info.json`` and ``SHA256SUMS``. Everything is written into a staging directory
that replaces ``--out`` only when every step and check passed. A problem raises
``ReleaseError`` with what is wrong and where.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from packaging.utils import canonicalize_name

from images import build as images
from images.fetch import sha256_file
from release.artifacts import (
    build_distribution,
    chart_yaml,
    helm_binary,
    image_wheel_digests,
    package_chart,
    pinned_setuptools,
    requirements_text,
)
from release.checks import (
    _installed,
    chart_image_problems,
    dependency_problems,
    git_source,
    module_version,
    project_meta,
    version_problems,
)
from release.common import (
    CHART,
    DEFAULT_OUT,
    FORMAT,
    PROJECTS,
    REPO,
    REQUIREMENT_IMAGES,
    ReleaseError,
    log,
    run,
    step,
)

__all__ = [  # what callers and tests use from here
    "CHART",
    "DEFAULT_OUT",
    "REPO",
    "ReleaseError",
    "build",
    "chart_image_problems",
    "dependency_problems",
    "helm_binary",
    "version_problems",
]

# ---------------------------------------------------------------------------- build


def _check_out(out: Path) -> None:
    if out.exists() and (
        not out.is_dir() or (any(out.iterdir()) and not (out / "release-info.json").is_file())
    ):
        raise ReleaseError(
            f"{out} exists and is not a release directory (no release-info.json): refusing to "
            "replace it; pass a new or empty --out"
        )


def _replace(stage: Path, out: Path) -> None:
    old = out.with_name(f".{out.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if out.exists():
        out.rename(old)
    stage.rename(out)
    if old.exists():
        shutil.rmtree(old)


@contextmanager
def staging(out: Path) -> Iterator[Path]:
    """A directory beside ``out`` that replaces it when the block succeeds; removed when the
    block fails, so a failed release leaves the previous one in place."""
    stage = out.with_name(f".{out.name}.partial")
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir()
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    _replace(stage, out)


def _hash_files(root: Path) -> dict[str, tuple[str, int]]:
    return {
        p.relative_to(root).as_posix(): (sha256_file(p), p.stat().st_size)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def build(out: Path = DEFAULT_OUT, *, require_clean: bool = False) -> dict[str, Any]:
    """Build a release into ``out``; returns release-info."""
    started = time.monotonic()
    out = out.resolve()
    _check_out(out)
    source = git_source()
    if require_clean and source["dirty"] is not False:
        raise ReleaseError(
            "--require-clean: the working tree has changes (or is not a git checkout); "
            "a release is built from a committed tree"
        )
    if source["dirty"]:
        log(
            f"note: the working tree has changes (release-info.json records commit "
            f"{source['commit']} with dirty: true; --require-clean refuses this)"
        )

    debian_lock, python_lock = images.load_locks()
    epoch = images.source_date_epoch(debian_lock)
    sources = images.snapshot_sources()  # our Python sources, read once
    key = images.input_key(epoch, images.DEFAULT_REGISTRY, sources)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    metas = {p.directory: project_meta(p, sources) for p in PROJECTS}
    declared = {m["name"]: m["version"] for m in metas.values()}
    modules = {metas[p.directory]["name"]: module_version(p, sources) for p in PROJECTS}
    problems = version_problems(declared, modules, chart)
    if problems:
        raise ReleaseError("versions do not agree:\n  " + "\n  ".join(problems))
    version = next(iter(declared.values()))
    log(f"{', '.join(sorted(declared))} {version}; chart {chart['name']} {chart['version']}")

    with step("images (images.build, reused when dist/images is fresh)"):
        info = images.build(images.DEFAULT_OUT)
    if info["input_key"] != key:
        raise ReleaseError(
            f"{images.DEFAULT_OUT} was built from other sources than this release read (input "
            f"key {str(info['input_key'])[:16]}, the tree's {key[:16]}): the tree changed "
            "while the images were built; run the release again"
        )
    references = {name: image["reference"] for name, image in info["images"].items()}
    problems = chart_image_problems(values, references, version)
    if problems:
        raise ReleaseError(
            "the chart does not deploy this release's images:\n  " + "\n  ".join(problems)
        )

    out.parent.mkdir(parents=True, exist_ok=True)
    with staging(out) as stage:
        for sub in ("images", "chart", "python", "requirements"):
            (stage / sub).mkdir()
        with tempfile.TemporaryDirectory(prefix=f".{out.name}.work-", dir=out.parent) as tmp:
            work = Path(tmp)
            with step("python distributions (sdist, then the wheel from it)"):
                setuptools, setuptools_version = pinned_setuptools(python_lock, work)
                dists = [
                    build_distribution(
                        p, sources[p.directory], setuptools, work, stage / "python", epoch
                    )
                    for p in PROJECTS
                ]
            with step("chart (helm package, helm lint)"):
                helm = helm_binary()
                helm_version = run([helm, "version", "--template", "{{.Version}}"], "helm version")
                tgz = package_chart(helm, work, stage / "chart", epoch)
                packaged = chart_yaml(tgz)
                for field in ("name", "version", "appVersion"):
                    if str(packaged.get(field)) != str(chart.get(field)):
                        raise ReleaseError(
                            f"Chart.yaml changed during the release ({field}: "
                            f"{chart.get(field)!r}, packaged {packaged.get(field)!r}); "
                            "run the release again"
                        )

        with step("checks, copies, requirements, checksums"):
            locked = {
                canonicalize_name(w["name"])
                for image in python_lock["images"].values()
                for w in image["wheels"]
            }
            problems = dependency_problems(
                {d.name: (d.version, d.requires) for d in dists}, locked, _installed
            )
            in_images = image_wheel_digests(images.DEFAULT_OUT, info)
            digests = {d.wheel: sha256_file(d.wheel) for d in dists}
            for d in dists:
                expected = in_images.get(canonicalize_name(d.name), set())
                if expected != {digests[d.wheel]}:
                    problems.append(
                        f"{d.wheel.name} (sha256 {digests[d.wheel]}) is not the wheel inside "
                        f"the images (their SBOMs record {sorted(expected) or 'none'}): the tree "
                        "changed during the release, or this machine builds it differently"
                    )
            if problems:
                raise ReleaseError(
                    "\n  ".join(["the distributions cannot be released:", *problems])
                )

            for image in info["images"].values():
                for name in (image["archive"], image["sbom"]):
                    shutil.copyfile(images.DEFAULT_OUT / name, stage / "images" / name)
            shutil.copyfile(
                images.DEFAULT_OUT / "build-info.json", stage / "images" / "build-info.json"
            )

            requirement_files = {}
            for dist_name, image_name in REQUIREMENT_IMAGES.items():
                spec = images.IMAGES[image_name]
                ours = [d for p in spec.projects for d in dists if d.project == p]
                path = stage / "requirements" / f"{dist_name}.txt"
                path.write_text(
                    requirements_text(
                        image_name,
                        ours,
                        spec.extras,
                        python_lock["images"][image_name]["wheels"],
                        python_lock["python"],
                        digests,
                    )
                )
                requirement_files[dist_name] = path

            files = _hash_files(stage)
            for image in info["images"].values():
                for name, sha in (
                    (image["archive"], image["sha256"]),
                    (image["sbom"], image["sbom_sha256"]),
                ):
                    if files[f"images/{name}"][0] != sha:
                        raise ReleaseError(
                            f"dist/images/{name} changed while it was copied; run again"
                        )

            def entry(path: Path) -> dict[str, Any]:
                rel = path.relative_to(stage).as_posix()
                return {"path": rel, "sha256": files[rel][0], "size": files[rel][1]}

            release_info: dict[str, Any] = {
                "format": FORMAT,
                "version": version,
                "source_date_epoch": epoch,
                "source": source,
                "tools": {
                    "python": platform.python_version(),
                    "setuptools": setuptools_version,
                    "helm": helm_version,
                },
                "python": {
                    d.name: {
                        "version": d.version,
                        "wheel": entry(d.wheel),
                        "sdist": entry(d.sdist),
                        "requires_dist": list(d.requires),
                        "requirements": entry(requirement_files[d.name]),
                    }
                    for d in dists
                },
                "chart": {
                    "name": chart["name"],
                    "version": str(chart["version"]),
                    "app_version": str(chart["appVersion"]),
                    **entry(tgz),
                },
                "images": {
                    name: {
                        "reference": f"{image['reference']}:{version}",
                        "manifest_digest": image["manifest"],
                        "archive": entry(stage / "images" / image["archive"]),
                        "sbom": entry(stage / "images" / image["sbom"]),
                    }
                    for name, image in sorted(info["images"].items())
                },
            }
            (stage / "release-info.json").write_text(
                json.dumps(release_info, indent=2, sort_keys=True) + "\n"
            )
            sha = hashlib.sha256((stage / "release-info.json").read_bytes()).hexdigest()
            files["release-info.json"] = (sha, (stage / "release-info.json").stat().st_size)
            (stage / "SHA256SUMS").write_text(
                "".join(f"{digest}  {rel}\n" for rel, (digest, _) in sorted(files.items()))
            )

    for rel, (_, size) in sorted(files.items()):
        log(f"  {size / 1e6:8.2f} MB  {rel}")
    log(
        f"release {version} in {out} ({time.monotonic() - started:.1f} s); verify with "
        f"`cd {out} && sha256sum -c SHA256SUMS`; publishing: docs/release.md"
    )
    return release_info
