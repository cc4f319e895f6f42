"""The collective write of one captured step through the commit protocol.

Every rank agrees the state is finite; rank 0 opens the in-progress area
(``CommitProtocol.begin``) and the other ranks join it; every rank streams its files
through ``StepWriter.write_file`` (several shards in parallel threads); rank 0 gathers the
file entries and publishes; every rank learns the outcome. A failure on any rank fails the
save on every rank and publishes nothing. It runs on the training thread for a blocking
save and on the background thread for ``blocking=False``.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rtj_shim.checkpoint.layout import StepDirName
from rtj_shim.checkpoint.manifest import FileEntry
from rtj_shim.checkpoint.protocol import CommitProtocol
from rtj_shim.checkpoint.storage import CheckpointStore, StepWriter
from rtj_shim.checkpoint.verification import Depth
from rtj_shim.checkpoint.verifier import verify_step
from rtj_shim.errors import Refused, RunOwnershipConflict, StepAlreadyPublished, StoreError
from rtj_shim.torch import _dist
from rtj_shim.torch import serialization as ser
from rtj_shim.torch.capture import (
    SKELETON,
    SaveJob,
    finite_candidates,
    rank_path,
    shard_path,
    step_metadata,
)
from rtj_shim.torch.outcomes import CheckpointError, NonFiniteStateError, SaveReport
from rtj_shim.torch.validation import nonfinite_problem

log = logging.getLogger("rtj_shim.torch")


class CollectiveWriter:
    """Writes captured (and staged) save jobs; one job at a time."""

    def __init__(
        self,
        protocol: CommitProtocol,
        store: CheckpointStore,
        *,
        world_size: int,
        io_workers: int,
        check_finite: bool,
    ) -> None:
        self.protocol = protocol
        self.store = store
        self.world_size = world_size
        self.io_workers = io_workers
        self.check_finite = check_finite

    def _failed(self, writer: StepWriter, errors: list[str]) -> str:
        """Why the ranks' write failed, and the step's area cleaned up unless a newer
        attempt owns the root: then the failure is a zombie's (the new owner's fresh start
        of the step removed its files), the area is the new owner's to keep, and the
        refusal says so."""
        try:
            self.protocol.check_still_owner()
        except RunOwnershipConflict as exc:
            return f"{exc} (the ranks' writes failed: {'; '.join(errors)})"
        except (StoreError, Refused):
            pass  # ownership unknown: clean up what this writer wrote, as before
        writer.abort()
        return "; ".join(errors)

    def write(self, job: SaveJob, coord: _dist.Coordinator) -> SaveReport:
        """Collective: publish ``job`` or raise on every rank; the local DCP staging goes."""
        try:
            return self._write(job, coord)
        finally:
            if job.stage_dir is not None:
                shutil.rmtree(job.stage_dir, ignore_errors=True)

    def _write(self, job: SaveJob, coord: _dist.Coordinator) -> SaveReport:
        problem = job.problem
        if problem is None and self.check_finite:
            problem = nonfinite_problem(finite_candidates(job))
        problems = coord.all_gather(problem)
        refused = [f"rank {r}: {p}" for r, p in enumerate(problems) if p]
        if refused:
            raise NonFiniteStateError(
                f"save of step {job.step} refused (non-finite state): " + "; ".join(refused)
            )
        status: str | None = None
        writer: StepWriter | None = None
        if coord.rank == 0:
            try:
                writer = self._open(job.step)
            except Exception as exc:
                status = f"rank 0 could not open step {job.step}: {exc}"
        status = coord.broadcast(status)
        if status:
            raise CheckpointError(status)
        local_error: str | None = None
        entries: list[FileEntry] = []
        try:
            if writer is None:
                writer = self.protocol.join(job.step)
            entries = self._write_files(job, writer, coord)
            if coord.rank != 0:
                writer.close()  # rank 0's writer commits; the others only contribute files
        except Exception as exc:
            log.exception("rank %d could not write its part of step %d", coord.rank, job.step)
            local_error = f"rank {coord.rank}: {type(exc).__name__}: {exc}"
        gathered = coord.gather(([e.model_dump() for e in entries], local_error))
        result: dict[str, Any] | None = None
        if coord.rank == 0:
            assert gathered is not None and writer is not None
            errors = [err for _, err in gathered if err]
            if errors:
                result = {"error": self._failed(writer, errors)}
            else:
                try:
                    files = [FileEntry(**d) for rows, _ in gathered for d in rows]
                    metadata = step_metadata(job, self.world_size)
                    published = self.protocol.publish(writer, files, metadata)
                    result = {
                        "uri": published.uri,
                        "bytes": published.bytes,
                        "files": published.files,
                    }
                except Exception as exc:
                    with contextlib.suppress(Exception):
                        writer.abort()
                    result = {"error": f"rank 0 could not publish: {exc}"}
        result = coord.broadcast(result)
        assert isinstance(result, dict)
        if "error" in result:
            raise CheckpointError(f"save of step {job.step} failed: {result['error']}")
        seconds = time.perf_counter() - job.started
        stall = seconds if job.blocking else job.stall
        log.info("saved step %d in %.2fs (%d bytes)", job.step, seconds, result["bytes"])
        return SaveReport(
            job.step, job.blocking, seconds, stall, result["bytes"], result["files"], result["uri"]
        )

    def _open(self, step: int) -> StepWriter:
        """Rank 0: open ``step``, replacing a published step only if it does not verify."""
        try:
            return self.protocol.begin(step)
        except StepAlreadyPublished as exc:
            verdict = verify_step(self.store, step, Depth.DEEP)
            if verdict.valid:
                raise StepAlreadyPublished(
                    f"{exc} (saving a published step again is a no-op only right after this "
                    "run restored or published it, with the same state)"
                ) from exc
            log.warning(
                "step %d exists but does not verify (%s); replacing it", step, verdict.reason
            )
            self.store.delete_step_dir(StepDirName(step))
            return self.protocol.begin(step)

    def _write_files(
        self, job: SaveJob, writer: StepWriter, coord: _dist.Coordinator
    ) -> list[FileEntry]:
        entries: list[FileEntry] = []
        # The skeleton first: it is what a loader reads to find everything else.
        if coord.rank == 0:
            entries.append(ser.stream_to_store({"objects": job.skeleton}, writer, SKELETON))
        entries.append(ser.stream_to_store(job.rank_state, writer, rank_path(coord.rank)))
        if job.sharded_files:
            entries.extend(self._write_sharded(job, writer))
        pending = [(shard_path(s), {i: job.tensors[i] for i in job.shards[s]}) for s in job.mine]
        if not pending:
            return entries
        workers = min(self.io_workers, len(pending))
        writers = [writer] + [self.protocol.join(job.step) for _ in range(workers - 1)]
        lock = threading.Lock()

        def drain(w: StepWriter) -> list[FileEntry]:
            done: list[FileEntry] = []
            while True:
                with lock:
                    if not pending:
                        return done
                    path, obj = pending.pop(0)
                done.append(ser.stream_to_store(obj, w, path))

        try:
            with ThreadPoolExecutor(workers, thread_name_prefix="rtj-shard") as pool:
                for part in pool.map(drain, writers):
                    entries.extend(part)
        finally:
            for extra in writers[1:]:
                extra.close()
        return entries

    @staticmethod
    def _write_sharded(job: SaveJob, writer: StepWriter) -> list[FileEntry]:
        try:
            return [writer.copy_file(rel, path) for rel, path in job.sharded_files]
        finally:
            if job.stage_dir is not None:
                shutil.rmtree(job.stage_dir, ignore_errors=True)
