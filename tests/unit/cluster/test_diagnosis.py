"""diagnosis: the harness's evidence printed after a failed test on the shared cluster."""

from __future__ import annotations

import json

from e2e.cluster.diagnosis import kwok_errors, machine_load

# KWOK v0.8.0 logs JSON lines; the lease controller's failure as seen on this machine kind
# (shared/notes/kwok-lease-recreate.md: "level":"ERROR", "msg":"Failed to sync lease").
LEASE_ERROR = {
    "time": "2026-12-04T10:01:02.345Z",
    "level": "ERROR",
    "msg": "Failed to sync lease",
    "node": "gpu-node-03",
    "err": 'Operation cannot be fulfilled on leases.coordination.k8s.io "gpu-node-03": '
    "Precondition failed: UID in precondition: 1f2e, UID in object meta: ",
}
INFO = {"time": "2026-12-04T10:01:00.000Z", "level": "INFO", "msg": "Watch pods", "node": "x"}


def test_only_errors_are_kept_newest_last_with_their_fields() -> None:
    lines = [json.dumps(INFO), "not json at all", json.dumps(LEASE_ERROR), "[1, 2]"]
    [line] = kwok_errors(lines)
    assert line.startswith("2026-12-04T10:01:02.345Z Failed to sync lease node=gpu-node-03 err=")
    assert "Precondition failed" in line


def test_only_the_newest_errors_are_kept() -> None:
    lines = [json.dumps({**LEASE_ERROR, "node": f"gpu-node-{i:02d}"}) for i in range(20)]
    shown = kwok_errors(lines, keep=3)
    assert [s.split("node=")[1].split()[0] for s in shown] == [
        "gpu-node-17",
        "gpu-node-18",
        "gpu-node-19",
    ]


def test_the_machine_load_names_load_and_memory() -> None:
    said = machine_load()
    assert said.startswith("load average ") and "memory available" in said and "kB" in said
