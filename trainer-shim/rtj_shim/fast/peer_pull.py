"""Copying fast-tier steps between the pods of a job (the peer replica,
`rtj_shim.fast.peer_replica`).

Two users, both in the progress sidecar:

- :class:`ReplicaPuller`: a holder keeps a copy of its source pod's newest fast steps. Every
  second it asks the source which steps it holds and copies the newest one it does not have
  (only the newest: a slow copy skips steps, it never queues them), then keeps ``keep``.
- :func:`fetch_back`: a pod re-created on another node copies the pinned step of its own ranks
  back from the pod holding its replica, before its trainers start (``Order.fast_source``).

A step is copied rank by rank under the commit protocol of the destination store: each
shard streamed into a new step directory and hashed while written, checked against the
source's manifest (sha256 and size), then the *same* manifest bytes and COMMITTED published,
so the copy verifies exactly as the original did and a half-copied step is never published.
Every answer is checked against the job's control key (`peer_replica.check_answer`).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from rtj_shim.checkpoint.layout import COMMITTED_FILE, step_key
from rtj_shim.checkpoint.storage.base import CHUNK_BYTES
from rtj_shim.checkpoint.storage.filesystem import FilesystemStore
from rtj_shim.checkpoint.verification import check_commit
from rtj_shim.errors import ManifestError, StoreError
from rtj_shim.fast import fast_tier
from rtj_shim.fast.peer_replica import (
    PEER_DIR,
    SOURCE_FILE,
    Assignment,
    check_answer,
    request_headers,
)
from rtj_shim.wire.control import read_json, write_json

log = logging.getLogger("rtj_shim.fast.peer_pull")

COPY_STREAMS = 4
"""Ranks copied at once: a pod of 8 ranks copies in two rounds, not eight (one stream is
bound by one connection's request/response turns and the hashing, not by the network)."""
MAX_JSON_BYTES = 4 << 20
"""A holdings or manifest answer (a manifest lists every shard: thousands at most)."""
COPY_ATTEMPT = "peer"
PULL_INTERVAL_S = 1.0


class PeerError(RuntimeError):
    """A peer's answer that cannot be used (the message says which and why)."""


class PeerClient:
    """Signed reads of another pod's fast tier (``GET /fast-tier/...`` on its sidecar)."""

    def __init__(self, address: str, key: str, timeout: float = 10.0) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self._host = host.strip("[]")
        self._port = int(port)
        self._key = key
        self._timeout = timeout

    @contextlib.contextmanager
    def _get(self, what: str, **params: object) -> Iterator[http.client.HTTPResponse]:
        target = f"/fast-tier/{what}?{urlencode(params)}"
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            conn.request("GET", target, headers=request_headers(self._key, "GET", target,
                                                                time.time()))  # fmt: skip
            response = conn.getresponse()
            if response.status != 200:
                raise PeerError(f"{self.address}{target}: HTTP {response.status} "
                                f"{response.read(300)!r}")  # fmt: skip
            yield response
        except (OSError, http.client.HTTPException) as exc:
            raise PeerError(f"{self.address}{target}: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()

    def _json(self, what: str, **params: object) -> dict[str, Any]:
        with self._get(what, **params) as response:
            body = response.read(MAX_JSON_BYTES + 1)
            target = f"/fast-tier/{what}?{urlencode(params)}"
            if len(body) > MAX_JSON_BYTES:
                raise PeerError(f"{self.address}{target}: answer over {MAX_JSON_BYTES} bytes")
            if not check_answer(self._key, target, body, response.getheader("X-RTJ-Signature")):
                raise PeerError(f"{self.address}{target}: the answer is not signed with this "
                                "job's key (another job's pod at that address?)")  # fmt: skip
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise PeerError(f"{self.address}{target}: not JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise PeerError(f"{self.address}{target}: expected a JSON object")
        return data

    def holdings(self, tier: str) -> dict[str, Any]:
        return self._json("holdings", tier=tier)

    def manifest(self, tier: str, rank: int, step: int) -> tuple[bytes, bytes]:
        data = self._json("manifest", tier=tier, rank=rank, step=step)
        manifest, committed = data.get("manifest"), data.get("committed")
        if not isinstance(manifest, str) or not isinstance(committed, str):
            raise PeerError(f"{self.address}: manifest answer without manifest and committed")
        return manifest.encode(), committed.encode()

    def shard(self, tier: str, rank: int, step: int, path: str) -> Iterator[bytes]:
        with self._get("file", tier=tier, rank=rank, step=step, path=path) as response:
            try:
                while chunk := response.read(CHUNK_BYTES):
                    yield chunk
            except (OSError, http.client.HTTPException) as exc:
                raise PeerError(f"{self.address}: reading {path}: {exc}") from exc


def copy_step(client: PeerClient, tier: str, rank: int, step: int, dest: FilesystemStore) -> int:
    """Copy one rank's step from the peer into ``dest`` under the commit protocol; the bytes
    copied. PeerError (nothing published) when a shard does not match the manifest."""
    manifest_raw, committed_raw = client.manifest(tier, rank, step)
    try:
        manifest = check_commit(step, manifest_raw, committed_raw)
    except ManifestError as exc:
        raise PeerError(f"{client.address}: rank {rank} step {step}: {exc}") from exc
    if _marker(dest, step) == committed_raw.strip():
        return 0  # the same step is already here
    with contextlib.suppress(StoreError, ValueError):
        _drop(dest, step)  # another publication of this step number: replaced below
    writer = dest.begin_step(step, COPY_ATTEMPT)
    try:
        for entry in manifest.files:
            got = writer.write_file(entry.path, client.shard(tier, rank, step, entry.path))
            if (got.sha256, got.bytes) != (entry.sha256, entry.bytes):
                raise PeerError(
                    f"{client.address}: rank {rank} step {step} {entry.path}: got "
                    f"{got.bytes} bytes sha256 {got.sha256[:12]}..., the manifest says "
                    f"{entry.bytes} bytes sha256 {entry.sha256[:12]}..."
                )
        writer.commit(manifest_raw, committed_raw)
    except BaseException:
        writer.abort()
        raise
    return manifest.total_bytes


def _copy_ranks(
    client: PeerClient, tier: str, step: int, stores: dict[int, FilesystemStore]
) -> dict[int, int]:
    """Copy ``step`` of each rank into its store, ``COPY_STREAMS`` ranks at once; bytes per
    rank. The first error is raised once every copy has ended (each publishes or not)."""
    if not stores:
        return {}
    with ThreadPoolExecutor(min(COPY_STREAMS, len(stores)), "rtj-peer-copy") as pool:
        futures = {r: pool.submit(copy_step, client, tier, r, step, s) for r, s in stores.items()}
        return {rank: future.result() for rank, future in futures.items()}


def _marker(store: FilesystemStore, step: int) -> bytes | None:
    try:
        raw = store.read(step_key(step, COMMITTED_FILE))
    except StoreError:
        return None
    return raw.strip() if raw is not None else None


def _drop(store: FilesystemStore, step: int) -> None:
    for entry in store.list_step_dirs():
        if entry.name.step == step and not entry.name.in_progress:
            store.delete_step_dir(entry.name)


def keep_newest(store: FilesystemStore, keep: int) -> None:
    """Retention of a copied tier: the ``keep`` newest committed steps, and no leftovers of
    an interrupted copy."""
    kept = set(fast_tier.committed_steps(store)[:keep])
    for entry in store.list_step_dirs():
        if entry.name.step not in kept:
            if entry.name.in_progress:
                shutil.rmtree(store.root / "steps" / str(entry.name), ignore_errors=True)
            else:
                store.delete_step_dir(entry.name)


def fetch_back(fast_dir: Path, source: str, key: str, step: int) -> dict[str, Any]:
    """Copy ``step`` of every rank the holder at ``source`` keeps for this pod into this pod's
    own fast tier; the report (``ok`` False with the error when it could not: the trainers'
    restore then finds the step missing on these ranks and every rank resumes durable)."""
    started = time.monotonic()
    report: dict[str, Any] = {"step": step, "source": source, "ranks": [], "bytes": 0}
    try:
        client = PeerClient(source, key)
        held = client.holdings("replica")
        ranks = [r for r in held.get("ranks") or [] if isinstance(r, int) and r >= 0]
        if step not in (held.get("steps") or []):
            raise PeerError(f"{source} holds steps {held.get('steps')} of this pod, not {step}")
        copied = _copy_ranks(client, "replica", step,
                             {r: fast_tier.rank_store(fast_dir, r) for r in ranks})  # fmt: skip
        report["ranks"], report["bytes"] = sorted(copied), sum(copied.values())
        report["ok"], report["error"] = True, None
    except Exception as exc:  # whatever it was, the order goes on (restored durable)
        report["ok"], report["error"] = False, f"{type(exc).__name__}: {exc}"[:500]
    report["seconds"] = round(time.monotonic() - started, 3)
    return report


class ReplicaPuller:
    """The holder's side: copies its assigned source's newest fast step, every second."""

    def __init__(self, fast_dir: Path, key: str, keep: int = fast_tier.MIN_KEEP) -> None:
        self.root = fast_dir / PEER_DIR
        self._key = key
        self._keep = max(keep, fast_tier.MIN_KEEP)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._error: str | None = None
        self._assignment: Assignment | None = None
        self._thread: threading.Thread | None = None
        held = read_json(self.root / SOURCE_FILE)  # a restarted sidecar keeps its replica
        if held is not None:
            with contextlib.suppress(TypeError, ValueError):
                self._assignment = Assignment(str(held["job_uid"]), str(held["source"]),
                                              int(held["source_index"]))  # fmt: skip

    def assign(self, assignment: Assignment) -> None:
        """Follow ``assignment`` from now on. Another source index drops the copy held; the
        same index at a new address (its pod re-created) keeps it."""
        with self._lock:
            if assignment == self._assignment and self._thread is not None:
                return
            if self._assignment is None or assignment.source_index != self._assignment.source_index:
                shutil.rmtree(self.root, ignore_errors=True)
            self.root.mkdir(parents=True, exist_ok=True)
            write_json(self.root / SOURCE_FILE, assignment.to_json())
            self._assignment, self._error = assignment, None
        self.start()
        self._wake.set()

    @property
    def assigned(self) -> bool:
        with self._lock:
            return self._assignment is not None

    def report(self) -> dict[str, Any] | None:
        """``"replica"`` in ``GET /progress``: whose steps are held here, and which."""
        with self._lock:
            assignment, error = self._assignment, self._error
        if assignment is None:
            return None
        return {
            "source_index": assignment.source_index,
            "source": assignment.source,
            "steps": fast_tier.holdings(self.root),
            "held": [h.encode() for h in fast_tier.held(self.root)],  # with lineages (issue 43)
            "error": error,
        }

    def pull_once(self) -> int | None:
        """Copy the source's newest step when it is not held here; the step copied, if any."""
        with self._lock:
            assignment = self._assignment
        if assignment is None:
            return None
        client = PeerClient(assignment.source, self._key)
        held = client.holdings("own")
        newest = held.get("newest")
        if not isinstance(newest, dict) or not isinstance(step := newest.get("step"), int):
            return None
        markers = newest.get("committed") or {}
        stores, wanted = {}, {}
        for rank_text, marker in sorted(markers.items()):
            if not rank_text.isdigit() or not isinstance(marker, str):
                raise PeerError(f"{assignment.source}: holdings: bad rank entry {rank_text!r}")
            stores[int(rank_text)] = store = fast_tier.rank_store(self.root, int(rank_text))
            if _marker(store, step) != marker.encode().strip():
                wanted[int(rank_text)] = store
        _copy_ranks(client, "own", step, wanted)
        for store in stores.values():
            keep_newest(store, self._keep)
        return step if wanted else None

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.pull_once()
                error = None
            except Exception as exc:  # reported, and tried again: the thread never ends
                error = f"{type(exc).__name__}: {exc}"[:300]
                log.info("peer replica: %s", error)
            with self._lock:
                self._error = error
            self._wake.wait(PULL_INTERVAL_S)
            self._wake.clear()

    def start(self) -> None:
        """Start copying (once; from the first assignment on)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name="rtj-peer-replica", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
