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
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import posixpath
import re
import shutil
import subprocess
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from images import debian, oci, sbom, wheels
from images.fetch import fetch, sha256_file

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


# ---------------------------------------------------------------------------- inputs

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


# ---------------------------------------------------------------------------- steps

COMPILE = r"""
import py_compile, sys
mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
for line in sys.stdin:
    src, cfile, dfile = line.rstrip("\n").split("\t")
    try:
        py_compile.compile(src, cfile=cfile, dfile=dfile, doraise=True, invalidation_mode=mode)
        print("ok\t" + cfile)
    except py_compile.PyCompileError as exc:
        print("error\t" + dfile + "\t" + str(exc).replace("\n", " "))
"""
CACHE_TAG = "cpython-311"


def _resolve(tree: oci.Tree, path: str) -> str | None:
    """Follow a symlink entry inside the image (an absolute target is the image's, never the
    build host's); the regular file it ends at, or None."""
    for _ in range(40):
        entry = tree.get(path)
        if entry is None or entry.kind == "dir":
            return None
        if entry.kind == "file":
            return path
        link = entry.linkname
        base_dir = "" if link.startswith("/") else posixpath.dirname(path)
        path = posixpath.normpath(posixpath.join("/", base_dir, link)).lstrip("/")
    return None


def precompile(base: debian.Base, root: Path, tree: oci.Tree, under: tuple[str, ...]) -> int:
    """Compile every .py of ``tree`` below ``under`` (a symlink: the file it points to in the
    image) with the image's interpreter, in one process with PYTHONHASHSEED=0, as
    unchecked-hash .pyc (no mtime recorded, never re-validated against the source), and add
    them to the tree. Returns how many failed (syntax the interpreter refuses, e.g. Python 2
    test data); those modules would fail to import anyway."""
    lines = []
    for path in sorted(p for p in tree if p.endswith(".py") and p.startswith(under)):
        src = _resolve(tree, path)
        if src is None:
            continue
        directory, name = posixpath.split(path)
        cfile = f"{directory}/__pycache__/{name[:-3]}.{CACHE_TAG}.pyc"
        lines.append(f"{root / src}\t{root / cfile}\t/{path}\n")
    proc = subprocess.run(
        [*base.python, "-S", "-c", COMPILE],
        input="".join(lines),
        capture_output=True,
        text=True,
        env=base.python_env(),
        check=False,
    )
    if proc.returncode != 0:
        raise BuildError(f"compiling .py files failed: {proc.stderr[-2000:]}")
    failed = 0
    prefix = str(root) + "/"
    for line in proc.stdout.splitlines():
        status, path, *rest = line.split("\t")
        if status == "ok":
            tree[path.removeprefix(prefix)] = oci.Entry("file", 0o644, source=Path(path))
        else:
            failed += 1
            log(f"not precompiled: {path}: {rest[0] if rest else ''}")
    return failed


def build_own_wheel(
    base: debian.Base,
    project: Project,
    files: dict[str, bytes],
    setuptools: Path,
    work: Path,
    epoch: int,
) -> Path:
    """Build one of our distributions from a copy of its sources with the pinned setuptools,
    run by the image's interpreter (nothing of the host's Python in the result)."""
    src = work / "src" / project.directory.replace("/", "_").replace(".", "root")
    if src.exists():
        shutil.rmtree(src)
    prefix = "" if project.directory == "." else project.directory + "/"
    for name, data in sorted(files.items()):
        target = src / name.removeprefix(prefix)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.utime(target, (epoch, epoch))
    out = work / "wheels"
    out.mkdir(parents=True, exist_ok=True)
    env = {**base.python_env(), "PYTHONPATH": str(setuptools), "SOURCE_DATE_EPOCH": str(epoch)}
    proc = subprocess.run(
        [
            *base.python,
            "-S",
            "-c",
            "import sys; from setuptools import build_meta; "
            "print(build_meta.build_wheel(sys.argv[1]))",
            str(out),
        ],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise BuildError(
            f"building {project.directory} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        )
    return out / proc.stdout.strip().splitlines()[-1]


def _iso(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


@dataclass
class Built:
    name: str
    archive: Path
    archive_sha256: str
    manifest_digest: str
    size: int
    layers: list[dict[str, Any]]
    sbom: Path
    sbom_sha256: str


def assemble(
    spec: ImageSpec,
    base: debian.Base,
    base_layer: oci.Layer,
    python_lock: dict[str, Any],
    own_wheels: dict[str, Path],
    work: Path,
    out: Path,
    epoch: int,
    registry: str,
) -> Built:
    blobs = work / "blobs" / spec.name
    # layer 2: third-party wheels
    deps_root = work / spec.name / "deps"
    deps_tree: oci.Tree = {}
    components: list[sbom.Component] = []
    for item in python_lock["images"][spec.name]["wheels"]:
        wheel = wheels.Wheel.from_lock(item)
        path = fetch(wheel.url, wheel.sha256)
        installed = wheels.install(path, wheel.filename, deps_root, deps_tree)
        components.append(
            sbom.Component(
                kind="python",
                name=installed.name,
                version=installed.version,
                sha256=wheel.sha256,
                purl=wheel.purl,
                download=wheel.url,
                supplier="NOASSERTION",
                license=installed.license,
            )
        )
    for dist, below, why in spec.prune:
        prefix = f"{wheels.SITE}/{below}"
        removed = [p for p in deps_tree if p == prefix or p.startswith(prefix + "/")]
        if not removed:
            raise BuildError(f"{spec.name}: nothing to prune at {below}")
        for p in removed:
            del deps_tree[p]
        components = [
            dataclasses.replace(c, note=f"/{prefix} left out: {why}")
            if wheels.normalize(c.name) == wheels.normalize(dist)
            else c
            for c in components
        ]
    precompile(base, deps_root, deps_tree, (wheels.SITE,))
    deps_layer = oci.write_layer(deps_tree, epoch, blobs)
    # layer 3: our distributions and the SBOM
    app_root = work / spec.name / "app"
    app_tree: oci.Tree = {}
    version = ""
    for project in spec.projects:
        wheel_path = own_wheels[project.directory]
        installed = wheels.install(wheel_path, wheel_path.name, app_root, app_tree)
        version = version or installed.version
        components.append(
            sbom.Component(
                kind="python",
                name=installed.name,
                version=installed.version,
                sha256=oci.sha256_hex(wheel_path.read_bytes()),
                purl=f"pkg:pypi/{wheels.normalize(installed.name)}@{installed.version}",
                download="NOASSERTION",
                supplier="Organization: Resilient Training Operator maintainers",
                source=f"built from {sbom.PROJECT_URL} ({project.directory})",
                license=installed.license,
            )
        )
    precompile(base, app_root, app_tree, (wheels.SITE,))
    for pkg in base.packages:
        components.append(
            sbom.Component(
                kind="deb",
                name=pkg.name,
                version=pkg.version,
                sha256=pkg.sha256,
                purl=pkg.purl,
                download=pkg.url,
                supplier="Organization: Debian",
                source=f"built from Debian source package {pkg.source}",
            )
        )
    bom = sbom.document(spec.name, version, components, epoch)
    sbom_path = f"usr/share/sbom/{spec.name}.spdx.json"
    app_tree[sbom_path] = oci.file_bytes(bom)
    app_layer = oci.write_layer(app_tree, epoch, blobs)

    layers = [base_layer, deps_layer, app_layer]
    labels = {
        "org.opencontainers.image.title": spec.name,
        "org.opencontainers.image.description": spec.description,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.created": _iso(epoch),
        "org.opencontainers.image.source": sbom.PROJECT_URL,
        "org.opencontainers.image.licenses": "Apache-2.0",
    }
    locked = python_lock["images"][spec.name]["wheels"]
    history_by = [
        f"debian bookworm packages from images/debian.lock.json ({len(base.packages)})",
        f"python wheels from images/python.lock.json ({len(locked)})",
        f"our distributions ({', '.join(p.directory for p in spec.projects)}) and the SBOM",
    ]
    config: dict[str, Any] = {
        "created": _iso(epoch),
        "architecture": debian.ARCH,
        "os": "linux",
        "config": {
            "User": USER,
            "Env": ENV,
            "Entrypoint": list(spec.entrypoint),
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [
            {"created": _iso(epoch), "created_by": f"rtj-images: {by}"} for by in history_by
        ],
    }
    if spec.cmd:
        config["config"]["Cmd"] = list(spec.cmd)
    config_blob = oci.write_blob(oci.canonical_json(config), blobs)
    manifest = {
        "schemaVersion": 2,
        "mediaType": oci.MEDIA_MANIFEST,
        "config": oci.descriptor(oci.MEDIA_CONFIG, config_blob),
        "layers": [oci.descriptor(oci.MEDIA_LAYER_GZIP, layer.blob) for layer in layers],
        "annotations": {
            **labels,
            f"{ANNOTATION}.sbom.digest": "sha256:" + oci.sha256_hex(bom),
            f"{ANNOTATION}.sbom.path": "/" + sbom_path,
            f"{ANNOTATION}.sbom.mediatype": sbom.MEDIA_TYPE,
            f"{ANNOTATION}.base.layer": base_layer.blob.digest,
            f"{ANNOTATION}.base.lock": "sha256:" + oci.sha256_hex(DEBIAN_LOCK.read_bytes()),
        },
    }
    manifest_blob = oci.write_blob(oci.canonical_json(manifest), blobs)
    ref = f"{registry}/{spec.name}:{version}"
    index = {
        "schemaVersion": 2,
        "mediaType": oci.MEDIA_INDEX,
        "manifests": [
            oci.descriptor(
                oci.MEDIA_MANIFEST,
                manifest_blob,
                platform={"architecture": debian.ARCH, "os": "linux"},
                annotations={
                    "io.containerd.image.name": ref,
                    "org.opencontainers.image.ref.name": version,
                },
            )
        ],
    }
    archive = out / f"{spec.name}.oci.tar"
    archive_sha = oci.write_archive(
        archive,
        oci.canonical_json(index),
        [manifest_blob, config_blob, *(layer.blob for layer in layers)],
        epoch,
    )
    sbom_file = out / f"{spec.name}.spdx.json"
    sbom_file.write_bytes(bom)
    return Built(
        name=spec.name,
        archive=archive,
        archive_sha256=archive_sha,
        manifest_digest=manifest_blob.digest,
        size=archive.stat().st_size,
        layers=[
            {"digest": layer.blob.digest, "size": layer.blob.size, "diff_id": layer.diff_id}
            for layer in layers
        ],
        sbom=sbom_file,
        sbom_sha256=oci.sha256_hex(bom),
    )


# ---------------------------------------------------------------------------- build


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
