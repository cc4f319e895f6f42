"""Assemble a release into one directory (see the package docstring for what it holds).

Order: read and check the versions (cheap, before anything is built); build or reuse the
images (``images.build.build``); build both sdists from one snapshot of the tree and each
wheel from its sdist; package and lint the chart; write the hash-pinned requirement files,
``release-info.json`` and ``SHA256SUMS``. Everything is written into a staging directory
that replaces ``--out`` only when every step and check passed. A problem raises
``ReleaseError`` with what is wrong and where.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

import tomllib
import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from images import build as images
from images.fetch import fetch, sha256_file
from images.wheels import Wheel

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


# ---------------------------------------------------------------------------- artifacts


def normalize_tgz(src: Path, dst: Path, epoch: int) -> None:
    """Rewrite a .tar.gz with nothing of the machine or the moment in it: the same members in
    the same order, every mtime ``epoch``, owner 0:0 without names, modes 0644/0755, and a
    gzip header without a name or time."""
    with (
        tarfile.open(src, "r:gz") as tin,
        dst.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tout,
    ):
        for member in tin.getmembers():
            if not (member.isfile() or member.isdir()):
                raise ReleaseError(f"{src.name}: {member.name} is neither a file nor a directory")
            info = tarfile.TarInfo(member.name)
            info.type = member.type
            info.mtime = epoch
            info.mode = 0o755 if member.isdir() or member.mode & 0o111 else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if member.isfile():
                info.size = member.size
                tout.addfile(info, tin.extractfile(member))
            else:
                tout.addfile(info)


def pinned_setuptools(python_lock: Mapping[str, Any], work: Path) -> tuple[Path, str]:
    """The setuptools wheel the images build with (sha256-checked, cached), unpacked."""
    tool = Wheel.from_lock(python_lock["build"]["setuptools"])
    target = work / "setuptools"
    with zipfile.ZipFile(fetch(tool.url, tool.sha256)) as zf:
        zf.extractall(target)  # noqa: S202 (the sha256-pinned wheel the images build with)
    return target, tool.version


def backend(hook: str, src: Path, out: Path, setuptools: Path, epoch: int) -> Path:
    """Call a PEP 517 hook of the pinned setuptools in ``src``; the file it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(setuptools),
        "SOURCE_DATE_EPOCH": str(epoch),
        "PYTHONHASHSEED": "0",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "HOME": str(setuptools.parent),  # no ~/.pydistutils.cfg of whoever runs this
    }
    proc = subprocess.run(
        [sys.executable, "-S", "-c", BACKEND, hook, str(out)],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ReleaseError(
            f"setuptools {hook} in {src.name} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        )
    return out / proc.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    project: images.Project
    sdist: Path
    wheel: Path
    requires: tuple[str, ...]  # Requires-Dist of the wheel
    extras: tuple[str, ...]  # Provides-Extra of the wheel


def wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = (
            n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
        )
        return HeaderParser().parsestr(zf.read(name).decode())


def build_distribution(
    project: images.Project,
    files: Mapping[str, bytes],
    setuptools: Path,
    work: Path,
    dest: Path,
    epoch: int,
) -> Distribution:
    """The sdist from a copy of the project's files, then the wheel from that sdist (what
    pip does with the sdist, so the sdist is proven complete)."""
    key = project.directory.replace("/", "_").replace(".", "root")
    src = work / "src" / key
    prefix = "" if project.directory == "." else project.directory + "/"
    for name, data in sorted(files.items()):
        target = src / name.removeprefix(prefix)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.utime(target, (epoch, epoch))
    raw = backend("build_sdist", src, work / "raw" / key, setuptools, epoch)
    sdist = dest / raw.name
    normalize_tgz(raw, sdist, epoch)
    unpacked = work / "unpacked" / key
    with tarfile.open(sdist) as tf:
        tf.extractall(unpacked, filter="data")
    (top,) = unpacked.iterdir()
    wheel = backend("build_wheel", top, dest, setuptools, epoch)
    meta = wheel_metadata(wheel)
    return Distribution(
        name=str(meta["Name"]),
        version=str(meta["Version"]),
        project=project,
        sdist=sdist,
        wheel=wheel,
        requires=tuple(meta.get_all("Requires-Dist") or ()),
        extras=tuple(meta.get_all("Provides-Extra") or ()),
    )


def image_wheel_digests(images_dir: Path, info: Mapping[str, Any]) -> dict[str, set[str]]:
    """Canonical name -> the sha256 of that distribution's wheel in each image's SBOM."""
    digests: dict[str, set[str]] = {}
    for image in info["images"].values():
        doc = json.loads((images_dir / image["sbom"]).read_text())
        for pkg in doc["packages"]:
            for checksum in pkg.get("checksums", []):
                if checksum["algorithm"] == "SHA256":
                    name = canonicalize_name(pkg["name"])
                    digests.setdefault(name, set()).add(checksum["checksumValue"])
    return digests


def helm_binary() -> str:
    """The pinned helm of the cluster harness (built from its Go module when missing)."""
    from e2e.cluster import build as tools

    if tools.missing(["helm"]):
        log("building the pinned helm (e2e.cluster)")
        tools.build(["helm"], quiet=True)
    return str(tools.binary_path("helm"))


def package_chart(helm: str, work: Path, dest: Path, epoch: int) -> Path:
    """``helm package``, re-stamped with ``epoch`` (tar entries and the file's own mtime:
    ``helm push`` records the archive's mtime as org.opencontainers.image.created), then
    ``helm lint`` on the package itself."""
    raw = work / "chart"
    run([helm, "package", str(CHART), "--destination", str(raw)], "helm package")
    (tgz,) = raw.glob("*.tgz")
    target = dest / tgz.name
    normalize_tgz(tgz, target, epoch)
    os.utime(target, (epoch, epoch))
    run([helm, "lint", str(target)], f"helm lint {target.name}")
    return target


def chart_yaml(tgz: Path) -> dict[str, Any]:
    with tarfile.open(tgz) as tf:
        (member,) = (
            m for m in tf.getmembers() if m.name.count("/") == 1 and m.name.endswith("/Chart.yaml")
        )
        f = tf.extractfile(member)
        assert f is not None
        return yaml.safe_load(f.read())  # type: ignore[no-any-return]


def requirements_text(
    image: str,
    ours: Sequence[Distribution],
    extras: Sequence[str],
    locked: Sequence[Mapping[str, str]],
    python: str,
    digests: Mapping[Path, str],
) -> str:
    """A ``--require-hashes`` requirement file: our wheels by sha256 (wheels only: pip would
    build an sdist with build dependencies it does not hash-check), then every wheel the
    image pins. What pip installs from it is what the image carries."""
    names = ", ".join(f"{d.name} {d.version}" for d in ours)
    lines = [
        f"# {names} and every dependency, exactly as in the {image} image",
        "# (images/python.lock.json), all pinned by sha256. Written by `make release`.",
        f"# The locked wheels are for CPython {python.rsplit('.', 1)[0]} on x86-64 Linux "
        "(manylinux, glibc 2.36).",
        "#   pip install --require-hashes --find-links python -r requirements/<this file>",
        "# Offline: add --no-index and --find-links <a wheelhouse>. See docs/release.md.",
    ]
    for d in ours:
        with_extras = [e for e in extras if e in d.extras]
        spec = f"{d.name}[{','.join(with_extras)}]" if with_extras else d.name
        lines.append(f"{spec}=={d.version} \\\n    --hash=sha256:{digests[d.wheel]}")
    for w in sorted(locked, key=lambda w: canonicalize_name(w["name"])):
        lines.append(f"{w['name']}=={w['version']} \\\n    --hash=sha256:{w['sha256']}")
    return "\n".join(lines) + "\n"


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
