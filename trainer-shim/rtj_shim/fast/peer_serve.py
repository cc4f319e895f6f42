"""What a pod's progress sidecar answers about its fast tier to another pod of the job (the
peer replica, `rtj_shim.fast.peer_replica`). Pure apart from reading the fast-tier directory.

Three reads, each only with a request signed under the job's control key
(`peer_replica.check_request`)::

    GET /fast-tier/holdings?tier=own
        {"job_uid": "...", "tier": "own", "ranks": [2, 3], "steps": [40, 50],
         "newest": {"step": 50, "committed": {"2": "sha256:...", "3": "sha256:..."}}}
    GET /fast-tier/manifest?tier=own&rank=2&step=50
        {"manifest": "<manifest.json>", "committed": "<COMMITTED>"}
    GET /fast-tier/file?tier=own&rank=2&step=50&path=ranks/rank-00002.pt
        the shard's bytes

``tier=replica`` reads the copy this pod holds of its source's steps (a replaced pod copies
its own steps back from there). ``steps`` are those every rank directory holds, oldest first;
``newest`` is the newest of them with each rank's COMMITTED marker, so a holder sees at once
whether its copy is the same step (a restarted source may publish the same step number
again). A file is served only when the step is committed and the manifest lists the path:
nothing outside the tier's published steps is ever read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtj_shim.checkpoint.layout import (
    COMMITTED_FILE,
    MANIFEST_FILE,
    STEPS_DIR,
    step_dir_name,
    step_key,
)
from rtj_shim.checkpoint.verification import check_commit
from rtj_shim.errors import ManifestError, StoreError
from rtj_shim.fast import fast_tier
from rtj_shim.fast.peer_replica import PEER_DIR, TIERS

PREFIX = "/fast-tier/"
MAX_RANK = 1 << 20


class BadRead(ValueError):
    """A read this sidecar cannot answer (the message names the parameter)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Read:
    what: str  # holdings, manifest or file
    tier: str
    rank: int | None = None
    step: int | None = None
    path: str | None = None


def parse_read(path: str, query: Mapping[str, list[str]]) -> Read:
    """The read a ``/fast-tier/...`` request asks for; BadRead naming the parameter."""
    what = path.removeprefix(PREFIX)
    if what not in ("holdings", "manifest", "file"):
        raise BadRead(404, f"no such path {path!r}; try {PREFIX}holdings")

    def one(name: str) -> str:
        values = query.get(name) or []
        if len(values) != 1:
            raise BadRead(400, f"{name}: expected one value, got {len(values)}")
        return values[0]

    tier = one("tier")
    if tier not in TIERS:
        raise BadRead(400, f"tier: expected one of {', '.join(TIERS)}, got {tier!r}")
    if what == "holdings":
        return Read(what, tier)
    rank, step = _number(one("rank"), "rank", MAX_RANK), _number(one("step"), "step", 10**12)
    return Read(what, tier, rank, step, one("path") if what == "file" else None)


def _number(text: str, name: str, limit: int) -> int:
    if not text.isdigit() or int(text) >= limit:
        raise BadRead(400, f"{name}: expected an integer in [0, {limit}), got {text[:40]!r}")
    return int(text)


def tier_root(fast_dir: Path, tier: str) -> Path:
    return fast_dir / PEER_DIR if tier == "replica" else fast_dir


def holdings(fast_dir: Path, tier: str, job_uid: str) -> dict[str, Any]:
    root = tier_root(fast_dir, tier)
    steps = fast_tier.holdings(root)
    ranks = fast_tier.ranks(root)
    newest: dict[str, Any] | None = None
    if steps:
        markers = {}
        for rank in ranks:
            try:
                raw = fast_tier.rank_store(root, rank).read(step_key(steps[-1], COMMITTED_FILE))
            except StoreError:
                raw = None
            if raw is None:  # retention took it since: the next ask sees the new holdings
                break
            markers[str(rank)] = raw.decode("ascii", "replace").strip()
        else:
            newest = {"step": steps[-1], "committed": markers}
    return {"job_uid": job_uid, "tier": tier, "ranks": ranks, "steps": steps, "newest": newest}


def manifest(fast_dir: Path, read: Read) -> tuple[bytes, bytes]:
    """The step's manifest and COMMITTED, once they agree; BadRead(404) otherwise."""
    assert read.rank is not None and read.step is not None
    store = fast_tier.rank_store(tier_root(fast_dir, read.tier), read.rank)
    try:
        raw = store.read(step_key(read.step, MANIFEST_FILE))
        committed = store.read(step_key(read.step, COMMITTED_FILE))
        check_commit(read.step, raw, committed)
    except (ManifestError, StoreError) as exc:
        raise BadRead(404, f"rank {read.rank} step {read.step}: {exc}") from exc
    assert raw is not None and committed is not None
    return raw, committed


def manifest_body(fast_dir: Path, read: Read) -> dict[str, Any]:
    raw, committed = manifest(fast_dir, read)
    return {"manifest": raw.decode(), "committed": committed.decode("ascii")}


def file_path(fast_dir: Path, read: Read) -> Path:
    """Where the shard the read names is: a path the committed manifest lists."""
    raw, committed = manifest(fast_dir, read)
    listed = check_commit(read.step or 0, raw, committed)
    if read.path not in {entry.path for entry in listed.files}:
        raise BadRead(404, f"path: {str(read.path)[:200]!r} is not in step {read.step}'s manifest")
    root = fast_tier.rank_dir(tier_root(fast_dir, read.tier), read.rank or 0)
    return root / STEPS_DIR / step_dir_name(read.step or 0) / str(read.path)
