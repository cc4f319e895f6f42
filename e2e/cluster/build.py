"""Build the cluster's programs from their Go modules into a cache outside the repository.

Every binary lands at ``<cache>/bin/<name>-<version>`` (cache: ``$RTJ_CACHE_DIR`` or
``~/.cache/rtj``); a warm machine finds it there and builds nothing. Go's own module and build
caches stay at their defaults, so a rebuild after a version bump reuses what it can.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .versions import GOMOD_DIR, PROGRAMS, Program, load_versions, program

LDFLAGS = "-s -w"


class BuildError(RuntimeError):
    """A program failed to build; the message names the program, its module and the log."""


def cache_dir() -> Path:
    return Path(os.environ.get("RTJ_CACHE_DIR", Path.home() / ".cache" / "rtj"))


def bin_dir() -> Path:
    return cache_dir() / "bin"


def binary_path(name: str, versions: dict[str, str] | None = None) -> Path:
    versions = versions or load_versions()
    p = program(name)
    return bin_dir() / f"{p.name}-{p.version(versions)}"


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    # -trimpath keeps the cache key independent of the checkout path; no VCS stamping.
    env["GOFLAGS"] = " ".join(
        f for f in (env.get("GOFLAGS", ""), "-trimpath", "-buildvcs=false") if f
    )
    env.setdefault("GOTOOLCHAIN", "local")
    return env


@contextmanager
def _lock() -> Iterator[None]:
    bin_dir().mkdir(parents=True, exist_ok=True)
    with open(bin_dir() / ".build.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run_logged(cmd: list[str], cwd: Path, log: Path, env: dict[str, str]) -> int:
    with open(log, "ab") as fh:
        fh.write(("$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        return subprocess.call(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)


def _tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def build_one(p: Program, versions: dict[str, str], *, quiet: bool = False) -> float:
    """Build one program if its cached binary is missing; return the seconds spent (0 if cached)."""
    version = p.version(versions)
    target = bin_dir() / f"{p.name}-{version}"
    if target.is_file() and os.access(target, os.X_OK):
        return 0.0
    log_dir = cache_dir() / "build-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{p.name}-{version}.log"
    log.write_text("")
    env = _go_env()
    if not quiet:
        print(f"building {p.name} {version} from {p.module} (log: {log})", file=sys.stderr)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=bin_dir()) as tmp:
        if p.in_gomod:
            check_gomod(versions)
            out = Path(tmp) / p.name
            ldflags = " ".join([LDFLAGS, *p.ldflags(versions)])
            cmd = ["go", "build", "-mod=readonly", f"-ldflags={ldflags}", "-o", str(out), p.package]
            rc = _run_logged(cmd, GOMOD_DIR, log, env)
        else:
            # The equivalent of `go install <package>@<version>` (same module graph: the
            # program's own go.mod, no replace directives) from a one-line wrapper module.
            # `go install pkg@v` itself looks up the module's deprecation through the
            # proxy's version list, which the proxy refuses for some modules (JobSet).
            wrap = cache_dir() / "build-mods" / f"{p.name}-{version}"
            wrap.mkdir(parents=True, exist_ok=True)
            (wrap / "go.mod").write_text(
                f"module rtj.local/build/{p.name}\n\ngo 1.25\n\nrequire {p.module} {version}\n"
            )
            if p.source_overrides:
                _override_sources(p, version, wrap, env, log)
            out = Path(tmp) / p.name
            ldflags = " ".join([LDFLAGS, *p.ldflags(versions)])
            cmd = ["go", "build", "-mod=mod", f"-ldflags={ldflags}", "-o", str(out), p.package]
            rc = _run_logged(cmd, wrap, log, env)
        if rc != 0 or not out.is_file():
            raise BuildError(
                f"building program {p.name!r} failed: module {p.module}@{version}, "
                f"package {p.package} (exit {rc}). Log: {log}\n{_tail(log)}"
            )
        os.replace(out, target)
    seconds = time.monotonic() - start
    _record_time(p.name, version, seconds)
    if not quiet:
        print(f"built {p.name} {version} in {seconds:.0f}s", file=sys.stderr)
    return seconds


def _override_sources(p: Program, version: str, wrap: Path, env: dict[str, str], log: Path) -> None:
    """Build `p` from a copy of its module with `p.source_overrides` applied, `replace`d into
    the wrapper module (the module cache itself is read-only, and -overlay may not touch it)."""
    found = subprocess.run(
        ["go", "mod", "download", "-json", f"{p.module}@{version}"],
        cwd=wrap, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if found.returncode != 0:
        raise BuildError(f"downloading module {p.module}@{version} failed: {found.stderr[-2000:]}")
    source = Path(json.loads(found.stdout)["Dir"])
    copy = wrap / "src"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(source, copy)
    for path in copy.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)  # the module cache's files are read-only
    for rel, content in p.source_overrides:
        (copy / rel).write_text(content)
        with open(log, "a") as fh:
            fh.write(f"# {rel} replaced before building (see e2e/cluster/versions.py)\n")
    with open(wrap / "go.mod", "a") as fh:
        fh.write(f"\nreplace {p.module} => ./src\n")


def _record_time(name: str, version: str, seconds: float) -> None:
    path = bin_dir() / "build-times.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[f"{name}-{version}"] = round(seconds, 1)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def build(names: Iterable[str], *, quiet: bool = False) -> dict[str, float]:
    """Build the named programs sequentially (2-core CI: one Go build at a time is fastest)."""
    names = list(names)
    versions = load_versions()
    if missing(names) and shutil.which("go") is None:
        raise BuildError(
            f"the `go` command is not on PATH and {missing(names)} are not built; "
            "the cluster harness builds its programs from Go modules"
        )
    times: dict[str, float] = {}
    with _lock():
        for name in names:
            times[name] = build_one(program(name), versions, quiet=quiet)
    return times


def kubectl(
    kubeconfig: str | Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The real kubectl of the cluster's release (built into the cache if missing)."""
    if not binary_path("kubectl").exists():
        build(["kubectl"], quiet=True)
    return subprocess.run(
        [str(binary_path("kubectl")), "--kubeconfig", str(kubeconfig), *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def missing(names: Iterable[str]) -> list[str]:
    versions = load_versions()
    return [n for n in names if not binary_path(n, versions).is_file()]


# --- the control-plane Go module ------------------------------------------------------------

_REQUIRE_RE = re.compile(r"^\s*(?:require\s+)?(\S+)\s+(v\S+)", re.M)
_REPLACE_RE = re.compile(r"^\s*(k8s\.io/\S+)\s+=>\s+(k8s\.io/\S+)\s+(v\S+)", re.M)


def gomod_problems(versions: dict[str, str], gomod_text: str) -> list[str]:
    """What in go.mod disagrees with versions.env (empty when consistent)."""
    problems: list[str] = []
    required = {m: v for m, v in _REQUIRE_RE.findall(gomod_text) if "=>" not in m}
    if required.get("k8s.io/kubernetes") != versions["KUBERNETES"]:
        problems.append(
            f"go.mod requires k8s.io/kubernetes {required.get('k8s.io/kubernetes')}, "
            f"versions.env says {versions['KUBERNETES']}"
        )
    if required.get("go.etcd.io/etcd/server/v3") != versions["ETCD"]:
        problems.append(
            f"go.mod has go.etcd.io/etcd/server/v3 {required.get('go.etcd.io/etcd/server/v3')}, "
            f"versions.env says {versions['ETCD']}"
        )
    replaces = _REPLACE_RE.findall(gomod_text)
    if not replaces:
        problems.append("go.mod pins no k8s.io staging module")
    for old, new, ver in replaces:
        if old != new or ver != versions["KUBE_STAGING"]:
            problems.append(f"go.mod: {old} => {new} {ver}, expected {versions['KUBE_STAGING']}")
    return problems


def check_gomod(versions: dict[str, str]) -> None:
    problems = gomod_problems(versions, (GOMOD_DIR / "go.mod").read_text())
    if problems:
        raise BuildError(
            "e2e/cluster/gomod/go.mod disagrees with e2e/versions.env; run "
            "`python -m e2e.cluster build --sync-gomod`:\n  " + "\n  ".join(problems)
        )


def sync_gomod() -> None:
    """Rewrite gomod/go.mod from versions.env: require k8s.io/kubernetes and pin every staging
    module it replaces with a local folder to the published KUBE_STAGING version."""
    versions = load_versions()
    env = _go_env()
    kube = versions["KUBERNETES"]
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{kube}"],
        cwd=GOMOD_DIR,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise BuildError(
            f"cannot download module k8s.io/kubernetes@{kube}: {out.stdout}{out.stderr}"
        )
    kube_gomod = Path(json.loads(out.stdout)["GoMod"]).read_text()
    staging = sorted(set(re.findall(r"^\s*(k8s\.io/\S+)\s+=>\s+\./staging/", kube_gomod, re.M)))
    lines = [
        "// Generated by `python -m e2e.cluster build --sync-gomod` from e2e/versions.env.",
        "// k8s.io/kubernetes replaces its staging modules with local folders, so it cannot be",
        "// `go install`ed; this module requires it and pins each staging module to the",
        "// published version of the same release, the way embedding distributions do.",
        "module github.com/resilient-training-operator/e2e/cluster/gomod",
        "",
        "go 1.25.0",
        "",
        f"require k8s.io/kubernetes {kube}",
        "",
        "replace (",
        *[f"\t{m} => {m} {versions['KUBE_STAGING']}" for m in staging],
        ")",
        "",
    ]
    (GOMOD_DIR / "go.mod").write_text("\n".join(lines))
    cmds = [
        ["go", "get", f"go.etcd.io/etcd/server/v3@{versions['ETCD']}"],
        ["go", "mod", "tidy"],
    ]
    for cmd in cmds:
        r = subprocess.run(cmd, cwd=GOMOD_DIR, env=env, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise BuildError(f"{' '.join(cmd)} failed in {GOMOD_DIR}:\n{r.stdout}{r.stderr}")
    check_gomod(versions)


def module_dir(module: str, version: str) -> Path:
    """The downloaded source of a module (for CRDs and webhook manifests), fetched if needed."""
    r = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        env=_go_env(),
        capture_output=True,
        text=True,
        check=False,
        cwd=cache_dir(),
    )
    if r.returncode != 0:
        raise BuildError(f"cannot download module {module}@{version}: {r.stdout}{r.stderr}")
    return Path(json.loads(r.stdout)["Dir"])


def all_program_names() -> list[str]:
    return [p.name for p in PROGRAMS]
