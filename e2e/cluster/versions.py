"""The pinned versions (e2e/versions.env) and the programs built from them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

E2E_DIR = Path(__file__).resolve().parent.parent
VERSIONS_FILE = E2E_DIR / "versions.env"
GOMOD_DIR = Path(__file__).resolve().parent / "gomod"


def load_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse NAME=value lines; the environment may override a value (e.g. KIND_NODE_IMAGE)."""
    versions: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: not NAME=value: {raw!r}")
        versions[name.strip()] = value.strip()
    for name in list(versions):
        override = os.environ.get(f"RTJ_E2E_{name}")
        if override:
            versions[name] = override
    return versions


@dataclass(frozen=True)
class Program:
    """One binary the harness builds.

    `module` is the Go module that provides it, `package` the main package. Programs with
    `in_gomod` are built inside e2e/cluster/gomod (k8s.io/kubernetes cannot be `go install`ed
    because its go.mod replaces the staging modules with local folders); the others are built
    from a wrapper module that requires only ``module@version`` -- the same module graph as
    `go install <package>@<version>` (see build.py for why not `go install` itself).
    """

    name: str
    module: str
    package: str
    version_key: str
    in_gomod: bool = False
    #: ``-X`` link flags that stamp the version the way the projects' release builds do
    #: (``{v}`` is the version); kube-apiserver must report its real version, Kueue and
    #: kubectl parse it.
    stamp: tuple[str, ...] = ()
    #: files of the module replaced before building, as the project's own build allows:
    #: path in the module -> new content (the module is then built from a copy, `replace`d)
    source_overrides: tuple[tuple[str, str], ...] = ()

    def version(self, versions: dict[str, str]) -> str:
        return versions[self.version_key]

    def ldflags(self, versions: dict[str, str]) -> list[str]:
        v = self.version(versions)
        parts = [*v.lstrip("v").split("."), "", "", ""][:3]
        # Prometheus tags its Go module v0.<major*100+minor>.<patch> for release <major>.<minor>
        go_minor = int(parts[1]) if parts[1].isdigit() else 0
        prom = f"{go_minor // 100}.{go_minor % 100}.{parts[2]}"
        return [
            "-X " + f.format(v=v, major=parts[0], minor=parts[1], prom=prom) for f in self.stamp
        ]


_KUBE_STAMP = tuple(
    f"{pkg}.{var}"
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    for var in ("gitVersion={v}", "gitMajor={major}", "gitMinor={minor}", "gitTreeState=clean")
)


PROGRAMS: tuple[Program, ...] = (
    Program(
        "kube-apiserver",
        "k8s.io/kubernetes",
        "k8s.io/kubernetes/cmd/kube-apiserver",
        "KUBERNETES",
        in_gomod=True,
        stamp=_KUBE_STAMP,
    ),
    Program(
        "kube-controller-manager",
        "k8s.io/kubernetes",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        "KUBERNETES",
        in_gomod=True,
        stamp=_KUBE_STAMP,
    ),
    Program(
        "kube-scheduler",
        "k8s.io/kubernetes",
        "k8s.io/kubernetes/cmd/kube-scheduler",
        "KUBERNETES",
        in_gomod=True,
        stamp=_KUBE_STAMP,
    ),
    Program(
        "kubectl",
        "k8s.io/kubernetes",
        "k8s.io/kubernetes/cmd/kubectl",
        "KUBERNETES",
        in_gomod=True,
        stamp=_KUBE_STAMP,
    ),
    Program(
        "kubelet",
        "k8s.io/kubernetes",
        "k8s.io/kubernetes/cmd/kubelet",
        "KUBERNETES",
        in_gomod=True,
        stamp=_KUBE_STAMP,
    ),
    Program(
        "etcd", "go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/server/v3", "ETCD", in_gomod=True
    ),
    Program("kwok", "sigs.k8s.io/kwok", "sigs.k8s.io/kwok/cmd/kwok", "KWOK"),
    Program(
        "jobset",
        "sigs.k8s.io/jobset",
        "sigs.k8s.io/jobset",
        "JOBSET",
        stamp=("sigs.k8s.io/jobset/pkg/version.GitVersion={v}",),
    ),
    Program(
        "kueue",
        "sigs.k8s.io/kueue",
        "sigs.k8s.io/kueue/cmd/kueue",
        "KUEUE",
        stamp=("sigs.k8s.io/kueue/pkg/version.GitVersion={v}",),
    ),
    Program(
        "helm",
        "helm.sh/helm/v3",
        "helm.sh/helm/v3/cmd/helm",
        "HELM",
        stamp=("helm.sh/helm/v3/internal/version.version={v}",),
    ),
    Program(
        "promtool",
        "github.com/prometheus/prometheus",
        "github.com/prometheus/prometheus/cmd/promtool",
        "PROMETHEUS",
        stamp=("github.com/prometheus/common/version.Version={prom}",),
        # Prometheus chooses its service-discovery plugins at build time (plugins.yml, `make
        # plugins` writes plugins/plugins.go); promtool here checks and tests rule files,
        # which use none, so it is built with none beyond plugins/minimum.go (file, http):
        # the cloud SDKs they pull in were two thirds of its build (236 s of CPU-quiet build
        # against 114 s, and 135 MB against 61 MB)
        source_overrides=(
            (
                "plugins/plugins.go",
                "// Code generated as by `make plugins` with an empty plugins.yml.\n\n"
                "package plugins\n",
            ),
        ),
    ),
    Program("kind", "sigs.k8s.io/kind", "sigs.k8s.io/kind", "KIND"),
)

#: what `up` needs; helm/promtool are for chart and alert-rule tests, kind for `make e2e-kind`
CLUSTER_PROGRAMS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "jobset",
    "kueue",
)
TOOL_PROGRAMS = ("kubectl", "helm", "promtool")
#: what a real node needs (e2e/cluster/real_node.py); containerd and runc come from Debian
NODE_PROGRAMS = ("kubelet",)


def program(name: str) -> Program:
    for p in PROGRAMS:
        if p.name == name:
            return p
    raise KeyError(f"unknown program {name!r}; known: {[p.name for p in PROGRAMS]}")
