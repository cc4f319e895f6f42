"""What a container's own words say: termination messages and image-pull errors. Pure.

A trainer's termination message (`FallbackToLogsOnError`: the last 80 lines / 2 KiB of its
log, kubelet `MaxContainerTerminationMessageLogLines/Length`) is a *hint*: it names the
likely cause, never proves a node bad. The reading goes by principle, in this order:

1. Hardware words (an XID the catalog sends to service, uncorrectable ECC, fallen off the
   bus, an uncorrectable NVLink error) make a GPU fault *suspect*: restart elsewhere, but
   quarantine only on node-level evidence (`node_signals`).
2. Out of memory, on the GPU (CUDA OOM) or the host (a DataLoader worker SIGKILLed, a bus
   error in shared memory), is the job's own sizing.
3. NCCL misuse (`ncclInvalidUsage`, "invalid usage") is a bug in the job.
4. A collective or transport failure (watchdog timeout, `ncclRemoteError`, NET/IB
   completion errors, a rendezvous or c10d store failure) is a network fault, unless an
   earlier root cause explains it (`classify`).
5. A Python exception raised by the job's code is a user error. The launcher's own
   traceback is not: torchrun raises `ChildFailedError` and prints its summary for every
   worker failure, a watchdog abort and a SIGKILL included. A worker that died of a signal
   raised no exception, and a summary whose traceback field is only "To enable traceback
   see ..." shows none.
6. Anything else is unexplained.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rtj_operator.api.reasons import FailureClass
from rtj_operator.policy import xid
from rtj_shim.wire.suspect_verdict import MARK, SuspectVerdict

C = FailureClass

_HARDWARE = re.compile(
    r"uncorrectable ECC error|fallen off the bus|GPU is lost|NVML_ERROR_GPU_IS_LOST"
    r"|uncorrectable NVLink error|Row remapp\w* fail",
    re.I,
)
_CUDA_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED"
)
_HOST_OOM = re.compile(
    r"DataLoader worker \(pid[^)]*\) is killed by signal: Killed"
    r"|Unexpected bus error encountered in worker\. This might be caused by insufficient "
    r"shared memory|dataloader's workers are out of shared memory"
)
_NCCL_MISUSE = re.compile(
    r"ncclInvalidUsage|ncclInvalidArgument|, invalid usage\b|, invalid argument\b"
)
_NETWORK = re.compile(
    r"Watchdog caught collective operation timeout|ncclRemoteError|ncclSystemError"
    r"|NET/IB\w* ?: ?Got completion from peer|remote process exited or there was a network error"
    r"|unhandled system error"  # ncclSystemError's own string (a socket or system call failed)
    r"|NCCL communicator was aborted|DistNetworkError|DistStoreError|RendezvousClosedError"
    r"|RendezvousTimeoutError|RendezvousConnectionError|Connection reset by peer"
    r"|Connection closed by (?:remote )?peer|ProcessGroupNCCL.*(?:timed out|time ?out)",
    re.I,
)
_SUSPECT_STATE = re.compile(r"rtj_shim\.integrity\.SuspectState: (.*)")
"""The verdict rtj_shim.integrity raises on every rank (its traceback's final line)."""
_EXCEPTION = re.compile(
    r"^(?:\[rank\d+\]:\s*)?(?:\s*traceback\s*:\s*)?\s*"
    r"((?:[A-Za-z_][\w]*\.)*([A-Z]\w*(?:Error|Exception|Interrupt)))(?::\s?(.*))?$",
    re.M,
)
_CUDA_ERROR = re.compile(r"CUDA error: ([^\n]+)")
_NAN = re.compile(r"\bnon-finite loss\b|\bloss is nan\b", re.I)
_LAUNCHER = frozenset({"ChildFailedError", "SignalException"})
_TORCHRUN = re.compile(
    r"Root Cause \(first observed failure\):\s*\[\d+\]:.*?rank\s*:\s*(\d+).*?"
    r"exitcode\s*:\s*(-?\d+).*?traceback\s*:\s*([^\n]*)",
    re.S,
)


@dataclass(frozen=True)
class Reading:
    """The class a message points to, the phrase that says so, and its strength."""

    failure_class: FailureClass
    why: str
    suspect: bool = False
    rank: int | None = None
    hints: tuple[str, ...] = ()
    verdict: SuspectVerdict | None = None
    """A suspect state's verdict, as its message carried it (`rtj_shim.wire.suspect_verdict`)."""


@dataclass(frozen=True)
class TorchrunRoot:
    """torchrun's "Root Cause (first observed failure)" block."""

    rank: int
    exit_code: int
    traceback: str

    @property
    def signal(self) -> str | None:
        match = re.match(r"Signal \d+ \((\w+)\)", self.traceback)
        return match.group(1) if match else None


def torchrun_root(text: str) -> TorchrunRoot | None:
    match = _TORCHRUN.search(text)
    if match is None:
        return None
    return TorchrunRoot(int(match.group(1)), int(match.group(2)), match.group(3).strip())


def job_exceptions(text: str) -> list[str]:
    """The final lines of Python exceptions raised by the job (the launcher's excluded)."""
    found = []
    for match in _EXCEPTION.finditer(text):
        if match.group(2) in _LAUNCHER or match.group(2) == "Error":
            continue
        found.append(match.group(0).strip())
    return found


def _xid_reading(text: str, quarantine_codes: frozenset[int]) -> tuple[Reading | None, str]:
    codes = xid.xid_codes(text)
    bad = codes & quarantine_codes
    hint = f"XID {xid.describe(codes)} in its message" if codes else ""
    if bad:
        why = f"GPU XID {xid.describe(bad)} in its own message"
        return Reading(C.GPU_FAULT, why, suspect=True), hint
    return None, hint


def read_message(text: str, quarantine_codes: frozenset[int]) -> Reading:
    """Classify a container's termination message by the principles in the module doc."""
    root = torchrun_root(text)
    rank = root.rank if root else None
    by_xid, hint = _xid_reading(text, quarantine_codes)
    if by_xid is not None:
        return Reading(by_xid.failure_class, by_xid.why, True, rank)
    hints = (hint,) if hint else ()
    if match := _HARDWARE.search(text):
        return Reading(
            C.GPU_FAULT,
            f"GPU hardware error in its own message ({match.group(0)})",
            True,
            rank,
            hints,
        )
    if _CUDA_OOM.search(text):
        return Reading(C.OUT_OF_MEMORY, "CUDA out of memory", rank=rank, hints=hints)
    if match := _HOST_OOM.search(text):
        return Reading(
            C.OUT_OF_MEMORY, f"host memory exhausted ({match.group(0)})", rank=rank, hints=hints
        )
    if match := _SUSPECT_STATE.search(text):
        verdict = SuspectVerdict.find(match.group(0))
        detail = match.group(1).split(f" [{MARK}", 1)[0]
        why = f"the trainer refused to publish a suspect state ({detail[:200]})"
        return Reading(C.SILENT_DATA_CORRUPTION, why, True, rank, hints, verdict)
    if match := _NCCL_MISUSE.search(text):
        why = f"NCCL used wrongly ({match.group(0).strip(', ')})"
        return Reading(C.USER_ERROR, why, rank=rank, hints=hints)
    if match := _NETWORK.search(text):
        why = f"collective/network failure ({match.group(0)})"
        return Reading(C.NETWORK_FAULT, why, rank=rank, hints=hints)
    return _code_failure(text, root, hints)


def _code_failure(text: str, root: TorchrunRoot | None, hints: tuple[str, ...]) -> Reading:
    rank = root.rank if root else None
    raised = job_exceptions(text)
    cuda = _CUDA_ERROR.search(text)
    if raised:
        return Reading(C.USER_ERROR, f"the job raised {raised[-1][:160]}", rank=rank, hints=hints)
    if cuda:
        return Reading(
            C.USER_ERROR, f"CUDA error in the job ({cuda.group(1)[:120]})", rank=rank, hints=hints
        )
    if _NAN.search(text):
        return Reading(C.USER_ERROR, "the job stopped on a non-finite loss", rank=rank, hints=hints)
    if root is not None:
        signal = root.signal
        died = f"signal {signal}" if signal else f"exit code {root.exit_code}"
        why = f"torchrun reports rank {root.rank} died of {died} with no exception of the job's"
        return Reading(C.UNKNOWN, why, rank=rank, hints=hints)
    return Reading(C.UNKNOWN, "no recognizable cause in its message", hints=hints)


# --- image pulls -------------------------------------------------------------------------

_PULL_USER = re.compile(
    r": not found\b|manifest unknown|pull access denied|repository does not exist"
    r"|\bunauthorized\b|authentication required|insufficient_scope|\bdenied\b"
    r"|invalid reference format|InvalidImageName|ErrImageNeverPull|SignatureValidationFailed",
    re.I,
)
_PULL_INFRA = re.compile(
    r"\b429\b|Too Many Requests|toomanyrequests|\b50[0234] [A-Z]|Service Unavailable"
    r"|Bad Gateway|Gateway Timeout|Internal Server Error|RegistryUnavailable"
    r"|registry is unavailable|i/o timeout|connection timed out|connection refused"
    r"|TLS handshake timeout|connection reset by peer|no space left on device"
    r"|failed to (?:extract|unpack) layer|context deadline exceeded",
    re.I,
)


def read_pull_error(text: str) -> tuple[FailureClass, str]:
    """Whose fault an image pull failure is, from the runtime's own error text.

    A registry that throttles (429) or fails (5xx, timeouts, refused connections) and a
    node whose runtime cannot unpack (disk full) are infrastructure; an image that does
    not exist or may not be read by this job is the job's configuration. Throttling and
    outages are checked first: a 503 page may also say "not found" in its body.
    """
    if match := _PULL_INFRA.search(text):
        return C.IMAGE_PULL_FAILED, f"the registry or the node failed the pull ({match.group(0)})"
    if match := _PULL_USER.search(text):
        return C.CONFIG_ERROR, f"the image cannot be pulled as named ({match.group(0).strip(': ')})"
    return C.IMAGE_PULL_FAILED, "the pull failed for no reason the job controls"
