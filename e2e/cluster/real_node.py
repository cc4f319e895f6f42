"""A real node for the local cluster: kubelet + containerd + runc + CNI, our images imported.

KWOK nodes stay for scale and the pod runner for fast tests; this node proves what only a
real kubelet can: images that run, init containers and native sidecars, termination
messages as the kubelet writes them, grace periods and a cgroup's OOM kill.

What runs (facts from trials on these machines: /work/shared/notes/real-node.md):

- **kubelet** built from the pinned ``k8s.io/kubernetes`` (``NODE_PROGRAMS``) with the
  cgroupfs driver and ``failCgroupV1: false``: this kernel mounts cgroup v1 (the hybrid
  layout). What v1 lacks that v2 has: memory QoS (``memory.high``), PSI, swap limits per
  pod and the single hierarchy's race-free OOM accounting; the kubelet warns once and runs.
- **containerd, runc, CNI plugins** from Debian bookworm (``make node-packages`` installs
  them; ``NODE_PACKAGES``). containerd runs with its own root, state and socket, so it never
  touches a system instance; ``restrict_oom_score_adj`` because this VM refuses to lower a
  process's ``oom_score_adj`` (the sandbox asks for -998 and runc fails with "can't get
  final child's PID from pipe: EOF" otherwise).
- **Images** from ``make images`` imported with ``ctr images import`` (no registry); the
  sandbox ("pause") image is a config over the resolver image's layers running a Python
  ``signal.pause()``: nothing else is downloaded.
- **Networking**: a ``bridge`` + ``host-local`` CNI network on a private /24 of its own.

The node registers tainted ``rtj.test/real-node=true:NoSchedule`` and labelled the same, so
pods of KWOK-based tests never land on it; a test that wants it tolerates the taint and
selects the label (``RealNode.place``). Its kubelet API listens on loopback only, requires a
client certificate of the cluster's CA, and authorizes every such caller (a harness, not a
production node: there the webhook authorizer asks the API server).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from . import build, processes
from .kube import Kube
from .kubeconfig import write_kubeconfig
from .node_images import PAUSE_IMAGE, image_ref, pause_archive
from .pki import CA
from .processes import LOOPBACK, Proc, StartupError

NODE_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iptables")
"""Debian packages the node runs (bookworm: containerd 1.6, runc 1.1, CNI plugins 1.1)."""
CNI_BIN_DIR = Path("/usr/lib/cni")  # where Debian's containernetworking-plugins installs
NEEDED_TOOLS = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
}
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the harness's --service-cluster-ip-range starts there
LABEL = "rtj.test/real-node"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}


def record(pod: Mapping[str, Any], name: str) -> None:
    """With RTJ_RECORD_DIR set, keep a pod as the API server returned it (managedFields
    dropped) as `<name>.json` there: how the recorded corpus in
    tests/fixtures/recorded/real-kubelet is refreshed from a real kubelet."""
    out = os.environ.get("RTJ_RECORD_DIR")
    if not out:
        return
    body = copy.deepcopy(dict(pod))
    (body.get("metadata") or {}).pop("managedFields", None)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"{name}.json").write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


class NodeSetupError(RuntimeError):
    """The machine lacks something the real node needs; the message says what and how."""


def missing_tools() -> list[str]:
    """The node's programs that are not installed (their Debian package in brackets)."""
    gone = [f"{tool} ({pkg})" for tool, pkg in NEEDED_TOOLS.items() if shutil.which(tool) is None]
    if not (CNI_BIN_DIR / "bridge").is_file():
        gone.append(f"{CNI_BIN_DIR}/bridge (containernetworking-plugins)")
    return gone


def check_machine() -> None:
    if os.geteuid() != 0:
        raise NodeSetupError("a real kubelet and containerd run as root; this user is not")
    gone = missing_tools()
    if gone:
        raise NodeSetupError(
            f"not installed: {', '.join(gone)}; run `make node-packages` (apt-get install "
            + " ".join(NODE_PACKAGES)
            + ")"
        )


class RealNode:
    """One kubelet with its containerd, registered in the cluster whose PKI is ``pki``."""

    def __init__(
        self,
        *,
        cluster_dir: Path,
        kubeconfig: Path,
        images: Mapping[str, Path],
        name: str = "real-node-0",
        subnet: str = "10.244.77.0/24",
    ) -> None:
        self.name = name
        self.cluster_dir = cluster_dir
        self.admin_kubeconfig = kubeconfig
        self.archives = dict(images)
        self.subnet = subnet
        self.dir = cluster_dir / name
        # unix socket paths are limited to 108 bytes: the run directory is short
        self.run_dir = Path("/run") / f"rtj-{os.getpid()}-{name}"
        self.socket = self.run_dir / "containerd.sock"
        self.bridge = "rtjbr" + str(os.getpid() % 10000)
        self.procs: list[Proc] = []
        self.refs: dict[str, str] = {}
        self.kubelet_port = 0
        self._api_port = 0

    # --- placement -------------------------------------------------------------------------

    def place(self, pod_spec: dict[str, Any]) -> dict[str, Any]:
        """The pod spec, pinned to this node (selector and toleration)."""
        spec = copy.deepcopy(pod_spec)
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), LABEL: "true"}
        spec["tolerations"] = [*spec.get("tolerations", []), {**TAINT, "operator": "Equal"}]
        return spec

    # --- start -----------------------------------------------------------------------------

    def up(self, timeout: float = 120.0) -> None:
        check_machine()
        build.build(["kubelet"])
        if self.dir.exists():
            shutil.rmtree(self.dir)
        (self.dir / "logs").mkdir(parents=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._route_api_server()
            self._start_containerd()
            self._import_images()
            self._start_kubelet(timeout)
        except BaseException:
            self.down()
            raise

    def _route_api_server(self) -> None:
        """Pods reach the API server as in a real cluster: at the `kubernetes` Service's
        address (KUBERNETES_SERVICE_HOST, which the kubelet injects into every container).
        The one rule kube-proxy would write for it: the bridge (created here, before CNI,
        which then reuses it) may route to loopback, and 10.96.0.1:443 arriving on it is
        DNAT'ed to the API server on 127.0.0.1 (its certificate names both)."""
        gateway = self.subnet.rsplit(".", 1)[0] + ".1/24"
        self._api_port = int(urlparse(self._server()).port or 443)
        for cmd in (
            ["ip", "link", "add", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", gateway, "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
            ["sysctl", "-qw", f"net.ipv4.conf.{self.bridge}.route_localnet=1"],
            ["iptables", "-t", "nat", "-A", "PREROUTING", *self._dnat_rule()],
        ):
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise StartupError(f"{' '.join(cmd)}: {done.stderr.strip()}")

    def _dnat_rule(self) -> list[str]:
        return [
            "-i", self.bridge, "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp",
            "--dport", "443", "-j", "DNAT", "--to-destination", f"{LOOPBACK}:{self._api_port}",
        ]  # fmt: skip

    def _server(self) -> str:
        config = yaml.safe_load(self.admin_kubeconfig.read_text())
        return str(config["clusters"][0]["cluster"]["server"])

    def _start_containerd(self) -> None:
        cni_conf = self.dir / "cni" / "net.d"
        cni_conf.mkdir(parents=True)
        (cni_conf / "10-rtj.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0",
            "name": "rtj-real-node",
            "plugins": [{
                "type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": False,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": self.subnet}]],
                         "routes": [{"dst": "0.0.0.0/0"}],
                         "dataDir": str(self.dir / "cni" / "ipam")},
            }, {"type": "loopback"}],
        }, indent=2))  # fmt: skip
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = "\n".join([
            "version = 2",
            f'root = "{self.dir / "containerd"}"',
            f'state = "{self.run_dir / "state"}"',
            "[grpc]",
            f'  address = "{self.socket}"',
            "[ttrpc]",
            f'  address = "{self.run_dir / "ttrpc.sock"}"',
            "[metrics]",
            '  address = ""',
            f"[{cri}]",
            f'  sandbox_image = "{PAUSE_IMAGE}"',
            "  restrict_oom_score_adj = true",
            "  disable_apparmor = true",
            "  enable_selinux = false",
            f"[{cri}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            f"[{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.runc.options]",
            "  SystemdCgroup = false",
            f"[{cri}.cni]",
            f'  bin_dir = "{CNI_BIN_DIR}"',
            f'  conf_dir = "{cni_conf}"',
            '[plugins."io.containerd.internal.v1.opt"]',
            f'  path = "{self.dir / "opt"}"',
            "",
        ])  # fmt: skip
        (self.dir / "containerd.toml").write_text(config)
        proc = processes.start(
            "containerd",
            ["containerd", "--config", str(self.dir / "containerd.toml")],
            self.dir / "logs",
        )
        self.procs.append(proc)
        processes.wait_for(
            "containerd's socket", lambda: self.ctr("version").returncode == 0, 30, proc=proc
        )

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def _import_images(self) -> None:
        archives = dict(self.archives)
        archives["pause"] = pause_archive(archives["rtj-resolver"], self.dir / "pause.oci.tar")
        for name, archive in archives.items():
            done = self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive))
            if done.returncode != 0:
                raise StartupError(f"ctr images import {archive}: {done.stderr.strip()}")
            self.refs[name] = PAUSE_IMAGE if name == "pause" else image_ref(archive)

    def _start_kubelet(self, timeout: float) -> None:
        ca = CA(self.cluster_dir / "pki")
        pair = ca.issue(
            self.name, f"system:node:{self.name}", org="system:nodes", client=True,
            directory=self.dir / "pki",
        )  # fmt: skip
        server = self._server()
        kubeconfig = write_kubeconfig(
            self.dir / "kubelet.kubeconfig", server=server, ca_file=ca.cert_path,
            cert_file=pair.cert, key_file=pair.key, user=self.name,
        )  # fmt: skip
        self.kubelet_port, healthz = processes.free_ports(2)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": LOOPBACK,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": LOOPBACK,
            "healthzPort": healthz,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(ca.cert_path)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "localStorageCapacityIsolation": False,
            "enforceNodeAllocatable": [],
            "registerWithTaints": [TAINT],
            "maxPods": 16,
            # a full build disk must not evict the test pods or collect our imported images
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "resolvConf": "/etc/resolv.conf",
            "staticPodPath": "",
            "nodeStatusReportFrequency": "10s",
            "podLogsDir": str(self.dir / "pod-logs"),
        }  # fmt: skip
        (self.dir / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=True))
        argv = [
            str(build.binary_path("kubelet")),
            "--config", str(self.dir / "kubelet.yaml"),
            "--kubeconfig", str(kubeconfig),
            "--hostname-override", self.name,
            "--node-ip", LOOPBACK,
            "--node-labels", f"{LABEL}=true",
            "--root-dir", str(self.dir / "kubelet"),
            "--cert-dir", str(self.dir / "kubelet-pki"),
            "--v", "1",
        ]  # fmt: skip
        proc = processes.start("kubelet", argv, self.dir / "logs", ports=[self.kubelet_port])
        self.procs.append(proc)
        kube = Kube(self.admin_kubeconfig)
        try:
            processes.wait_for("the real node Ready", lambda: self._ready(kube), timeout, proc=proc)
        finally:
            kube.close()

    def _ready(self, kube: Kube) -> bool:
        try:
            node = kube.core.read_node(self.name)
        except Exception:
            return False
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """What a container of a pod on this node wrote, read from the kubelet's log files
        (the harness's API server has no route to kubelets for `kubectl logs`)."""
        found = sorted((self.dir / "pod-logs").glob(f"{namespace}_{pod}_*/{container}/*.log"))
        return "".join(p.read_text(errors="replace") for p in found)

    # --- stop ------------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop everything this node started and undo what it mounted; returns leftovers.

        The node's pods are deleted while the kubelet still runs (so it stops their
        sandboxes: CNI teardown), then the kubelet stops, then every container containerd
        still holds is killed and removed, then containerd and its shims stop."""
        kube = Kube(self.admin_kubeconfig)
        try:
            self._drain(kube)
            with contextlib.suppress(Exception):
                kube.core.delete_node(self.name)
        finally:
            kube.close()
        processes.stop([p for p in self.procs if p.name == "kubelet"])
        if self.socket.exists():
            for task in self.ctr("tasks", "ls", "-q").stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task)
                self.ctr("tasks", "delete", "-f", task)
            for container in self.ctr("containers", "ls", "-q").stdout.split():
                self.ctr("containers", "rm", container)
        processes.stop([p for p in self.procs if p.name == "containerd"])
        self._kill_shims()
        self._unmount()
        if self._api_port:
            subprocess.run(["iptables", "-t", "nat", "-D", "PREROUTING", *self._dnat_rule()],
                           capture_output=True, check=False)  # fmt: skip
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        problems = processes.leftovers(self.procs)
        problems += [f"still mounted: {m}" for m in self._mounts()]
        shutil.rmtree(self.run_dir, ignore_errors=True)
        return problems

    def _drain(self, kube: Kube, timeout: float = 60.0) -> None:
        def on_node() -> list[Any]:
            pods = kube.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.name}"
            ).items
            return list(pods)

        with contextlib.suppress(Exception):
            for pod in on_node():
                with contextlib.suppress(Exception):
                    kube.core.delete_namespaced_pod(
                        pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                    )
            deadline = time.monotonic() + timeout
            while on_node() and time.monotonic() < deadline:
                time.sleep(0.5)

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes outlive containerd: stop the ones of ours."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                argv
                and argv[0].endswith(b"containerd-shim-runc-v2")
                and str(self.socket).encode() in argv
            ):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), 9)

    def _mounts(self) -> list[str]:
        roots = (str(self.dir) + "/", str(self.run_dir) + "/")
        found = []
        for line in Path("/proc/self/mounts").read_text().splitlines():
            target = line.split()[1].replace("\\040", " ")
            if target.startswith(roots):
                found.append(target)
        return found

    def _unmount(self) -> None:
        for target in sorted(self._mounts(), key=len, reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def remove_stale(cluster_dir: Path, owner_pid: int) -> None:
    """Undo what a real node of a dead test session left (its session was killed before
    teardown): processes under its directories, mounts, the DNAT rule and the bridge."""
    run_prefix = f"/run/rtj-{owner_pid}-"
    markers = (str(cluster_dir).encode(), run_prefix.encode())
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                if any(m in cmdline for m in markers):
                    os.kill(int(entry), 9)
    roots = (str(cluster_dir) + "/", run_prefix)
    mounts = [
        line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(roots)
    ]  # fmt: skip
    for target in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)
    bridge = "rtjbr" + str(owner_pid % 10000)
    rules = subprocess.run(["iptables", "-t", "nat", "-S", "PREROUTING"], capture_output=True,
                           text=True, check=False).stdout.splitlines()  # fmt: skip
    for rule in rules:
        if f"-i {bridge} " in rule and rule.startswith("-A "):
            subprocess.run(["iptables", "-t", "nat", "-D", *rule.split()[1:]],
                           capture_output=True, check=False)  # fmt: skip
    subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
    for run_dir in Path("/run").glob(f"rtj-{owner_pid}-*"):
        shutil.rmtree(run_dir, ignore_errors=True)


@contextlib.contextmanager
def real_node(
    cluster_dir: Path, kubeconfig: Path, images: Mapping[str, Path]
) -> Iterator[RealNode]:
    node = RealNode(cluster_dir=cluster_dir, kubeconfig=kubeconfig, images=images)
    node.up()
    try:
        yield node
    finally:
        problems = node.down()
        if problems:
            raise RuntimeError("the real node left things behind: " + "; ".join(problems))
