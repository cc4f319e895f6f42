"""NVIDIA's XID catalog, and every way an XID code is written by the tools that report one.

Source: "Analyzing Xid Errors with the Xid Catalog" (docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html, Ampere and newer), column "Resolution Bucket (Immediate Action)".
Only XIDs the catalog marks as used on A100/H100/B100/GB200 are listed; the rest are unused.

A node is quarantined for an XID only when the catalog's immediate action needs the GPU or
its links reset, the machine restarted, or a person at the hardware (`QUARANTINE_BUCKETS`);
`RESTART_APP` and `IGNORE` XIDs (13, 31, 43, 94, ...) are caused by or contained to the
application and never quarantine. `rtj_operator.api.detection_spec.DEFAULT_XID_CODES` must equal
`catalog_quarantine_codes()` (a unit test holds the two together).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

RESTART_APP, IGNORE, RESET_GPU = "RESTART_APP", "IGNORE", "RESET_GPU"
QUARANTINE_BUCKETS = frozenset(
    {
        RESET_GPU,
        "RESTART_BM",
        "RESTART_VM",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
        "CHECK_MECHANICALS",
    }
)
"""Immediate actions that take the GPU out of service: the next attempt must go elsewhere."""


def _codes(spec: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return tuple(out)


CATALOG: dict[int, str] = {
    **dict.fromkeys(
        _codes("8,11,13,25,31,32,39-41,60,68-72,75-77,80,82-86,88,89,94,96-105,126-135,139"),
        RESTART_APP,
    ),
    **dict.fromkeys(
        _codes("14,37,38,43,44,63,66,67,92,93,106-108,121,137,141,152,153,157,160,161"), IGNORE
    ),
    **dict.fromkeys(_codes("46,62,64,95,109,110,119,120,136,140,143,155,156,158"), RESET_GPU),
    45: "WORKFLOW_XID_45",  # solo: restart Fabric Manager; otherwise follow the other XID
    48: "WORKFLOW_XID_48",
    54: "CHECK_MECHANICALS",
    74: "WORKFLOW_NVLINK_ERR",
    78: "UPDATE_SWFW",
    79: "RESTART_BM",
    142: "CONTACT_SUPPORT",
    **dict.fromkeys(_codes("144-150"), "WORKFLOW_NVLINK5_ERR"),
    151: "RESTART_VM",
    154: "XID_154",  # informational: states the recovery action another XID needs
    159: "CHECK_UVM",
}


def catalog_quarantine_codes() -> tuple[int, ...]:
    return tuple(sorted(code for code, bucket in CATALOG.items() if bucket in QUARANTINE_BUCKETS))


def application_codes() -> frozenset[int]:
    """XIDs the catalog resolves by restarting the application (or ignoring): never a node."""
    return frozenset(code for code, bucket in CATALOG.items() if bucket in (RESTART_APP, IGNORE))


# Spellings, each from a real reporter (sources in tests/fixtures/classify/SOURCES.md):
#   NVRM: Xid (PCI:0000:3b:00): 79, pid=...     the kernel driver (dmesg, journald, NPD rules)
#   ErrorCode:79 / ErrorCode:145.RLW             NVSentinel node conditions and events
#   XID 79 (NVSentinel's mnemonic), Xid 79       NVSentinel, NVIDIA's own docs
#   XID-79 / NvidiaXID79Error / NvidiaXID13Warning   the EKS node monitoring agent
_XID = re.compile(
    r"(?:\bXid\b\s*(?:\([^)]*\))?\s*[:,]?\s*"  # Xid 79, Xid (PCI:..): 79, XID: 79
    r"|\bXID-"  # XID-79
    r"|NvidiaXID"  # NvidiaXID79Error
    r"|\bErrorCode:)"  # ErrorCode:79
    r"(\d+)",
    re.I,
)


def xid_codes(text: str) -> set[int]:
    """Every XID code written in `text`, in any of the spellings above."""
    return {int(code) for code in _XID.findall(text)}


def describe(codes: Iterable[int]) -> str:
    """`79 (RESTART_BM), 13 (RESTART_APP)`: codes with their catalog action, for evidence."""
    return ", ".join(f"{c} ({CATALOG.get(c, 'not in catalog')})" for c in sorted(codes))
