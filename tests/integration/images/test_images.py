"""`make images`: both OCI archives are well formed, reproducible, carry their SBOM, and
their content runs as the image says, without a container runtime: the layers are unpacked
into a directory and the entrypoints run under ``chroot`` as UID 65532 with the image's
environment, on a read-only bind mount of that directory (as ``readOnlyRootFilesystem``).

The first build reuses ``dist/images`` when it was built from the same inputs (``make
images`` just ran), the second always builds, into a temporary directory. Downloads come
from ``~/.cache/rtj/images`` after the first run.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from images import build
from images.fetch import cache_root

pytestmark = [pytest.mark.timeout(1200)]

IMAGES = ("rtj-operator", "rtj-resolver")
SHELLS = {"sh", "bash", "dash", "ash", "zsh", "ksh", "busybox", "toybox"}
NONROOT = 65532


@dataclass
class Image:
    name: str
    archive: Path
    index: dict[str, Any]
    manifest: dict[str, Any]
    config: dict[str, Any]
    layers: list[tarfile.TarFile]  # uncompressed, in order
    layer_bytes: list[bytes]
    outer: tarfile.TarFile


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    if os.geteuid() != 0:
        pytest.fail("these checks chroot into the image and need root (CI runs as root)")
    return build.build(build.DEFAULT_OUT)


def _blob(outer: tarfile.TarFile, digest: str) -> bytes:
    algo, hexdigest = digest.split(":")
    assert algo == "sha256"
    f = outer.extractfile(f"blobs/sha256/{hexdigest}")
    assert f is not None, f"{digest} is referenced but not in blobs/"
    data = f.read()
    assert hashlib.sha256(data).hexdigest() == hexdigest, f"{digest}: content does not match"
    return data


def _open(built: dict[str, Any], name: str) -> Image:
    archive = build.DEFAULT_OUT / built["images"][name]["archive"]
    outer = tarfile.open(archive)  # noqa: SIM115 (kept open for the module's tests)
    oci_layout = outer.extractfile("oci-layout")
    assert oci_layout is not None
    assert json.load(oci_layout) == {"imageLayoutVersion": "1.0.0"}
    index_file = outer.extractfile("index.json")
    assert index_file is not None
    index = json.load(index_file)
    assert index["schemaVersion"] == 2
    (desc,) = index["manifests"]
    manifest_bytes = _blob(outer, desc["digest"])
    assert len(manifest_bytes) == desc["size"]
    manifest = json.loads(manifest_bytes)
    config_bytes = _blob(outer, manifest["config"]["digest"])
    assert len(config_bytes) == manifest["config"]["size"]
    config = json.loads(config_bytes)
    layers, raw = [], []
    for desc_layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
        compressed = _blob(outer, desc_layer["digest"])
        assert len(compressed) == desc_layer["size"]
        assert desc_layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        data = gzip.decompress(compressed)
        assert "sha256:" + hashlib.sha256(data).hexdigest() == diff_id
        raw.append(data)
        layers.append(tarfile.open(fileobj=io.BytesIO(data)))  # noqa: SIM115 (in memory)
    return Image(name, archive, index, manifest, config, layers, raw, outer)


@pytest.fixture(scope="module")
def images(built: dict[str, Any]) -> dict[str, Image]:
    return {name: _open(built, name) for name in IMAGES}


def test_layout_config_and_annotations(built: dict[str, Any], images: dict[str, Image]) -> None:
    epoch = built["source_date_epoch"]
    for name, image in images.items():
        # every entry of the archive is sorted, root-owned by number, dated SOURCE_DATE_EPOCH
        names = image.outer.getnames()
        assert names == sorted(names)
        assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in image.outer} == {
            (0, 0, "", "", epoch)
        }
        assert set(names) == {
            "blobs",
            "blobs/sha256",
            "index.json",
            "oci-layout",
            *(f"blobs/sha256/{d['digest'][7:]}" for d in image.manifest["layers"]),
            f"blobs/sha256/{image.manifest['config']['digest'][7:]}",
            f"blobs/sha256/{image.index['manifests'][0]['digest'][7:]}",
        }
        desc = image.index["manifests"][0]
        assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
        version = image.manifest["annotations"]["org.opencontainers.image.version"]
        assert desc["annotations"] == {
            "io.containerd.image.name": f"ghcr.io/resilient-training/{name}:{version}",
            "org.opencontainers.image.ref.name": version,
        }
        cfg = image.config["config"]
        assert cfg["User"] == f"{NONROOT}:{NONROOT}"
        assert "PYTHONDONTWRITEBYTECODE=1" in cfg["Env"]
        assert image.config["architecture"] == "amd64" and image.config["os"] == "linux"
        assert built["images"][name]["manifest"] == desc["digest"]
    assert images["rtj-operator"].config["config"]["Entrypoint"] == [
        "/usr/bin/python3", "-m", "rtj_operator", "run",
    ]  # fmt: skip
    assert images["rtj-resolver"].config["config"]["Entrypoint"] == ["/usr/local/bin/rtj-shim"]
    # the chart's default image is this one: its tag defaults to the chart's appVersion
    chart = (build.REPO / "charts/resilient-training-operator/Chart.yaml").read_text()
    app_version = next(
        line.split(":", 1)[1].strip().strip('"')
        for line in chart.splitlines()
        if line.startswith("appVersion:")
    )
    operator = images["rtj-operator"].index["manifests"][0]["annotations"]
    assert operator["io.containerd.image.name"] == (
        f"ghcr.io/resilient-training/rtj-operator:{app_version}"
    )
    # the Debian base is one blob, shared by both images, and recorded as such
    bases = {i.manifest["layers"][0]["digest"] for i in images.values()}
    assert bases == {built["base_layer"]}


def test_layers_no_shell_no_setuid_no_host_paths(
    built: dict[str, Any], images: dict[str, Image]
) -> None:
    epoch = built["source_date_epoch"]
    leaks = [str(build.REPO), str(cache_root()), str(Path.home() / ".pyenv"), "/.venv/"]
    for image in images.values():
        files: dict[str, tarfile.TarInfo] = {}
        for layer, raw in zip(image.layers, image.layer_bytes, strict=True):
            members = layer.getmembers()
            assert [m.name for m in members] == sorted(m.name for m in members)
            for m in members:
                assert m.mtime == epoch and m.uname == "" and m.gname == "", m.name
                assert not m.name.startswith("/") and ".." not in m.name.split("/")
                owner = (NONROOT, NONROOT) if m.name == "home/nonroot" else (0, 0)
                assert (m.uid, m.gid) == owner, m.name
                assert not m.mode & 0o6000, f"{m.name} is setuid/setgid"
                assert m.isdir() or m.isfile() or m.issym(), m.name
                files[m.name] = m
            for leak in leaks:
                assert leak.encode() not in raw, f"{image.name}: a layer contains {leak}"
        basenames = {p.rsplit("/", 1)[-1] for p in files}
        assert not basenames & SHELLS, f"{image.name}: {basenames & SHELLS}"
        assert "." not in files
        # programs: the interpreter, and scripts whose interpreter is in the image (modules
        # of the standard library that Debian leaves executable are not programs here)
        merged = {n: layer for layer in image.layers for n in layer.getnames()}
        for path, m in files.items():
            if not (m.isfile() and m.mode & 0o111) or ".so" in path:
                continue
            f = merged[path].extractfile(path)
            assert f is not None
            head = f.read(128)
            if head.startswith(b"\x7fELF"):
                assert path == "usr/bin/python3.11", f"{image.name}: ELF program {path}"
            elif head.startswith(b"#!") and not path.startswith(
                ("usr/lib/python3", "usr/local/lib/")
            ):
                interpreter = head[2:].split(b"\n")[0].split()[0].decode()
                assert interpreter.lstrip("/") in files, (
                    f"{path}: {interpreter} is not in the image"
                )
        assert files["tmp"].mode == 0o1777
        assert files["usr/bin/python3"].linkname == "python3.11"


def test_sbom(built: dict[str, Any], images: dict[str, Image]) -> None:
    deb_lock, py_lock = build.load_locks()
    for name, image in images.items():
        sbom_next_to = (build.DEFAULT_OUT / built["images"][name]["sbom"]).read_bytes()
        path = image.manifest["annotations"]["dev.resilient.training.sbom.path"].lstrip("/")
        app = image.layers[-1].extractfile(path)
        assert app is not None
        assert app.read() == sbom_next_to
        digest = image.manifest["annotations"]["dev.resilient.training.sbom.digest"]
        assert digest == "sha256:" + hashlib.sha256(sbom_next_to).hexdigest()
        doc = json.loads(sbom_next_to)
        assert doc["spdxVersion"] == "SPDX-2.3"
        pkgs = {
            (p["name"], p["versionInfo"]): p["checksums"][0]["checksumValue"]
            for p in doc["packages"]
            if p.get("checksums")
        }
        for deb in deb_lock["packages"]:
            assert pkgs[(deb["name"], deb["version"])] == deb["sha256"]
        for wheel in py_lock["images"][name]["wheels"]:
            assert pkgs[(wheel["name"], wheel["version"])] == wheel["sha256"]
        ours = {"rtj-shim"} | ({"resilient-training-operator"} if name == "rtj-operator" else set())
        assert ours <= {n for n, _ in pkgs}
        contained = {r["relatedSpdxElement"] for r in doc["relationships"]}
        assert len(contained) == len(doc["packages"])  # the image + everything it contains
        # and the scanners' view: a dpkg status file per package
        status = {
            n.rsplit("/", 1)[1]
            for n in image.layers[0].getnames()
            if n.startswith("var/lib/dpkg/status.d/")
        }
        assert status == {p["name"] for p in deb_lock["packages"]}


def test_reproducible(built: dict[str, Any], tmp_path: Path) -> None:
    """A second build from the same inputs, from scratch, is byte for byte the same."""
    again = build.build(tmp_path / "again", force=True)
    first = built
    if again["input_key"] != first["input_key"]:  # someone edited the tree meanwhile
        first = build.build(build.DEFAULT_OUT)
    assert again["input_key"] == first["input_key"]
    for name in IMAGES:
        a, b = first["images"][name], again["images"][name]
        assert (a["sha256"], a["manifest"], a["sbom_sha256"]) == (
            b["sha256"],
            b["manifest"],
            b["sbom_sha256"],
        ), name


# ---------------------------------------------------------------------------- run it


@pytest.fixture(scope="module")
def rootfs(
    images: dict[str, Image], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Path]]:
    roots = {}
    for name, image in images.items():
        root = tmp_path_factory.mktemp(name) / "rootfs"
        root.mkdir()
        for layer in image.layers:
            layer.extractall(root, numeric_owner=True, filter="fully_trusted")
        roots[name] = root
    yield roots
    for root in roots.values():
        shutil.rmtree(root, ignore_errors=True)


def _tree_state(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def run_in(root: Path, image: Image, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` in the image's filesystem, read-only, as its user, with only its Env: a
    private mount namespace bind-mounts the rootfs read-only, then chroot drops to 65532."""
    env = dict(e.split("=", 1) for e in image.config["config"]["Env"])
    user = image.config["config"]["User"]
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh",
         str(root), "/usr/sbin/chroot", f"--userspec={user}", str(root), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip


CHECK = """
import importlib.machinery, os, ssl, sys
import {imports}
frozen = importlib.machinery.FrozenImporter
stale = sorted(
    n for n, m in list(sys.modules.items())
    if (getattr(m, "__file__", None) or "").endswith(".py")
    and getattr(m, "__loader__", None) is not frozen
    and not os.path.exists(getattr(m, "__cached__", None) or "")
)
assert not stale, f"imported without a .pyc: {{stale}}"
assert sys.dont_write_bytecode
assert ssl.create_default_context().cert_store_stats()["x509_ca"] > 100
assert os.getuid() == 65532 and os.getgid() == 65532
try:
    open("/written-at-runtime", "w")
except OSError as exc:
    print("read-only:", exc.strerror)
else:
    raise SystemExit("the root filesystem is writable")
import boto3
boto3.session.Session().client("s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9")
print("ok", sys.version.split()[0], len(sys.modules), "modules")
"""

RESOLVER_IMPORTS = [
    "pydantic_core", "botocore", "rtj_shim.cli", "rtj_shim.checkpoint.storage.s3",
    "rtj_shim.checkpoint.resolver",
    "rtj_shim.agent.progress_server",
]  # fmt: skip
OPERATOR_IMPORTS = [
    "pydantic_core", "kopf", "kubernetes.client", "aiohttp", "yaml", "prometheus_client",
    "rtj_operator.main", "rtj_operator.handlers", "rtj_operator.kube", "rtj_operator.selection",
    "rtj_shim.checkpoint.storage.s3",
]  # fmt: skip
COMMANDS = {
    "rtj-resolver": [
        ["rtj-shim", "--help"],
        ["rtj-shim", "resolve", "--help"],
        ["rtj-shim", "progress-server", "--help"],
        ["/usr/bin/python3", "-c", CHECK.format(imports=", ".join(RESOLVER_IMPORTS))],
    ],
    "rtj-operator": [
        ["/usr/bin/python3", "-m", "rtj_operator", "--help"],
        ["rtj", "--help"],
        ["rtj-shim", "resolve", "--help"],
        ["/usr/bin/python3", "-c", CHECK.format(imports=", ".join(OPERATOR_IMPORTS))],
    ],
}


@pytest.mark.parametrize("name", IMAGES)
def test_runs_without_a_runtime(
    name: str, images: dict[str, Image], rootfs: dict[str, Path]
) -> None:
    image, root = images[name], rootfs[name]
    before = _tree_state(root)
    cfg = image.config["config"]
    entry = [*cfg["Entrypoint"], *cfg.get("Cmd", [])]
    for argv in [entry + (["--help"] if name == "rtj-operator" else []), *COMMANDS[name]]:
        proc = run_in(root, image, argv)
        assert proc.returncode == 0, (
            f"{argv[:3]}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
        assert "usage:" in proc.stdout or proc.stdout.startswith("read-only:"), proc.stdout
        if argv[0] == "/usr/bin/python3" and argv[1] == "-c":
            assert "ok 3.11" in proc.stdout and "Read-only file system" in proc.stdout, proc.stdout
    assert _tree_state(root) == before  # nothing written, no __pycache__ made
    if name == "rtj-operator":  # kubernetes.aio is left out, on purpose (see images/build.py)
        assert not (root / "usr/local/lib/python3.11/dist-packages/kubernetes/aio").exists()
