"""From a pod to the local processes that stand for its containers. Pure.

The image's filesystem is this checkout (``workdir``): commands run there with the host's
Python environment on PATH. What a container would see at a mount path is a per-pod (or
per-node, per-claim) directory, so mount paths are rewritten wherever a path can appear: in
environment values, in the command and its arguments, and as ``file://`` roots. The pod's
rendezvous host (``<host>.<subdomain>[.<namespace>.svc...]``, JobSet's headless Service) is
loopback wherever an environment value names it, and its master port is a local port of the
runner's choosing per subdomain, so two attempts (or two jobs) never share a listener.

The downward API resolves ``status.podIP``/``status.podIPs`` to the pod's own address (the
runner gives each pod one, see ``podip``) and ``status.hostIP``/``status.hostIPs`` to the
node's (loopback), as the kubelet's ``podFieldSelectorRuntimeValue`` does
(pkg/kubelet/kubelet_pods.go, Kubernetes v1.35: the lists joined with commas). An init
container with ``restartPolicy: Always`` is a native sidecar (``LocalProcess.sidecar``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
LOOPBACK = "127.0.0.1"
MASTER_PORT_VARS = frozenset({"MASTER_PORT", "PET_MASTER_PORT"})
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")
_FIELD_KEY = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


class PodNotRunnable(ValueError):
    """The pod asks for something the runner cannot provide; the message names the field."""


@dataclass(frozen=True)
class PodDirs:
    """Where one pod's state lives: ``root/<namespace>/<name>-<uid prefix>``."""

    pod: Path
    node: Path
    claims: Path

    def volume(self, name: str) -> Path:
        return self.pod / "volumes" / name

    def container(self, name: str) -> Path:
        return self.pod / "containers" / name


@dataclass(frozen=True)
class LocalProcess:
    """One container as a local process."""

    container: str
    init: bool
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    termination_log: Path
    message_policy: str
    sidecar: bool = False  # an init container with restartPolicy: Always


@dataclass(frozen=True)
class PodPlan:
    """The processes in order (init containers first), the volume directories to create
    and the files of secret/configMap volumes."""

    processes: list[LocalProcess]
    directories: list[Path] = field(default_factory=list)
    files: dict[Path, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class Sources:
    """What the API server holds that env and volumes may reference."""

    secrets: Callable[[str], Mapping[str, str]]
    config_maps: Callable[[str], Mapping[str, str]]
    master_port: Callable[[str], int]


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: unknown references stay as written, ``$$`` is ``$``."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


def field_ref(pod: Obj, path: str, pod_ips: Sequence[str] = ()) -> str:
    """The value of a downward-API ``fieldRef.fieldPath``; ``pod_ips``: the pod's addresses
    (none yet: empty, as the kubelet gives before the sandbox has an IP)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": LOOPBACK,
        "status.hostIPs": LOOPBACK,
        "status.podIP": pod_ips[0] if pod_ips else "",
        "status.podIPs": ",".join(pod_ips),
    }
    if path in simple:
        return str(simple[path] or "")
    m = _FIELD_KEY.match(path)
    if m is None:
        raise PodNotRunnable(f"env fieldRef.fieldPath {path!r} is not supported by the runner")
    return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))


class PathMap:
    """Container paths -> local paths, longest mount first, on path boundaries only."""

    def __init__(self, mounts: Mapping[str, Path]) -> None:
        self._mounts = sorted(mounts.items(), key=lambda kv: -len(kv[0]))
        alternatives = "|".join(re.escape(m.rstrip("/") or "/") for m, _ in self._mounts)
        # a mount path starts a token, follows `=`/`:` (flags, lists) or `file://` (roots)
        self._pattern = (
            re.compile(rf"(?:(?<=file://)|(?<![\w./-]))({alternatives})(?=/|$|[^\w.-])")
            if self._mounts
            else None
        )
        self._local = {m.rstrip("/") or "/": str(p) for m, p in self._mounts}

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self._local[m.group(1)], text)


def _volume_dir(volume: Obj, dirs: PodDirs, pod: Obj) -> Path:
    name = volume["name"]
    if "emptyDir" in volume:
        return dirs.volume(name)
    if "hostPath" in volume:
        return dirs.node / "hostpath" / str(volume["hostPath"]["path"]).lstrip("/")
    if "persistentVolumeClaim" in volume:
        claim = volume["persistentVolumeClaim"]["claimName"]
        return dirs.claims / str(pod["metadata"]["namespace"]) / str(claim)
    if "secret" in volume or "configMap" in volume:
        return dirs.volume(name)
    if "projected" in volume:  # the API token volume: left empty (training needs no token)
        return dirs.volume(name)
    kinds = sorted(k for k in volume if k != "name")
    raise PodNotRunnable(
        f"spec.volumes[{name}]: {kinds} is not supported by the runner "
        "(emptyDir, hostPath, persistentVolumeClaim, secret, configMap, projected are)"
    )


def _projected_files(volume: Obj, where: Path, sources: Sources) -> dict[Path, bytes]:
    if "secret" in volume:
        data = sources.secrets(volume["secret"]["secretName"])
    elif "configMap" in volume:
        data = sources.config_maps(volume["configMap"]["name"])
    else:
        return {}
    return {where / k: v.encode() for k, v in data.items()}


def _mounts(container: Obj, volumes: Mapping[str, Path]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        name = mount["name"]
        if name not in volumes:
            raise PodNotRunnable(
                f"containers[{container['name']}].volumeMounts[{name}]: no such volume"
            )
        out[mount["mountPath"]] = volumes[name] / mount.get("subPath", "")
    return out


def _env(
    container: Obj, pod: Obj, sources: Sources, mapped: PathMap, pod_ips: Sequence[str]
) -> dict[str, str]:
    """envFrom, then env in order (later wins); values expand earlier variables."""
    where = f"containers[{container['name']}]"
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        if "secretRef" in src:
            data = sources.secrets(src["secretRef"]["name"])
        elif "configMapRef" in src:
            data = sources.config_maps(src["configMapRef"]["name"])
        else:
            raise PodNotRunnable(f"{where}.envFrom: only secretRef and configMapRef")
        env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        name = var["name"]
        if "value" in var:
            env[name] = expand(str(var["value"]), env)
            continue
        ref = var.get("valueFrom") or {}
        if "fieldRef" in ref:
            env[name] = field_ref(pod, ref["fieldRef"]["fieldPath"], pod_ips)
        elif "secretKeyRef" in ref:
            key = ref["secretKeyRef"]
            env[name] = sources.secrets(key["name"])[key["key"]]
        elif "configMapKeyRef" in ref:
            key = ref["configMapKeyRef"]
            env[name] = sources.config_maps(key["name"])[key["key"]]
        else:
            raise PodNotRunnable(f"{where}.env[{name}].valueFrom: {sorted(ref)} not supported")
    return {k: mapped(v) for k, v in env.items()}


def _rendezvous(env: dict[str, str], subdomain: str, sources: Sources) -> dict[str, str]:
    """The headless-Service host is loopback wherever a value names it (alone, or in a URL
    such as ``http://<host>.<subdomain>:29510``); the master port is the runner's choice."""
    if not subdomain:
        return env
    host = re.compile(
        rf"(?<![\w.-])[a-z0-9-]+\.{re.escape(subdomain)}(\.[a-z0-9-]+\.svc(\.[a-z0-9-]+)*)?(?![\w.-])"
    )
    out = {k: host.sub(LOOPBACK, v) for k, v in env.items()}
    for name in MASTER_PORT_VARS & out.keys():
        out[name] = str(sources.master_port(subdomain))
    return out


def plan_pod(
    pod: Obj,
    dirs: PodDirs,
    sources: Sources,
    *,
    workdir: Path,
    base_env: Mapping[str, str],
    pod_ips: Sequence[str] = (),
) -> PodPlan:
    """The init containers in order, then the containers: what to run, where, with what.
    ``pod_ips``: the pod's addresses, for the downward API."""
    spec = pod.get("spec") or {}
    volumes = {v["name"]: _volume_dir(v, dirs, pod) for v in spec.get("volumes") or []}
    files: dict[Path, bytes] = {}
    for v in spec.get("volumes") or []:
        files.update(_projected_files(v, volumes[v["name"]], sources))
    hostname = spec.get("hostname") or pod["metadata"]["name"]
    ctx = _Context(pod, dirs, volumes, sources, workdir, base_env, hostname, tuple(pod_ips))
    plans = []
    for init, key in ((True, "initContainers"), (False, "containers")):
        for c in spec.get(key) or []:
            plans.append(_plan_container(c, init, ctx))
    return PodPlan(plans, sorted(set(volumes.values())), files)


@dataclass(frozen=True)
class _Context:
    """What every container of one pod is planned with."""

    pod: Obj
    dirs: PodDirs
    volumes: Mapping[str, Path]
    sources: Sources
    workdir: Path
    base_env: Mapping[str, str]
    hostname: str
    pod_ips: tuple[str, ...]


def _plan_container(c: Obj, init: bool, ctx: _Context) -> LocalProcess:
    pod, dirs, sources = ctx.pod, ctx.dirs, ctx.sources
    name = c["name"]
    command = [*(c.get("command") or []), *(c.get("args") or [])]
    if not command:
        raise PodNotRunnable(
            f"containers[{name}].command: the runner has no image entrypoint; give a command"
        )
    local = dirs.container(name)
    termination = local / "termination-log"
    mounts = _mounts(c, ctx.volumes)
    mounts[c.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH] = termination
    mapped = PathMap(mounts)
    env = _env(c, pod, sources, mapped, ctx.pod_ips)
    env = _rendezvous(env, (pod.get("spec") or {}).get("subdomain") or "", sources)
    full_env = {**ctx.base_env, "HOSTNAME": ctx.hostname, "HOME": str(local / "home"), **env}
    argv = [mapped(expand(arg, env)) for arg in command]
    # a working directory inside a mount is that local directory; any other is the image's
    wd = str(c.get("workingDir") or "")
    cwd = Path(mapped(wd)) if wd and mapped(wd) != wd else ctx.workdir
    return LocalProcess(
        container=name,
        init=init,
        argv=argv,
        env=full_env,
        cwd=cwd,
        log=local / "log",
        termination_log=termination,
        message_policy=c.get("terminationMessagePolicy") or "File",
        sidecar=init and c.get("restartPolicy") == "Always",
    )


def slowed(process: LocalProcess, bytes_per_second: float) -> LocalProcess:
    """`process` on a node whose link is slow (`PodRunner.slow_link_file`): an `rtj-shim
    preflight` runs its ring transfer at `bytes_per_second`; any other is unchanged."""
    argv = process.argv
    at = next((i for i, a in enumerate(argv[:-1]) if a.endswith("rtj-shim")
               and argv[i + 1] == "preflight"), None)  # fmt: skip
    if at is None:
        return process
    throttled = [*argv[: at + 2], f"--throttle-bytes-per-second={bytes_per_second:g}",
                 *argv[at + 2 :]]  # fmt: skip
    return dataclasses.replace(process, argv=throttled)
