"""One IP address per pod, as a CNI plugin gives each pod sandbox its own.

The runner's pods share the host's network, so two pods that both listen on one port (the
progress sidecar's 9478) need addresses of their own. Linux routes all of 127.0.0.0/8 to
the loopback interface with no setup, so each pod gets one address of ``127.1.0.0/16``
(``127.1.0.1``, ``127.1.0.2``, ...; never ``127.0.0.1``, the node's address, and never an
address ending in .0 or .255): the runner reports it as ``status.podIP``/``status.podIPs``
and the downward API resolves ``status.podIP`` to it, as the kubelet does with the address
the sandbox got (``determinePodSandboxIPs``, pkg/kubelet/kuberuntime/kuberuntime_manager.go,
Kubernetes v1.35).

An address is unique among the pods of every runner on this machine, not just this one
(tests and demos run runners side by side): a claim holds an abstract Unix socket named
after the address (``\\0rtj-pod-runner/pod-ip/127.1.0.7``), which a second claim cannot
bind, and which the kernel releases with the process. Addresses are handed out round-robin,
so a released one is reused as late as possible (its ports may still be in TIME_WAIT).
"""

from __future__ import annotations

import ipaddress
import socket
import threading

FIRST = ipaddress.IPv4Address("127.1.0.0")
COUNT = 1 << 16
CLAIM_PREFIX = "\0rtj-pod-runner/pod-ip/"


class NoPodIP(RuntimeError):
    """Every address of the range is held."""


def _claim(ip: str) -> socket.socket | None:
    """Hold ``ip`` machine-wide, or None when another claim (any process) holds it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(CLAIM_PREFIX + ip)
    except OSError:
        sock.close()
        return None
    return sock


def usable(ip: ipaddress.IPv4Address) -> bool:
    return ip.packed[-1] not in (0, 255)


class PodIPs:
    """The runner's pod addresses: ``claim(uid)`` when the pod's sandbox would be created,
    ``release(uid)`` once its processes are gone."""

    def __init__(self, first: ipaddress.IPv4Address = FIRST, count: int = COUNT) -> None:
        self._first = first
        self._count = count
        self._next = 0
        self._held: dict[str, tuple[str, socket.socket]] = {}
        self._lock = threading.Lock()

    def claim(self, uid: str) -> str:
        """The pod's address (the same one again for the same pod)."""
        with self._lock:
            if uid in self._held:
                return self._held[uid][0]
            mine = {ip for ip, _ in self._held.values()}
            for _ in range(self._count):
                address = self._first + self._next
                self._next = (self._next + 1) % self._count
                ip = str(address)
                if not usable(address) or ip in mine:
                    continue
                sock = _claim(ip)
                if sock is not None:
                    self._held[uid] = (ip, sock)
                    return ip
        raise NoPodIP(f"no free pod IP in {self._first}/{32 - (self._count - 1).bit_length()}")

    def release(self, uid: str) -> None:
        with self._lock:
            held = self._held.pop(uid, None)
        if held is not None:
            held[1].close()

    def held(self) -> dict[str, str]:
        """uid -> address, of the pods that hold one now."""
        with self._lock:
            return {uid: ip for uid, (ip, _) in self._held.items()}
