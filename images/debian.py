"""The base root filesystem from pinned Debian packages.

``lock`` resolves the Depends/Pre-Depends closure of ``ROOTS`` with ``apt-cache`` (whose
indexes apt verified against the archive's signed Release files; run ``apt-get update``
first), less ``EXCLUDE``, and records each package's version, pool file and sha256 in
``images/debian.lock.json``. ``stage`` downloads exactly those files (by sha256, through the
cache), unpacks their ``data.tar`` with tarfile (no dpkg needed, no maintainer scripts run),
drops documentation but the copyright files, and adds what the maintainer scripts or a
distroless base would have made: ``/etc/passwd`` and ``/etc/group`` with ``nonroot``
(65532), the CA bundle, ``/usr/bin/python3``, ``/tmp``, and ``/var/lib/dpkg/status.d/<pkg>``
(each package's control stanza, where image scanners such as Trivy and Grype look).

Superseded versions leave ``deb.debian.org`` (bookworm-security replaces them in place,
and snapshot.debian.org is not reachable here): a cached ``.deb`` keeps building, a cold
machine then needs ``python -m images lock`` and a commit of the new lock.
"""

from __future__ import annotations

import io
import lzma
import re
import subprocess
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from images import oci
from images.fetch import fetch

SUITE = "bookworm"
ARCH = "amd64"
MIRRORS = {
    "debian": "https://deb.debian.org/debian",
    "debian-security": "https://deb.debian.org/debian-security",
}
ROOTS = [
    "python3.11-minimal",  # /usr/bin/python3.11 (libpython statically linked)
    "libpython3.11-stdlib",  # the standard library and its extension modules
    "ca-certificates",  # Mozilla's CA set (the bundle is made at build, see stage())
    "netbase",  # /etc/protocols, /etc/services
    "base-files",  # /etc/os-release (image scanners read it), the directory skeleton
]
# Dependencies that only maintainer scripts use (no script runs in an image) or that are
# virtual; each is named so that a new dependency shows up in `lock` as an error.
EXCLUDE = {
    "debconf": "maintainer scripts only (ca-certificates, tzdata)",
    "debconf-2.0": "virtual package of debconf",
    "openssl": "ca-certificates' update-ca-certificates; the bundle is made at build",
    "awk": "base-files' maintainer scripts (virtual, mawk)",
    "mawk": "base-files' maintainer scripts",
    "dpkg": "readline-common's maintainer scripts",
    "install-info": "readline-common's maintainer scripts",
}
DROP_PREFIXES = (
    "usr/share/man",
    "usr/share/info",
    "usr/share/lintian",
    "usr/share/locale",
    "usr/share/bug",
    "usr/share/doc-base",
    "usr/share/binfmts",
    "usr/lib/binfmt.d",
    "etc/update-motd.d",  # base-files: /bin/sh scripts for a login motd
    "usr/sbin/update-ca-certificates",  # a /bin/sh script; the bundle is made at build
)
NONROOT = 65532
PASSWD = (
    "root:x:0:0:root:/root:/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
    f"nonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n"
)
GROUP = f"root:x:0:\nnobody:x:65534:\nnonroot:x:{NONROOT}:\n"
NSSWITCH = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
CA_BUNDLE = "etc/ssl/certs/ca-certificates.crt"


class DebianError(RuntimeError):
    pass


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    arch: str
    source: str
    filename: str
    url: str
    sha256: str
    size: int

    @classmethod
    def from_lock(cls, d: dict[str, Any]) -> Package:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    @property
    def purl(self) -> str:
        version = self.version.replace(":", "%3A").replace("+", "%2B")
        return f"pkg:deb/debian/{self.name}@{version}?arch={self.arch}&distro=debian-12"


# ---------------------------------------------------------------------------- lock


def _stanzas(text: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields:
            out.append(fields)
    return out


def _candidate(name: str) -> dict[str, str]:
    proc = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", f"{name}:{ARCH}"],
        capture_output=True,
        text=True,
        check=False,
    )
    found = [s for s in _stanzas(proc.stdout) if s.get("Package") == name]
    if proc.returncode != 0 or not found:
        # an Architecture: all package is asked for without the architecture
        proc = subprocess.run(
            ["apt-cache", "show", "--no-all-versions", name],
            capture_output=True,
            text=True,
            check=False,
        )
        found = [s for s in _stanzas(proc.stdout) if s.get("Package") == name]
    if not found:
        raise DebianError(
            f"{name}: not a real package in apt's indexes (virtual? run apt-get update)"
        )
    return found[0]


_DEP = re.compile(
    r"^\s*([a-z0-9][a-z0-9+.-]*)(?::[a-z0-9]+)?\s*(?:\(\s*([<>=]+)\s*([^)]+?)\s*\))?\s*$"
)


def _parse_depends(value: str) -> list[list[tuple[str, str, str]]]:
    """``a (>= 1) | b, c`` -> [[(a, >=, 1), (b, '', '')], [(c, '', '')]]."""
    groups = []
    for group in value.split(","):
        alts = []
        for alt in group.split("|"):
            m = _DEP.match(alt)
            if m is None:
                raise DebianError(f"cannot parse dependency {alt!r}")
            alts.append((m.group(1), m.group(2) or "", (m.group(3) or "").strip()))
        groups.append(alts)
    return groups


def _version_ok(version: str, op: str, wanted: str) -> bool:
    if not op:
        return True
    dpkg_op = {">=": "ge", "<=": "le", "=": "eq", ">>": "gt", "<<": "lt"}[op]
    return (
        subprocess.run(
            ["dpkg", "--compare-versions", version, dpkg_op, wanted], check=False
        ).returncode
        == 0
    )


def resolve() -> list[Package]:
    """The closure of ROOTS under Depends and Pre-Depends, less EXCLUDE, from apt-cache."""
    chosen: dict[str, dict[str, str]] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in chosen:
            continue
        stanza = _candidate(name)
        chosen[name] = stanza
        deps = ", ".join(v for k in ("Pre-Depends", "Depends") if (v := stanza.get(k)))
        for group in _parse_depends(deps) if deps else []:
            usable = [a for a in group if a[0] not in EXCLUDE]
            if not usable:
                continue
            dep, op, wanted = next((a for a in usable if a[0] in chosen), usable[0])
            version = (chosen.get(dep) or _candidate(dep))["Version"]
            if not _version_ok(version, op, wanted):
                raise DebianError(f"{name} needs {dep} ({op} {wanted}); candidate is {version}")
            todo.append(dep)
    packages = []
    for name, s in sorted(chosen.items()):
        filename = s["Filename"]
        mirror = "debian-security" if filename.startswith("pool/updates/") else "debian"
        packages.append(
            Package(
                name=name,
                version=s["Version"],
                arch=s["Architecture"],
                source=s.get("Source", name).split(" ")[0],
                filename=filename,
                url=f"{MIRRORS[mirror]}/{filename}",
                sha256=s["SHA256"],
                size=int(s["Size"]),
            )
        )
    return packages


# ---------------------------------------------------------------------------- unpack


def _ar_members(data: bytes) -> dict[str, bytes]:
    if not data.startswith(b"!<arch>\n"):
        raise DebianError("not an ar archive")
    pos, out = 8, {}
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        pos += 60
        out[name] = data[pos : pos + size]
        pos += size + (size & 1)
    return out


def _member_tar(members: dict[str, bytes], stem: str) -> tarfile.TarFile:
    for name, blob in members.items():
        if name == stem + ".tar.xz":
            return tarfile.open(fileobj=io.BytesIO(lzma.decompress(blob)))
        if name == stem + ".tar.gz":
            return tarfile.open(fileobj=io.BytesIO(zlib.decompress(blob, 31)))
        if name == stem + ".tar":
            return tarfile.open(fileobj=io.BytesIO(blob))
    raise DebianError(f"no supported {stem}.tar.* in {sorted(members)} (zstd is not supported)")


def _dropped(path: str) -> bool:
    if any(path == p or path.startswith(p + "/") for p in DROP_PREFIXES):
        return True
    parts = path.split("/")
    # keep /usr/share/doc/<pkg>/copyright (licences), nothing else of the docs
    return parts[:3] == ["usr", "share", "doc"] and len(parts) >= 5 and parts[4] != "copyright"


def unpack(deb: Path, root: Path, tree: oci.Tree, owner: dict[str, str], name: str) -> str:
    """Unpack one .deb's data.tar into ``root`` and ``tree``; returns its control stanza."""
    members = _ar_members(deb.read_bytes())
    with _member_tar(members, "control") as control_tar:
        control_file = control_tar.extractfile("./control")
        if control_file is None:
            raise DebianError(f"{deb.name}: no control file")
        control = control_file.read().decode()
    with _member_tar(members, "data") as data:
        for info in data.getmembers():
            path = info.name.removeprefix("./").rstrip("/")
            if path in ("", ".") or _dropped(path):
                continue
            if ".." in path.split("/"):
                raise DebianError(f"{deb.name}: unsafe path {info.name!r}")
            target = root / path
            previous = tree.get(path)
            mode = info.mode & ~0o6000  # no setuid/setgid anywhere (/var/local is 2775)
            if info.isdir():
                target.mkdir(parents=True, exist_ok=True)
                if previous is None:
                    tree[path] = oci.directory(mode)
                continue
            if previous is not None:
                raise DebianError(f"{path}: shipped by both {owner[path]} and {name}")
            target.parent.mkdir(parents=True, exist_ok=True)
            if info.issym():
                target.symlink_to(info.linkname)
                tree[path] = oci.symlink(info.linkname)
            elif info.isreg():
                extracted = data.extractfile(info)
                assert extracted is not None
                target.write_bytes(extracted.read())
                target.chmod(mode & 0o755)  # the loader must be executable here
                tree[path] = oci.Entry("file", mode, source=target)
            elif info.islnk():  # a hard link: stored as a copy (layer order is sorted)
                linked = info.linkname.removeprefix("./")
                target.write_bytes((root / linked).read_bytes())
                tree[path] = oci.Entry("file", tree[linked].mode, source=target)
            else:
                raise DebianError(f"{deb.name}: {info.name} is neither file, dir nor link")
            owner[path] = name
    return control


def _ca_bundle(root: Path, tree: oci.Tree) -> bytes:
    """What update-ca-certificates writes: every certificate ca-certificates ships (all are
    enabled by default), in path order."""
    certs = sorted(
        p
        for p, e in tree.items()
        if p.startswith("usr/share/ca-certificates/") and p.endswith(".crt") and e.kind == "file"
    )
    if not certs:
        raise DebianError("no certificates under /usr/share/ca-certificates")
    parts = []
    for p in certs:
        pem = (root / p).read_bytes()
        parts.append(pem if pem.endswith(b"\n") else pem + b"\n")
    return b"".join(parts)


@dataclass
class Base:
    """The unpacked base: its files on disk (for compiling and running the interpreter)
    and as a layer tree."""

    root: Path
    tree: oci.Tree
    packages: list[Package]

    @property
    def python(self) -> list[str]:
        """argv prefix that runs the image's python3.11 on the build host through the image's
        own loader and libraries (no host glibc or Python involved)."""
        libs = ":".join(
            str(self.root / d) for d in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu")
        )
        return [  # lib64/ld-linux-x86-64.so.2 is an absolute link: the host's, here
            str(self.root / "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
            "--library-path",
            libs,
            str(self.root / "usr/bin/python3.11"),
        ]

    def python_env(self) -> dict[str, str]:
        return {
            "PYTHONHOME": str(self.root / "usr"),
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
            "LC_ALL": "C.UTF-8",
            "PATH": "/usr/bin:/bin",
        }


def stage(packages: list[Package], root: Path, cache: Path | None = None) -> Base:
    """Unpack the locked packages into ``root`` and add the generated files."""
    tree: oci.Tree = {}
    owner: dict[str, str] = {}
    status: dict[str, str] = {}
    for pkg in packages:
        deb = fetch(pkg.url, pkg.sha256, cache)
        status[pkg.name] = unpack(deb, root, tree, owner, pkg.name)
    generated: oci.Tree = {
        "etc/passwd": oci.file_bytes(PASSWD.encode()),
        "etc/group": oci.file_bytes(GROUP.encode()),
        "etc/nsswitch.conf": oci.file_bytes(NSSWITCH.encode()),
        CA_BUNDLE: oci.file_bytes(_ca_bundle(root, tree)),
        "usr/bin/python3": oci.symlink("python3.11"),
        "tmp": oci.directory(0o1777),
        "home/nonroot": oci.directory(0o700, uid=NONROOT, gid=NONROOT),
        "var/lib/dpkg/status.d": oci.directory(),
    }
    if "usr/lib/ssl/cert.pem" not in tree:  # OpenSSL's default CA file and dir (package openssl)
        generated["usr/lib/ssl/cert.pem"] = oci.symlink("/" + CA_BUNDLE)
        generated["usr/lib/ssl/certs"] = oci.symlink("/etc/ssl/certs")
    for name, control in status.items():
        generated[f"var/lib/dpkg/status.d/{name}"] = oci.file_bytes(control.encode())
    for path, entry in generated.items():
        if path in tree and tree[path].kind != "dir":
            raise DebianError(f"{path}: generated, but {owner.get(path)} ships it")
        tree[path] = entry
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if entry.kind == "dir":
            target.mkdir(exist_ok=True)
        elif entry.kind == "symlink":
            target.unlink(missing_ok=True)
            target.symlink_to(entry.linkname)
        else:
            target.write_bytes(entry.read())
    return Base(root=root, tree=tree, packages=packages)
