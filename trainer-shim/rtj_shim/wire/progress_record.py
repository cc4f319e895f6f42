"""The per-rank progress record: a fixed-size binary file, written through ``mmap``.

One file per global rank, ``<dir>/rank-NNNNN.progress``, in a pod-local directory. The
training process writes it with plain stores into a shared mapping (no system call per
update); another process (``rtj-shim progress-server``) reads it. The layout, all
little-endian (schema version 1)::

    header (16 bytes)
      0   4s  magic b"RTJP"
      4   H   version (1)
      6   H   header size (16)
      8   I   slot size
      12  I   slot count (2)
    slot 0 at 16, slot 1 at 16 + slot size; each slot:
      0   Q   seq_end      written last
      8   ... payload      PAYLOAD below, its first field the same seq
      ..  I   crc32 of the payload
      ..  Q   seq_begin    written first

A write takes the next sequence number ``s`` and fills slot ``s % 2``: ``seq_begin``, then
the payload and its crc32, then ``seq_end``. A reader reads ``seq_end``, the payload, the
crc and ``seq_begin`` in that order and accepts the slot only when both counters equal the
payload's own seq and the crc matches (a seqlock whose counters sit on both sides of the
payload, so even one ascending copy of the bytes reads them in the right order; the crc
catches what weakly ordered memory could still tear). Of the valid slots the higher seq
wins. Because a write only ever touches the slot that does *not* hold the newest record, a
writer stopped halfway through a write (SIGSTOP, a crash) leaves the previous record intact
and readable: a reader never sees a mixed record and never loses the last good one. A new
file gets its first record in both slots before it appears under its name, so a reader
that finds only one intact slot knows a write is under way and retries until it reads
both (successive reads never go back to an older record), settling for the one only if
the writer stays stopped.

Times are ``CLOCK_MONOTONIC`` nanoseconds (comparable between processes on one machine,
so the reader computes ages with its own clock) plus one wall-clock stamp of the last
update. Durations are nanoseconds; 0 means "none yet".
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = b"RTJP"
VERSION = 1
RING = 16  # step durations kept per rank
SECTION_BYTES = 32  # UTF-8, NUL-padded; longer names are cut at a character boundary
FILE_PREFIX = "rank-"
FILE_SUFFIX = ".progress"

STATE_RUNNING = 1
STATE_EXITED = 2  # the process closed its Progress (a normal exit, SystemExit included)
STATES = {STATE_RUNNING: "running", STATE_EXITED: "exited"}

HEADER = struct.Struct("<4sHHII")
SEQ = struct.Struct("<Q")
CRC = struct.Struct("<I")
PAYLOAD = struct.Struct(
    "<Q"  # seq (the same number as seq_begin and seq_end)
    "iiiiI"  # rank, local_rank, pid, restart (TORCHELASTIC_RESTART_COUNT), state
    "qQ"  # step (last completed; -1: none yet), steps_completed (in this process)
    "qqqqq"  # started, section_started, updated (monotonic), updated_wall, step_done (mono)
    "qqqqI"  # last_step, last_wait, last_checkpoint, max_checkpoint (ns), checkpoints
    "I"  # ring count
    f"{RING}q{RING}q"  # step durations, wait durations (oldest first; zero-padded)
    f"{SECTION_BYTES}s"  # current section
)


def _aligned(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to


SEQ_END_AT = 0
PAYLOAD_AT = SEQ.size
CRC_AT = PAYLOAD_AT + PAYLOAD.size
SEQ_BEGIN_AT = _aligned(CRC_AT + CRC.size, 8)
SLOT_SIZE = _aligned(SEQ_BEGIN_AT + SEQ.size)
SLOTS = 2
FILE_SIZE = HEADER.size + SLOTS * SLOT_SIZE


def file_name(rank: int) -> str:
    return f"{FILE_PREFIX}{rank:05d}{FILE_SUFFIX}"


def encode_section(name: str) -> bytes:
    """At most SECTION_BYTES of UTF-8, cut at a character boundary."""
    raw = name.encode("utf-8", "replace")[:SECTION_BYTES]
    return raw.decode("utf-8", "ignore").encode("utf-8")


@dataclass(frozen=True)
class Record:
    """One decoded record. ``step`` None: no step completed yet in this process."""

    seq: int
    rank: int
    local_rank: int
    pid: int
    restart: int
    state: int
    step: int | None
    steps_completed: int
    started_ns: int
    section_started_ns: int
    updated_ns: int
    updated_wall_ns: int
    step_done_ns: int
    last_step_ns: int
    last_wait_ns: int
    last_checkpoint_ns: int
    max_checkpoint_ns: int
    checkpoints: int
    section: str
    step_ns: tuple[int, ...] = field(default=())
    wait_ns: tuple[int, ...] = field(default=())

    def values(self) -> tuple[object, ...]:
        """The arguments of :data:`PAYLOAD` ``.pack`` after the seq, for this record."""
        return (
            self.rank, self.local_rank, self.pid, self.restart, self.state,
            -1 if self.step is None else self.step, self.steps_completed, self.started_ns,
            self.section_started_ns, self.updated_ns, self.updated_wall_ns, self.step_done_ns,
            self.last_step_ns, self.last_wait_ns, self.last_checkpoint_ns,
            self.max_checkpoint_ns, self.checkpoints,
            *ring_values(self.step_ns, self.wait_ns), encode_section(self.section),
        )  # fmt: skip


def ring_values(step_ns: Iterable[int], wait_ns: Iterable[int]) -> tuple[int, ...]:
    """The ring part of the payload: its count, then the newest RING step and wait
    durations, oldest first, zero-padded."""
    steps, waits = tuple(step_ns), tuple(wait_ns)
    count = min(len(steps), len(waits), RING)
    pad = (0,) * (RING - count)
    return (count, *steps[len(steps) - count :], *pad, *waits[len(waits) - count :], *pad)


def decode_payload(raw: bytes) -> Record:
    v = PAYLOAD.unpack(raw)
    count = min(int(v[18]), RING)
    steps = v[19 : 19 + RING]
    waits = v[19 + RING : 19 + 2 * RING]
    return Record(
        seq=v[0],
        rank=v[1],
        local_rank=v[2],
        pid=v[3],
        restart=v[4],
        state=v[5],
        step=None if v[6] < 0 else v[6],
        steps_completed=v[7],
        started_ns=v[8],
        section_started_ns=v[9],
        updated_ns=v[10],
        updated_wall_ns=v[11],
        step_done_ns=v[12],
        last_step_ns=v[13],
        last_wait_ns=v[14],
        last_checkpoint_ns=v[15],
        max_checkpoint_ns=v[16],
        checkpoints=v[17],
        step_ns=tuple(steps[:count]),
        wait_ns=tuple(waits[:count]),
        section=v[-1].rstrip(b"\0").decode("utf-8", "replace"),
    )


class RecordError(Exception):
    """A file that is not a progress record of this schema."""


def read_slot(buf: mmap.mmap | bytes, slot: int) -> Record | None:
    """The slot's record if it is complete and intact, else None (never a mixed record)."""
    base = HEADER.size + slot * SLOT_SIZE
    (end,) = SEQ.unpack_from(buf, base + SEQ_END_AT)
    if end == 0:
        return None  # never written
    payload = bytes(buf[base + PAYLOAD_AT : base + CRC_AT])
    (crc,) = CRC.unpack_from(buf, base + CRC_AT)
    (begin,) = SEQ.unpack_from(buf, base + SEQ_BEGIN_AT)
    if begin != end or zlib.crc32(payload) != crc:
        return None
    (seq,) = SEQ.unpack_from(payload, 0)
    if seq != end:
        return None
    return decode_payload(payload)


def check_header(buf: mmap.mmap | bytes) -> None:
    if len(buf) < FILE_SIZE:
        raise RecordError(f"{len(buf)} bytes, expected {FILE_SIZE}")
    magic, version, header, slot_size, slots = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise RecordError(f"bad magic {magic!r}")
    if (version, header, slot_size, slots) != (VERSION, HEADER.size, SLOT_SIZE, SLOTS):
        raise RecordError(
            f"unsupported layout: version {version}, header {header}, slot {slot_size}x{slots}"
        )


def read_record(buf: mmap.mmap | bytes, attempts: int = 1000) -> Record:
    """The newest intact record. Both slots always hold a record except while one is being
    written, so a read that finds only one intact slot retries (a write takes
    microseconds) until it finds both, and only then settles for the one: the writer is
    stopped mid-write, and the other slot holds its last complete record. Reading both
    slots intact makes successive reads monotonic: a record older than one returned
    before is never returned. Raises RecordError if no slot is intact."""
    check_header(buf)
    single: Record | None = None
    for _ in range(max(1, attempts)):
        found = [r for r in (read_slot(buf, s) for s in range(SLOTS)) if r is not None]
        if len(found) == SLOTS:
            return max(found, key=lambda r: r.seq)
        if found and (single is None or found[0].seq > single.seq):
            single = found[0]
        os.sched_yield()
    if single is not None:
        return single
    raise RecordError("no intact record (never written, or corrupt)")


def read_file(path: Path) -> Record:
    """Read one record file (maps it read-only; no lock, no write)."""
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size != FILE_SIZE:
            raise RecordError(f"{size} bytes, expected {FILE_SIZE}")
        with mmap.mmap(fh.fileno(), FILE_SIZE, access=mmap.ACCESS_READ) as buf:
            return read_record(buf)


class RecordWriter:
    """The single writer of one rank's file. Not thread-safe: callers serialize writes."""

    def __init__(self, path: Path, *, reuse: bool = False) -> None:
        """Create ``path`` afresh (written under a temporary name, then renamed, so an
        older process of the same rank still writing keeps its own, unlinked, file), or
        with ``reuse`` map an existing valid file in place and continue its sequence."""
        self.path = path
        self.seq = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self.previous: Record | None = None
        if reuse and path.exists():
            try:
                self.previous = read_file(path)
            except (OSError, RecordError):
                self.previous = None
        if self.previous is not None:
            fd = os.open(path, os.O_RDWR)
            try:
                self._mm = mmap.mmap(fd, FILE_SIZE, access=mmap.ACCESS_WRITE)
            finally:
                os.close(fd)
            self.seq = self.previous.seq
            self._created: Path | None = None
            return
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, FILE_SIZE)
            self._mm = mmap.mmap(fd, FILE_SIZE, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        HEADER.pack_into(self._mm, 0, MAGIC, VERSION, HEADER.size, SLOT_SIZE, SLOTS)
        self._created = tmp

    def write(self, values: tuple[object, ...]) -> None:
        """Publish one record: ``values`` are the payload's fields after the seq (as
        :meth:`Record.values` returns them). A file just created appears under its name
        after its first write (into both slots), so a reader never finds it without a
        record."""
        self._write(values)
        if self._created is not None:
            self._write(values)
            os.replace(self._created, self.path)
            self._created = None

    def _write(self, values: tuple[object, ...]) -> None:
        seq = self.seq + 1
        self.seq = seq
        body = PAYLOAD.pack(seq, *values)
        mm = self._mm
        base = HEADER.size + (seq & 1) * SLOT_SIZE
        SEQ.pack_into(mm, base + SEQ_BEGIN_AT, seq)
        mm[base + PAYLOAD_AT : base + CRC_AT] = body
        CRC.pack_into(mm, base + CRC_AT, zlib.crc32(body))
        SEQ.pack_into(mm, base + SEQ_END_AT, seq)

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()
        if self._created is not None:
            self._created.unlink(missing_ok=True)
            self._created = None
