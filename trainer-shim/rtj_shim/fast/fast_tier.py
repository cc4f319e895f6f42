"""The fast checkpoint tier: each rank's own copy of a step in pod-local memory (issue 16).

A durable save goes to the job's store (a filesystem or S3) and takes as long as that
store does; the fast tier takes the same state into the pod's memory-backed ``emptyDir``
every few steps, so a restart inside the same pods (``spec.recovery.inPlace``) loses at
most those few steps. It is the same protocol on a different store, not a second protocol:
each rank's part is a step under the commit protocol (shards hashed while written, the
manifest, ``COMMITTED`` last, an atomic rename), so a half-written fast step is as
impossible as a durable one.

Layout (one :class:`~rtj_shim.checkpoint.storage.filesystem.FilesystemStore` root per rank)::

    <fast dir>/rank-00000/steps/step-000000000120/{common/..., ranks/rank-00000.pt,
                                                    manifest.json, COMMITTED}
    <fast dir>/rank-00001/...

Each rank's step is *self-sufficient*: the replicated state (skeleton and every shard) and
that rank's own file, so one rank restores from its own directory without reading another
pod's memory. Room needed, per rank: ``keep + 1`` copies of the state (a new step is
published before retention removes the oldest), plus one staging copy in the trainer's
own host memory (reused from save to save); with several ranks in a pod, that many times.

A fast step is usable only when every rank of the world has it in one history: the
supervisor reports the (lineage, step) pairs every rank directory of its pod holds
(:func:`held`, :mod:`rtj_shim.checkpoint.lineage`), the operator pins the newest step every pod
holds in one lineage, and the restored trainer verifies it deeply on every rank and checks that
every rank's copy is of the same lineage before any rank loads it (else the durable tier,
with the reason).

Pure apart from reading the directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from rtj_shim.checkpoint import lineage
from rtj_shim.checkpoint.layout import COMMITTED_FILE, MANIFEST_FILE, step_key
from rtj_shim.checkpoint.lineage import Held
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.checkpoint.verification import check_commit
from rtj_shim.errors import ManifestError

ENV_DIR = "RTJ_FAST_TIER_DIR"
ENV_EVERY_STEPS = "RTJ_FAST_EVERY_STEPS"
ENV_KEEP = "RTJ_FAST_KEEP"
RANK_DIR = "rank-{rank:05d}"
MIN_KEEP = 2
"""Fast steps each rank keeps, at least: ranks publish the same step moments apart, so
while one rank has published step s and another has not, step s-K must still be on both."""
MAX_REPORTED = 8


def rank_dir(root: Path, rank: int) -> Path:
    return root / RANK_DIR.format(rank=rank)


def rank_store(root: Path, rank: int) -> FilesystemStore:
    return FilesystemStore(rank_dir(root, rank))


class FastTierConfig:
    """The fast tier's settings (``Checkpointer(fast_tier=FastTierConfig(directory,
    every_steps, keep))``, or the operator's environment); bad values name the field."""

    def __init__(
        self, directory: str | os.PathLike[str], every_steps: int, keep: int = MIN_KEEP
    ) -> None:
        if isinstance(every_steps, bool) or not isinstance(every_steps, int) or every_steps < 1:
            raise ValueError(f"fast_every_steps: expected an integer >= 1, got {every_steps!r}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < MIN_KEEP:
            raise ValueError(f"fast_keep: expected an integer >= {MIN_KEEP}, got {keep!r}")
        self.directory = Path(directory)
        self.every_steps = every_steps
        self.keep = keep

    def due(self, step: int) -> bool:
        return step > 0 and step % self.every_steps == 0

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        directory: str | os.PathLike[str] | None = None,
        every_steps: int | None = None,
        keep: int | None = None,
    ) -> FastTierConfig | None:
        """Arguments first, then ``RTJ_FAST_TIER_DIR`` / ``RTJ_FAST_EVERY_STEPS`` /
        ``RTJ_FAST_KEEP``; None when no directory or no interval is set (no fast tier)."""
        where = directory or env.get(ENV_DIR) or None
        every = every_steps if every_steps is not None else _int(env, ENV_EVERY_STEPS)
        if where is None or every is None:
            return None
        kept = keep if keep is not None else _int(env, ENV_KEEP)
        return cls(where, every, MIN_KEEP if kept is None else kept)


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {raw!r}") from None


def committed_steps(store: FilesystemStore) -> list[int]:
    """Steps of one rank's fast store whose COMMITTED matches their manifest, newest first
    (shallow: the restoring trainer hashes the one it loads)."""
    return [h.step for h in committed_held(store)]


def committed_held(store: FilesystemStore) -> list[Held]:
    """:func:`committed_steps` with each step's lineage (LEGACY without one), newest first."""
    out = []
    for entry in store.list_step_dirs():
        name = entry.name
        if name.in_progress:
            continue
        try:
            manifest = check_commit(
                name.step,
                store.read(step_key(name.step, MANIFEST_FILE)),
                store.read(step_key(name.step, COMMITTED_FILE)),
            )
        except ManifestError:
            continue
        out.append(Held(name.step, lineage.of(manifest.lineage)))
    return sorted(out, reverse=True)


def newest_held(root: Path) -> dict[str, float | int | str] | None:
    """What the pod's progress sidecar reports of its fast tier: the newest step every rank
    directory holds (in one lineage, which it names) and when the last rank committed it
    (wall time, from COMMITTED's mtime); None without one. The operator's summary is the
    newest step every pod holds."""
    pairs = held(root)
    if not pairs:
        return None
    step = pairs[-1].step
    times = []
    for directory in _rank_dirs(root):
        try:
            times.append((directory / step_key(step, COMMITTED_FILE)).stat().st_mtime)
        except OSError:
            return None  # retention took it between the two reads: the next poll knows
    return {"step": step, "committed_wall_time": round(max(times), 3),
            "lineage": pairs[-1].lineage}  # fmt: skip


def _rank_dirs(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("rank-"))
    except OSError:
        return []


def ranks(root: Path) -> list[int]:
    """The ranks with a directory under ``root``, in order."""
    out = []
    for directory in _rank_dirs(root):
        number = directory.name.removeprefix("rank-")
        if number.isdigit() and directory.name == RANK_DIR.format(rank=int(number)):
            out.append(int(number))
    return out


def holdings(root: Path) -> list[int]:
    """The steps of :func:`held`, oldest first."""
    return [h.step for h in held(root)]


def held(root: Path) -> list[Held]:
    """The fast steps every rank directory of this pod holds in one lineage, oldest first
    (at most ``MAX_REPORTED``, the newest); empty without a fast tier. A rank that never
    saved has no directory and does not narrow it: the restoring trainer's check covers
    every rank. A step the ranks hold in different lineages (two histories) is not held."""
    common: set[Held] | None = None
    for directory in _rank_dirs(root):
        try:
            steps = set(committed_held(FilesystemStore(directory)))
        except Exception:  # an unreadable rank directory holds nothing usable
            steps = set()
        common = steps if common is None else common & steps
    return sorted(common or ())[-MAX_REPORTED:]
