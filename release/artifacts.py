"""Building the release's artifacts: reproducible sdists and wheels, the packaged chart, the
hash-pinned requirement files."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

import yaml
from packaging.utils import canonicalize_name

from images import build as images
from images.fetch import fetch
from images.wheels import Wheel
from release.common import (
    BACKEND,
    CHART,
    ReleaseError,
    log,
    run,
)

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
