"""Draining the fast tier into the durable store: a fast step becomes a durable one without
the trainers (issue 16).

A fast step (``rtj_shim.fast.fast_tier``) is complete per rank: every rank's directory holds the
replicated part (``common/...``) and the rank's own file (``ranks/rank-NNNNN.pt``) under the
commit protocol. A durable step of the same training is the replicated part once plus every
rank's own file, in one manifest. So one writer can publish a durable step from fast ones:
the replicated part and its own ranks' files from its own pod's fast-tier volume, every other
rank's file from the pod that holds it, read over the sidecars' signed transport
(``peer_pull.PeerClient``, tier ``own``) and checked against that rank's signed manifest.

Nothing is trusted that was not checked: every rank's fast manifest must verify against its
COMMITTED and name this step; the ranks must be exactly ``0..world_size-1`` of one world;
every rank's replicated part must be the same bytes as rank 0's (the same sha256 per file: a
rank that diverged is refused, not averaged over); every byte uploaded is hashed while it is
written and must match its manifest entry. The durable step is then published by
``CommitProtocol.publish``, the same path a trainer's save takes: run ownership (a drain of an
old attempt is refused as a zombie's save is), manifest, COMMITTED last, the hint, retention.
Its manifest is rank 0's fast manifest (provenance, framework, ``extra.torch``) with the union
of the files and ``extra.drained_from = "fast-tier"`` in place of ``extra.tier``; a trainer
restores it as any durable step.

The planning (:func:`compose`) is pure; :func:`drain_step` gathers the manifests, uploads and
publishes. Who runs it and when (the sidecar of the pod holding rank 0, every M-th fast step)
is the caller's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rtj_shim.checkpoint.layout import COMMITTED_FILE, MANIFEST_FILE, step_key
from rtj_shim.checkpoint.manifest import FileEntry, Manifest
from rtj_shim.checkpoint.protocol import CommitProtocol, PublishResult, StepMetadata
from rtj_shim.checkpoint.storage.base import StepWriter
from rtj_shim.checkpoint.verification import check_commit
from rtj_shim.errors import ManifestError
from rtj_shim.fast import fast_tier
from rtj_shim.fast.peer_pull import PeerClient

RANKS_DIR = "ranks/"
"""Where a rank's own files live in a step (``rtj_shim.torch.capture.RANK_FILES``)."""
DRAINED_FROM = "fast-tier"
UPLOAD_STREAMS = 4


class DrainError(Exception):
    """A fast step that cannot be drained (the message names the rank and why)."""


class LeftToTheTrainers(DrainError):
    """The trainers publish this step durably themselves: the drain leaves it to them."""


@dataclass(frozen=True)
class Upload:
    """One file of the durable step and the rank whose fast step it is read from."""

    rank: int
    entry: FileEntry


@dataclass(frozen=True)
class DrainPlan:
    step: int
    run_id: str
    uploads: tuple[Upload, ...]
    metadata: StepMetadata


@dataclass(frozen=True)
class DrainReport:
    step: int
    uri: str
    files: int
    bytes: int
    seconds: float
    remote_ranks: tuple[int, ...]  # ranks whose files came from another pod's sidecar


def trainers_publish(step: int, extra: Mapping[str, Any]) -> bool:
    """Pure: whether the trainers publish ``step`` durably themselves, from the schedule
    their fast step records (``extra.durable_schedule``, `rtj_shim.torch.fast_save`). One
    writer per step: a drain and a trainer's save of the same step would share its
    in-progress area. DrainError when their schedule can pick any step (seconds, an
    improved metric) or is not recorded (a trainer's shim older than the drain)."""
    schedule = extra.get("durable_schedule")
    if not isinstance(schedule, dict):
        raise DrainError("the fast step does not record the trainers' durable schedule "
                         "(their rtj-shim is older than the drain)")  # fmt: skip
    if schedule.get("every_seconds") is not None:
        raise DrainError("the trainers also save durably every_seconds: a drained step "
                         "could race their save of the same step")  # fmt: skip
    if schedule.get("by_metric"):
        raise DrainError("the trainers also save durably when their metric improves: a "
                         "drained step could race their save of the same step")  # fmt: skip
    every = schedule.get("every_steps")
    return (
        isinstance(every, int) and not isinstance(every, bool) and every > 0 and (step % every == 0)
    )


def _own_file(rank: int, entry: FileEntry) -> bool:
    return entry.path.startswith(f"{RANKS_DIR}rank-{rank:05d}")


def compose(step: int, manifests: Mapping[int, Manifest]) -> DrainPlan:
    """Pure: the durable step to publish from every rank's fast manifest of ``step``."""
    if 0 not in manifests:
        raise DrainError(f"step {step}: rank 0's fast step is missing (it holds the "
                         "replicated part)")  # fmt: skip
    first = manifests[0]
    world = first.world_size
    if sorted(manifests) != list(range(world)):
        missing = sorted(set(range(world)) - set(manifests))
        outside = sorted(set(manifests) - set(range(world)))
        raise DrainError(f"step {step}: world size {world}, ranks missing {missing}, "
                         f"ranks outside the world {outside}")  # fmt: skip
    common = {e.path: e for e in first.files if not e.path.startswith(RANKS_DIR)}
    uploads = [Upload(0, e) for e in sorted(common.values(), key=lambda e: e.path)]
    for rank, manifest in sorted(manifests.items()):
        if manifest.step != step:
            raise DrainError(f"rank {rank}: its manifest is of step {manifest.step}, not {step}")
        if manifest.world_size != world or manifest.run_id != first.run_id:
            raise DrainError(
                f"rank {rank}: world size {manifest.world_size} of run {manifest.run_id!r}, "
                f"rank 0's: {world} of run {first.run_id!r} (not one world's step)"
            )
        if manifest.lineage != first.lineage:
            raise DrainError(
                f"rank {rank}: its step {step} is of lineage {manifest.lineage or 'legacy'}, "
                f"rank 0's of {first.lineage or 'legacy'} (two histories are not drained)"
            )
        mine = {e.path: e for e in manifest.files if not e.path.startswith(RANKS_DIR)}
        if mine != common:
            differ = sorted(p for p in set(mine) | set(common) if mine.get(p) != common.get(p))
            raise DrainError(f"rank {rank}: its replicated part differs from rank 0's in "
                             f"{differ[:3]} (diverged state is not drained)")  # fmt: skip
        own = [e for e in manifest.files if e.path.startswith(RANKS_DIR)]
        if not own or any(not _own_file(rank, e) for e in own):
            raise DrainError(f"rank {rank}: expected only its own files under {RANKS_DIR}, "
                             f"found {[e.path for e in own]}")  # fmt: skip
        uploads.extend(Upload(rank, e) for e in own)
    extra = {k: v for k, v in first.extra.items() if k != "tier"}
    extra["drained_from"] = DRAINED_FROM
    metadata = StepMetadata(
        world_size=world, parallelism=dict(first.parallelism), framework=first.framework,
        code_commit=first.code_commit, image_digest=first.image_digest,
        dataset_snapshot=first.dataset_snapshot, extra=extra,
    )  # fmt: skip
    return DrainPlan(step, first.run_id, tuple(uploads), metadata)


def _checked(step: int, rank: int, manifest: bytes | None, committed: bytes | None) -> Manifest:
    if manifest is None or committed is None:
        raise DrainError(f"rank {rank}: no committed fast step {step}")
    try:
        return check_commit(step, manifest, committed)
    except ManifestError as exc:
        raise DrainError(f"rank {rank}: fast step {step}: {exc}") from exc


def _local(fast_dir: Path, step: int) -> dict[int, Manifest]:
    found = {}
    for rank in fast_tier.ranks(fast_dir):
        store = fast_tier.rank_store(fast_dir, rank)
        found[rank] = _checked(step, rank, store.read(step_key(step, MANIFEST_FILE)),
                               store.read(step_key(step, COMMITTED_FILE)))  # fmt: skip
    return found


def _remote(clients: Sequence[PeerClient], step: int) -> dict[int, tuple[PeerClient, Manifest]]:
    found: dict[int, tuple[PeerClient, Manifest]] = {}
    for client in clients:
        held = client.holdings("own")
        for rank in held.get("ranks") or []:
            if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
                raise DrainError(f"{client.address}: a rank {rank!r} in its holdings")
            if rank in found:
                raise DrainError(f"rank {rank}: held by both {found[rank][0].address} and "
                                 f"{client.address}")  # fmt: skip
            manifest, committed = client.manifest("own", rank, step)
            found[rank] = (client, _checked(step, rank, manifest, committed))
    return found


def drain_step(
    fast_dir: Path, protocol: CommitProtocol, step: int, peers: Sequence[str], key: str
) -> DrainReport:
    """Publish fast step ``step`` as a durable step: the ranks of this pod's fast tier
    (``fast_dir``, rank 0 among them) and those of the pods at ``peers`` (their sidecars,
    the job's control ``key``). DrainError when the fast steps do not make one world's
    complete step (nothing is published); a store error propagates (nothing is published)."""
    started = time.monotonic()
    local = _local(fast_dir, step)
    if 0 in local and trainers_publish(step, local[0].extra):
        raise LeftToTheTrainers(f"step {step} is one of the trainers' own durable saves")
    remote = _remote([PeerClient(p, key) for p in peers], step)
    both = sorted(set(local) & set(remote))
    if both:
        raise DrainError(f"ranks {both}: held by this pod and by a peer")
    plan = compose(step, {**local, **{r: m for r, (_, m) in remote.items()}})
    if plan.run_id != protocol.run_id:
        raise DrainError(f"step {step} is of run {plan.run_id!r}; the durable root "
                         f"{protocol.store.uri} is run {protocol.run_id!r}")  # fmt: skip
    sources: dict[int, Callable[[StepWriter, FileEntry], FileEntry]] = {}
    for rank in local:
        sources[rank] = partial(_from_disk, fast_tier.rank_dir(fast_dir, rank) / step_key(step))
    for rank, (client, _) in remote.items():
        sources[rank] = partial(_from_peer, client, rank, step)
    writer = protocol.begin(step)
    try:
        entries = list(_upload(writer, plan.uploads, sources))
        published = protocol.publish(writer, entries, plan.metadata)
    except BaseException:
        writer.abort()
        raise
    return _report(published, started, remote)


def _from_disk(directory: Path, writer: StepWriter, entry: FileEntry) -> FileEntry:
    return writer.copy_file(entry.path, directory / entry.path)


def _from_peer(
    client: PeerClient, rank: int, step: int, writer: StepWriter, entry: FileEntry
) -> FileEntry:
    return writer.write_file(entry.path, client.shard("own", rank, step, entry.path))


def _upload(
    writer: StepWriter,
    uploads: Sequence[Upload],
    sources: Mapping[int, Callable[[StepWriter, FileEntry], FileEntry]],
) -> Iterator[FileEntry]:
    def one(upload: Upload) -> FileEntry:
        got = sources[upload.rank](writer, upload.entry)
        want = upload.entry
        if (got.sha256, got.bytes) != (want.sha256, want.bytes):
            raise DrainError(
                f"rank {upload.rank} {want.path}: uploaded {got.bytes} bytes sha256 "
                f"{got.sha256[:12]}..., its fast manifest says {want.bytes} bytes sha256 "
                f"{want.sha256[:12]}..."
            )
        return got

    with ThreadPoolExecutor(UPLOAD_STREAMS, thread_name_prefix="rtj-drain") as pool:
        yield from pool.map(one, uploads)


def _report(published: PublishResult, started: float, remote: Mapping[int, object]) -> DrainReport:
    return DrainReport(
        published.step, published.uri, published.files, published.bytes,
        round(time.monotonic() - started, 3), tuple(sorted(remote)),
    )  # fmt: skip
