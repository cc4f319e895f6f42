"""`make release` (``python -m release build``): a release built twice into temporary
directories has every artifact, checksums that hold, byte-identical distributions and chart,
wheels that are the ones inside the images, a chart helm accepts, and requirement files that
install both packages offline into a fresh virtualenv, hash-checked, so that nobody else's
``rtj-shim`` can take the place of ours.

The images step reuses ``dist/images`` when it is fresh (``make images`` or ``make release``
just ran) and rebuilds it otherwise; the locked dependency wheels come from the download
cache the images build fills (``~/.cache/rtj/images``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from images import build as images
from images.fetch import fetch, sha256_file
from images.wheels import Wheel
from release import build as release

pytestmark = [pytest.mark.timeout(1200)]

OPERATOR = "resilient-training-operator"
SHIM = "rtj-shim"
IMAGES = ("rtj-operator", "rtj-resolver")
KUBE_VERSION = "1.35.4"


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("release")
    info = release.build(root / "a")
    release.build(root / "b")
    return root / "a", root / "b", info


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The third-party wheels both images pin (sha256-checked, from the download cache)."""
    _, python_lock = images.load_locks()
    house = tmp_path_factory.mktemp("wheelhouse")
    for image in IMAGES:
        for item in python_lock["images"][image]["wheels"]:
            wheel = Wheel.from_lock(item)
            shutil.copyfile(fetch(wheel.url, wheel.sha256), house / wheel.filename)
    return house


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _sums(root: Path) -> dict[str, str]:
    sums = {}
    for line in (root / "SHA256SUMS").read_text().splitlines():
        digest, path = line.split("  ", 1)
        sums[path] = digest
    return sums


def _chart() -> dict[str, Any]:
    return yaml.safe_load((release.CHART / "Chart.yaml").read_text())  # type: ignore[no-any-return]


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def _pip_install(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pip (this interpreter's) installing into another environment, never from an index."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_CONFIG_FILE": os.devnull}
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def _in_venv(python: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=python.parent, check=False
    )


def _decoy_wheel(directory: Path, version: str) -> Path:
    """A wheel named rtj-shim from someone else: what a squatter would publish."""
    directory.mkdir(parents=True, exist_ok=True)
    info = f"rtj_shim-{version}.dist-info"
    files = {
        "rtj_shim/__init__.py": b"DECOY = True\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: rtj-shim\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: decoy\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = directory / f"rtj_shim-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


# ---------------------------------------------------------------------------- contents


def test_every_artifact_is_there_and_described(releases: tuple[Path, Path, dict[str, Any]]) -> None:
    out, _, info = releases
    version = info["version"]
    chart = _chart()
    assert version == chart["appVersion"]
    assert _files(out) == {
        "SHA256SUMS",
        "release-info.json",
        f"chart/{chart['name']}-{chart['version']}.tgz",
        "images/build-info.json",
        *(f"images/{i}.{ext}" for i in IMAGES for ext in ("oci.tar", "spdx.json")),
        *(
            f"python/{n}-{version}{suffix}"
            for n in ("resilient_training_operator", "rtj_shim")
            for suffix in ("-py3-none-any.whl", ".tar.gz")
        ),
        f"requirements/{OPERATOR}.txt",
        f"requirements/{SHIM}.txt",
    }
    assert json.loads((out / "release-info.json").read_text()) == info
    built = json.loads((out / "images" / "build-info.json").read_text())  # the images build's
    for name in IMAGES:
        described = info["images"][name]
        # the archive is the images build's, and its index points at the recorded manifest
        assert described["archive"]["sha256"] == built["images"][name]["sha256"]
        assert described["manifest_digest"] == built["images"][name]["manifest"]
        assert described["reference"] == f"ghcr.io/resilient-training/{name}:{version}"
        with tarfile.open(out / described["archive"]["path"]) as tf:
            index_file = tf.extractfile("index.json")
            assert index_file is not None
            (manifest,) = json.load(index_file)["manifests"]
        assert manifest["digest"] == described["manifest_digest"]
    for name in (OPERATOR, SHIM):
        assert info["python"][name]["version"] == version
    assert info["python"][OPERATOR]["requires_dist"][0] == SHIM
    assert info["chart"]["app_version"] == version
    for entry in [
        info["chart"],
        *(info["python"][n][k] for n in (OPERATOR, SHIM) for k in ("wheel", "sdist")),
        *(info["images"][i][k] for i in IMAGES for k in ("archive", "sbom")),
    ]:
        path = out / entry["path"]
        assert (sha256_file(path), path.stat().st_size) == (entry["sha256"], entry["size"])


def test_sha256sums_covers_every_file_and_holds(
    releases: tuple[Path, Path, dict[str, Any]],
) -> None:
    out, _, _ = releases
    sums = _sums(out)
    assert set(sums) == _files(out) - {"SHA256SUMS"}
    for path, digest in sums.items():
        assert sha256_file(out / path) == digest, path
    check = subprocess.run(
        ["sha256sum", "--check", "--strict", "SHA256SUMS"],
        cwd=out,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK") == len(sums)


def test_building_twice_gives_the_same_bytes(releases: tuple[Path, Path, dict[str, Any]]) -> None:
    a, b, info = releases
    epoch = info["source_date_epoch"]
    reproduced = sorted(
        p for p in _files(a) if p.startswith(("python/", "chart/", "requirements/", "images/"))
    )
    assert len(reproduced) == 12
    for path in reproduced:
        assert (a / path).read_bytes() == (b / path).read_bytes(), path
    # the tarballs carry nothing of the machine or the moment
    tarballs = [
        info["chart"]["path"],
        *(info["python"][n]["sdist"]["path"] for n in (OPERATOR, SHIM)),
    ]
    for path in tarballs:
        with tarfile.open(a / path) as tf:
            members = tf.getmembers()
        assert members
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {
            (epoch, 0, 0, "", "")
        }
    for n in (OPERATOR, SHIM):
        with zipfile.ZipFile(a / info["python"][n]["wheel"]["path"]) as zf:
            stamps = {i.date_time for i in zf.infolist()}
        assert len(stamps) == 1, stamps  # every entry at SOURCE_DATE_EPOCH (UTC)
    # `helm push` records the archive's mtime as the manifest's creation time
    assert int((a / info["chart"]["path"]).stat().st_mtime) == epoch


def test_the_wheels_are_the_ones_inside_the_images(
    releases: tuple[Path, Path, dict[str, Any]],
) -> None:
    out, _, info = releases
    recorded: dict[str, set[str]] = {}
    for image in IMAGES:
        doc = json.loads((out / "images" / f"{image}.spdx.json").read_text())
        for pkg in doc["packages"]:
            if pkg["name"] in (OPERATOR, SHIM):
                recorded.setdefault(pkg["name"], set()).update(
                    c["checksumValue"] for c in pkg["checksums"]
                )
    assert recorded == {
        OPERATOR: {info["python"][OPERATOR]["wheel"]["sha256"]},
        SHIM: {info["python"][SHIM]["wheel"]["sha256"]},
    }
    with zipfile.ZipFile(out / info["python"][OPERATOR]["wheel"]["path"]) as zf:
        names = set(zf.namelist())
    assert "rtj_operator/py.typed" in names
    assert any(n.startswith("rtj_operator/api/schemas/") and n.endswith(".json") for n in names)


def test_the_packaged_chart_lints_and_renders_this_release(
    releases: tuple[Path, Path, dict[str, Any]],
) -> None:
    out, _, info = releases
    helm = release.helm_binary()
    tgz = str(out / info["chart"]["path"])
    lint = subprocess.run([helm, "lint", tgz], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    digest = info["images"]["rtj-operator"]["manifest_digest"]
    rendered = subprocess.run(
        [helm, "template", "rtj", tgz, "--namespace", "rtj-system",
         "--kube-version", KUBE_VERSION, "--set", f"image.digest={digest}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    (deployment,) = (d for d in docs if d["kind"] == "Deployment")
    pod_images = {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert f"{info['images']['rtj-operator']['reference']}@{digest}" in pod_images


# ---------------------------------------------------------------------------- installs


def test_both_packages_install_offline_hash_checked(
    releases: tuple[Path, Path, dict[str, Any]], wheelhouse: Path, tmp_path: Path
) -> None:
    out, _, info = releases
    version = info["version"]
    python = _venv(tmp_path / "operator")
    installed = _pip_install(
        python,
        "--require-hashes",
        "--find-links", str(out / "python"),
        "--find-links", str(wheelhouse),
        "-r", str(out / "requirements" / f"{OPERATOR}.txt"),
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    probe = _in_venv(
        python,
        "import importlib.metadata as m, rtj_operator, rtj_shim, boto3; "
        f"print(m.version('{OPERATOR}'), m.version('{SHIM}'), rtj_shim.__file__)",
    )
    assert probe.returncode == 0, probe.stderr
    op_version, shim_version, shim_file = probe.stdout.split()
    assert (op_version, shim_version) == (version, version)
    assert Path(shim_file).is_relative_to(tmp_path / "operator")
    for script in ("rtj", "rtj-shim"):
        cli = subprocess.run(
            [str(python.parent / script), "--help"], capture_output=True, text=True, check=False
        )
        assert cli.returncode == 0 and "usage" in cli.stdout, cli.stderr

    # the shim's file installs the shim (with S3) and nothing of the operator
    python = _venv(tmp_path / "shim")
    installed = _pip_install(
        python,
        "--require-hashes",
        "--find-links", str(out / "python"),
        "--find-links", str(wheelhouse),
        "-r", str(out / "requirements" / f"{SHIM}.txt"),
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert _in_venv(python, "import rtj_shim.checkpoint.storage.s3").returncode == 0
    missing = _in_venv(python, "import rtj_operator")
    assert "ModuleNotFoundError" in missing.stderr


def test_a_squatted_rtj_shim_never_installs_through_the_requirement_files(
    releases: tuple[Path, Path, dict[str, Any]], wheelhouse: Path, tmp_path: Path
) -> None:
    """Someone else's rtj-shim, seen by pip beside our release: a plain install of the
    operator wheel takes it (its dependency is only `rtj-shim`); the release's requirement
    file installs ours, and when only a same-version impostor is available it fails."""
    out, _, info = releases
    operator_wheel = str(out / info["python"][OPERATOR]["wheel"]["path"])
    squatter = tmp_path / "squatter"
    _decoy_wheel(squatter, "99.0")

    naive = _venv(tmp_path / "naive")
    result = _pip_install(
        naive, "--find-links", str(squatter), "--find-links", str(wheelhouse), operator_wheel
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert _in_venv(naive, "import rtj_shim; print(rtj_shim.DECOY)").stdout.strip() == "True"

    pinned = _venv(tmp_path / "pinned")
    result = _pip_install(
        pinned,
        "--require-hashes",
        "--find-links", str(squatter),
        "--find-links", str(out / "python"),
        "--find-links", str(wheelhouse),
        "-r", str(out / "requirements" / f"{OPERATOR}.txt"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    probe = _in_venv(pinned, "import rtj_shim; print(hasattr(rtj_shim, 'DECOY'))")
    assert probe.stdout.strip() == "False", probe.stderr

    impostor = tmp_path / "impostor"
    _decoy_wheel(impostor, info["version"])
    only_operator = tmp_path / "only-operator"
    only_operator.mkdir()
    shutil.copy(operator_wheel, only_operator)
    refused = _venv(tmp_path / "refused")
    result = _pip_install(
        refused,
        "--require-hashes",
        "--find-links", str(impostor),
        "--find-links", str(only_operator),
        "--find-links", str(wheelhouse),
        "-r", str(out / "requirements" / f"{OPERATOR}.txt"),
    )  # fmt: skip
    assert result.returncode != 0
    assert "DO NOT MATCH THE HASHES" in result.stderr
    assert info["python"][SHIM]["wheel"]["sha256"] in result.stderr
    assert _in_venv(refused, "import rtj_shim").returncode != 0


# ---------------------------------------------------------------------------- refusals


def test_a_chart_app_version_that_differs_fails_before_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(release.CHART, chart)
    meta = _chart()
    meta["appVersion"] = "9.9.9"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    monkeypatch.setattr(release, "CHART", chart)
    previous = tmp_path / "previous"
    previous.mkdir()
    (previous / "release-info.json").write_text("{}\n")

    def no_images(*args: object, **kwargs: object) -> dict[str, Any]:
        raise AssertionError("the versions are checked before the images are built")

    monkeypatch.setattr(images, "build", no_images)
    with pytest.raises(release.ReleaseError) as failed:
        release.build(previous)
    message = str(failed.value)
    assert "Chart.yaml: appVersion '9.9.9'" in message
    version = tomllib.loads((release.REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f"differs from the Python distributions' version ({OPERATOR} {version}" in message
    assert _files(previous) == {"release-info.json"}  # the previous release is untouched


def test_a_failed_release_leaves_the_previous_one_and_nothing_else(
    releases: tuple[Path, Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous = tmp_path / "release"
    shutil.copytree(releases[0], previous)
    before = {p: sha256_file(previous / p) for p in _files(previous)}

    def broken_chart(*args: object, **kwargs: object) -> Path:
        raise release.ReleaseError("helm package failed (exit 1): a broken template")

    monkeypatch.setattr(release, "package_chart", broken_chart)
    with pytest.raises(release.ReleaseError, match="a broken template"):
        release.build(previous)
    assert {p: sha256_file(previous / p) for p in _files(previous)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release"]  # no staging, no work dir

    monkeypatch.setattr(release, "git_source", lambda: {"commit": "0" * 40, "dirty": True})
    with pytest.raises(release.ReleaseError, match="--require-clean: the working tree has changes"):
        release.build(tmp_path / "clean-only", require_clean=True)
    assert not (tmp_path / "clean-only").exists()


def test_version_checks_name_what_disagrees() -> None:
    chart = {"version": "0.1.0", "appVersion": "0.1.0"}
    modules = {
        OPERATOR: ("operator/rtj_operator/__init__.py", "0.1.0"),
        SHIM: ("trainer-shim/rtj_shim/__init__.py", "0.0.9"),
    }
    problems = release.version_problems({OPERATOR: "0.1.0", SHIM: "0.2.0"}, modules, chart)
    assert any("different versions" in p and "rtj-shim 0.2.0" in p for p in problems)
    assert any(
        p.startswith("trainer-shim/rtj_shim/__init__.py: __version__ = '0.0.9'") for p in problems
    )
    assert any("appVersion '0.1.0'" in p for p in problems)
    bad_semver = release.version_problems(
        {OPERATOR: "0.1.0", SHIM: "0.1.0"}, {}, {"version": "1.0", "appVersion": "0.1.0"}
    )
    assert len(bad_semver) == 1 and "version '1.0' is not SemVer" in bad_semver[0]
    assert release.version_problems({OPERATOR: "0.1.0", SHIM: "0.1.0"}, {}, chart) == []


def test_dependency_checks_refuse_names_nobody_answers_for() -> None:
    ok = release.dependency_problems(
        {OPERATOR: ("0.1.0", ["rtj-shim", "pydantic>=2.6", 'mypy>=1; extra == "dev"']),
         SHIM: ("0.1.0", ["pydantic>=2.6"])},
        locked={"pydantic"},
        installed=lambda name: name == "mypy",
    )  # fmt: skip
    assert ok == []
    problems = release.dependency_problems(
        {OPERATOR: ("0.1.0", ["rtj-shim>=0.2", "left-padder>=1", 'nowhere; extra == "dev"']),
         SHIM: ("0.1.0", [])},
        locked={"pydantic"},
        installed=lambda name: False,
    )  # fmt: skip
    assert len(problems) == 3
    assert (
        "this release builds rtj-shim 0.1.0: an install would take rtj-shim from an index"
        in (problems[0])
    )
    assert any("left-padder is not pinned in images/python.lock.json" in p for p in problems)
    assert any("nowhere is not installed here" in p for p in problems)


def test_chart_defaults_must_name_the_release_images() -> None:
    references = {i: f"ghcr.io/resilient-training/{i}" for i in IMAGES}
    values = yaml.safe_load((release.CHART / "values.yaml").read_text())
    assert release.chart_image_problems(values, references, _chart()["appVersion"]) == []
    values["image"]["repository"] = "docker.io/someone/rtj-operator"
    values["resolverImage"]["tag"] = "0.0.1"
    problems = release.chart_image_problems(values, references, "0.1.0")
    assert len(problems) == 2
    assert "image.repository is 'docker.io/someone/rtj-operator'" in problems[0]
    assert "resolverImage.tag is '0.0.1'" in problems[1]


def test_the_cli_refuses_to_replace_a_directory_that_is_not_a_release(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    cli = subprocess.run(
        [sys.executable, "-m", "release", "build", "--out", str(tmp_path)],
        cwd=release.REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode == 1
    assert "release: FAILED:" in cli.stderr and "is not a release directory" in cli.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
