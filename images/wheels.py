"""Python distributions: the lock (pip's resolver, run once) and installing wheels into a
layer (unzipping, run at every build).

``lock`` asks pip to resolve each image's requirements for the image's interpreter, not the
host's (``--python-version``/``--abi cp311``/``--platform manylinux_2_17..2_36``, binary
wheels only), with the versions the test suite runs with as constraints (``pip freeze`` of
the interpreter running the lock, normally ``.venv``), and records every wheel's URL and
sha256. Installing is what pip does for a wheel, minus everything host specific: files go
to ``/usr/local/lib/python3.11/dist-packages`` (on Debian's ``sys.path``), console scripts
to ``/usr/local/bin`` with ``#!/usr/bin/python3.11``, RECORD gets the scripts, INSTALLER
says who installed it, and no ``direct_url.json`` names a host path.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath
from typing import Any

from images import oci

PYTHON_ABI = "cp311"
SITE = "usr/local/lib/python3.11/dist-packages"
BIN = "usr/local/bin"
SHEBANG = "#!/usr/bin/python3.11"
GLIBC_MINOR = 36  # Debian bookworm's glibc 2.36
PLATFORMS = [
    "manylinux2014_x86_64",
    *(f"manylinux_2_{m}_x86_64" for m in range(17, GLIBC_MINOR + 1)),
]
INSTALLER = b"rtj-images\n"


class WheelError(RuntimeError):
    pass


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    filename: str
    url: str
    sha256: str

    @classmethod
    def from_lock(cls, d: dict[str, Any]) -> Wheel:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    @property
    def purl(self) -> str:
        return f"pkg:pypi/{normalize(self.name)}@{self.version}"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------------------- lock


def _venv_constraints() -> str:
    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return "\n".join(line for line in freeze.splitlines() if "==" in line) + "\n"


def resolve(requirements: list[str], python_version: str, constrain: bool = True) -> list[Wheel]:
    """Exact wheels for ``requirements`` on the image's CPython ``python_version``."""
    with tempfile.TemporaryDirectory(prefix="rtj-lock-") as tmp:
        report = Path(tmp) / "report.json"
        args = [
            sys.executable, "-m", "pip", "install", "--quiet", "--dry-run",
            "--ignore-installed", "--only-binary=:all:", "--report", str(report),
            "--target", str(Path(tmp) / "target"), "--python-version", python_version,
            "--implementation", "cp", "--abi", PYTHON_ABI,
        ]  # fmt: skip
        for platform in PLATFORMS:
            args += ["--platform", platform]
        if constrain:
            constraints = Path(tmp) / "constraints.txt"
            constraints.write_text(_venv_constraints())
            args += ["--constraint", str(constraints)]
        subprocess.run([*args, *requirements], check=True)
        installs = json.loads(report.read_text())["install"]
    wheels = []
    for item in installs:
        info = item["download_info"]
        url = info["url"]
        wheels.append(
            Wheel(
                name=item["metadata"]["name"],
                version=item["metadata"]["version"],
                filename=url.rsplit("/", 1)[1],
                url=url,
                sha256=info["archive_info"]["hashes"]["sha256"],
            )
        )
    return sorted(wheels, key=lambda w: normalize(w.name))


# ---------------------------------------------------------------------------- install


def check_tags(filename: str) -> None:
    """The wheel runs on the image's interpreter: py3/cp311/abi3 and a manylinux <= 2.36."""
    parts = filename[: -len(".whl")].split("-")
    pythons, abis, platforms = (set(p.split(".")) for p in parts[-3:])
    if "abi3" in abis:  # cp3X-abi3 runs on every CPython >= 3.X
        ok_python = any(re.fullmatch(r"cp3(\d+)", p) and int(p[3:]) <= 11 for p in pythons)
    else:
        ok_python = bool(pythons & {"py3", "cp311"})
    ok_abi = bool(abis & {"none", "abi3", PYTHON_ABI})
    ok_platform = bool(platforms & {"any", *PLATFORMS})
    if not (ok_python and ok_abi and ok_platform):
        raise WheelError(f"{filename}: not installable on CPython 3.11 / glibc 2.{GLIBC_MINOR}")


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _script(module: str, func: str) -> bytes:
    attr = func.split(".")[0]
    return (
        f"{SHEBANG}\n"
        "import sys\n"
        f"from {module} import {attr}\n"
        "if __name__ == '__main__':\n"
        f"    sys.exit({func}())\n"
    ).encode()


def _entry_points(text: str) -> dict[str, str]:
    """console_scripts from entry_points.txt: name -> 'module:func'."""
    scripts: dict[str, str] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]").strip()
        elif section == "console_scripts" and "=" in line:
            name, _, target = line.partition("=")
            scripts[name.strip()] = target.split("[")[0].strip()
    return scripts


def _safe(path: str) -> str:
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts:
        raise WheelError(f"unsafe path in wheel: {path!r}")
    return str(p)


@dataclass(frozen=True)
class Installed:
    name: str
    version: str
    license: str
    scripts: tuple[str, ...]


def install(wheel: Path, filename: str, root: Path, tree: oci.Tree) -> Installed:
    """Install one wheel into ``root`` (a layer's directory) and ``tree``."""
    check_tags(filename)
    files: dict[str, tuple[bytes, int]] = {}  # in-image path -> (data, mode)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        if len(dist_info) != 1:
            raise WheelError(f"{filename}: {len(dist_info)} .dist-info directories")
        info_dir = dist_info.pop()
        data_dir = info_dir[: -len(".dist-info")] + ".data"
        for zi in zf.infolist():
            if zi.is_dir():
                continue
            name = _safe(zi.filename)
            data = zf.read(zi)
            executable = bool((zi.external_attr >> 16) & 0o111)
            if name.startswith(data_dir + "/"):
                _, kind, rest = name.split("/", 2)
                if kind in ("purelib", "platlib"):
                    dest = f"{SITE}/{rest}"
                elif kind == "scripts":
                    if data.startswith(b"#!python"):  # the wheel spec's placeholder
                        _, _, body = data.partition(b"\n")
                        data = SHEBANG.encode() + b"\n" + body
                    dest, executable = f"{BIN}/{rest}", True
                elif kind == "data":
                    dest = f"usr/local/{rest}"
                else:
                    raise WheelError(f"{filename}: unsupported {kind} in {data_dir}")
            else:
                dest = f"{SITE}/{name}"
            files[dest] = (data, 0o755 if executable else 0o644)
    meta = HeaderParser().parsestr(files[f"{SITE}/{info_dir}/METADATA"][0].decode())
    eps = files.get(f"{SITE}/{info_dir}/entry_points.txt")
    scripts = _entry_points(eps[0].decode()) if eps else {}
    record_path = f"{SITE}/{info_dir}/RECORD"
    record = files[record_path][0].decode()
    extra_rows = []
    for script, entry_point in sorted(scripts.items()):
        module, _, func = entry_point.partition(":")
        data = _script(module, func)
        files[f"{BIN}/{script}"] = (data, 0o755)
        extra_rows.append([f"../../../bin/{script}", _record_hash(data), str(len(data))])
    files[f"{SITE}/{info_dir}/INSTALLER"] = (INSTALLER, 0o644)
    extra_rows.append([f"{info_dir}/INSTALLER", _record_hash(INSTALLER), str(len(INSTALLER))])
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(extra_rows)
    files[record_path] = ((record.rstrip("\n") + "\n" + out.getvalue()).encode(), 0o644)
    for dest, (data, mode) in files.items():
        if dest in tree:
            raise WheelError(f"{filename}: {dest} is already installed by another wheel")
        target = root / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        tree[dest] = oci.Entry("file", mode, source=target)
    license_ = meta.get("License-Expression") or meta.get("License") or ""
    return Installed(
        name=str(meta["Name"]),
        version=str(meta["Version"]),
        license=license_ if len(license_) < 80 else "",
        scripts=tuple(sorted(scripts)),
    )
