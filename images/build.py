"""Assemble rtj-operator and rtj-resolver (see the package docstring for why this way).

Layers, in order, for both images:

1. the Debian base (``images/debian.lock.json``) with the standard library precompiled:
   the same blob in both images;
2. the third-party wheels of that image (``images/python.lock.json``), precompiled;
3. our own distributions, built from the working tree, and the SBOM
   (``/usr/share/sbom/<image>.spdx.json``).

``build()`` skips the work when ``build-info.json`` in the output names the same input key
(this package's code, the locks, our sources, SOURCE_DATE_EPOCH, the registry prefix) and
the archives still have the recorded sha256.

The images and their settings: ``images.specs``; the inputs and their key:
``images.inputs``; the steps for one image: ``images.assembly``.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

import tomllib

from images import debian, oci, wheels
from images.assembly import assemble, build_own_wheel, precompile
from images.fetch import fetch, sha256_file
from images.inputs import Sources as Sources
from images.inputs import input_key as input_key
from images.inputs import requirements
from images.inputs import snapshot_sources as snapshot_sources
from images.inputs import source_date_epoch as source_date_epoch
from images.specs import DEBIAN_LOCK, PYTHON_LOCK, log
from images.specs import DEFAULT_OUT as DEFAULT_OUT
from images.specs import DEFAULT_REGISTRY as DEFAULT_REGISTRY
from images.specs import IMAGES as IMAGES
from images.specs import OPERATOR as OPERATOR
from images.specs import REPO as REPO
from images.specs import SHIM as SHIM
from images.specs import BuildError as BuildError
from images.specs import Project as Project


def load_locks() -> tuple[dict[str, Any], dict[str, Any]]:
    return json.loads(DEBIAN_LOCK.read_text()), json.loads(PYTHON_LOCK.read_text())


def check_locks(debian_lock: dict[str, Any], python_lock: dict[str, Any], sources: Sources) -> None:
    """The locks were made for what the tree asks for now (roots, exclusions, and each
    image's requirements from the pyproject.toml files); else `python -m images lock`."""
    stale = []
    if debian_lock["roots"] != debian.ROOTS or debian_lock["exclude"] != debian.EXCLUDE:
        stale.append("images/debian.lock.json: ROOTS or EXCLUDE changed")
    for spec in IMAGES.values():
        wanted = requirements(spec, sources)
        locked = python_lock["images"].get(spec.name, {}).get("requirements")
        if locked != wanted:
            stale.append(
                f"images/python.lock.json: {spec.name} locks {locked}, the tree asks {wanted}"
            )
    if stale:
        raise BuildError("stale lock, run `python -m images lock`:\n  " + "\n  ".join(stale))


def fresh(out: Path, key: str) -> dict[str, Any] | None:
    """The recorded build if ``out`` holds archives built from exactly these inputs."""
    info_path = out / "build-info.json"
    if not info_path.is_file():
        return None
    info: dict[str, Any] = json.loads(info_path.read_text())
    if info.get("input_key") != key:
        return None
    for image in info["images"].values():
        archive = out / image["archive"]
        if not archive.is_file() or sha256_file(archive) != image["sha256"]:
            return None
    return info


def build(
    out: Path = DEFAULT_OUT, *, force: bool = False, registry: str = DEFAULT_REGISTRY
) -> dict[str, Any]:
    """Build both archives into ``out`` (or reuse a fresh build); returns build-info. One
    build of an ``out`` at a time on this machine (a lock beside it): a second process waits
    and then finds the first one's build fresh (pytest workers both needing the images)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(out, force=force, registry=registry)


def _build(out: Path, *, force: bool, registry: str) -> dict[str, Any]:
    debian_lock, python_lock = load_locks()
    epoch = source_date_epoch(debian_lock)
    sources = snapshot_sources()
    key = input_key(epoch, registry, sources)
    if not force and (info := fresh(out, key)) is not None:
        log(f"{out} is up to date (input key {key[:16]})")
        return info
    check_locks(debian_lock, python_lock, sources)
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    work = out / ".work"
    if work.exists():
        shutil.rmtree(work)
    packages = [debian.Package.from_lock(p) for p in debian_lock["packages"]]
    log(f"base: {len(packages)} Debian packages")
    base = debian.stage(packages, work / "base")
    failed = precompile(base, base.root, base.tree, ("usr/lib/python3",))
    base_layer = oci.write_layer(base.tree, epoch, work / "blobs" / "base")
    log(
        f"base layer {base_layer.blob.digest} ({base_layer.blob.size} bytes, {failed} not compiled)"
    )
    tool = wheels.Wheel.from_lock(python_lock["build"]["setuptools"])
    tool_dir = work / "tools"
    with zipfile.ZipFile(fetch(tool.url, tool.sha256)) as zf:
        zf.extractall(tool_dir)  # a pinned, sha256-checked wheel
    own = {
        project.directory: build_own_wheel(
            base, project, sources[project.directory], tool_dir, work, epoch
        )
        for project in (SHIM, OPERATOR)
    }
    built = []
    for spec in IMAGES.values():
        b = assemble(spec, base, base_layer, python_lock, own, work, out, epoch, registry)
        log(f"{b.name}: {b.archive.name} {b.size / 1e6:.1f} MB, manifest {b.manifest_digest}")
        built.append(b)
    info = {
        "input_key": key,
        "source_date_epoch": epoch,
        "base_layer": base_layer.blob.digest,
        "images": {
            b.name: {
                "archive": b.archive.name,
                "sha256": b.archive_sha256,
                "size": b.size,
                "manifest": b.manifest_digest,
                "layers": b.layers,
                "sbom": b.sbom.name,
                "sbom_sha256": b.sbom_sha256,
                "reference": f"{registry}/{b.name}",
            }
            for b in built
        },
    }
    (out / "build-info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    (out / "SHA256SUMS").write_text(
        "".join(f"{b.archive_sha256}  {b.archive.name}\n" for b in built)
        + "".join(f"{b.sbom_sha256}  {b.sbom.name}\n" for b in built)
    )
    shutil.rmtree(work)
    log(f"built in {time.monotonic() - started:.1f} s")
    return info


# ---------------------------------------------------------------------------- lock


def lock(epoch: int | None = None) -> None:
    """Re-resolve both locks (needs apt's indexes: `apt-get update`, and PyPI)."""
    packages = debian.resolve()
    previous = json.loads(DEBIAN_LOCK.read_text()) if DEBIAN_LOCK.exists() else {}
    debian_lock = {
        "comment": "written by `python -m images lock`; the base of both images",
        "suite": debian.SUITE,
        "arch": debian.ARCH,
        "roots": debian.ROOTS,
        "exclude": debian.EXCLUDE,
        "source_date_epoch": epoch
        or previous.get("source_date_epoch")
        or int(time.time()) // 86400 * 86400,
        "packages": [p.__dict__ for p in packages],
    }
    DEBIAN_LOCK.write_text(json.dumps(debian_lock, indent=2) + "\n")
    python = next(p for p in packages if p.name == "python3.11-minimal").version
    python_version = python.split("-")[0].split(":")[-1]  # 3.11.2-6+deb12u9 -> 3.11.2
    images: dict[str, dict[str, Any]] = {}
    for spec in IMAGES.values():
        reqs = requirements(spec)
        images[spec.name] = {
            "requirements": reqs,
            "wheels": [w.__dict__ for w in wheels.resolve(reqs, python_version)],
        }
    setuptools_req = _pyproject_build_requires()
    tools = wheels.resolve(setuptools_req, python_version)
    python_lock = {
        "comment": "written by `python -m images lock`; versions as in .venv (pip freeze)",
        "python": python_version,
        "abi": wheels.PYTHON_ABI,
        "platforms": wheels.PLATFORMS,
        "images": images,
        "build": {"setuptools": next(w.__dict__ for w in tools if w.name == "setuptools")},
    }
    PYTHON_LOCK.write_text(json.dumps(python_lock, indent=2) + "\n")
    count = sum(len(i["wheels"]) for i in images.values())
    log(f"locked {len(packages)} Debian packages and {count} wheels")


def _pyproject_build_requires() -> list[str]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return list(tomllib.load(f)["build-system"]["requires"])
