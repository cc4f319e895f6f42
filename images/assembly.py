"""The build's steps for one image: precompiling what Python will import, building our own
wheels from the snapshot of the tree, and assembling the layers, config, manifest, SBOM
and archive (``assemble``)."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from images import debian, oci, sbom, wheels
from images.fetch import fetch
from images.specs import ANNOTATION, DEBIAN_LOCK, ENV, USER, BuildError, ImageSpec, Project, log

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
