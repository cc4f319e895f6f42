"""The progress record: layout round trip, and a reader never returns a mixed record."""

from __future__ import annotations

import mmap
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rtj_shim.wire import progress_record as pr
from rtj_shim.wire.progress_record import Record, RecordError, RecordWriter, read_file, read_record


def make(n: int) -> Record:
    """A record whose every field is derived from ``n``: a mix of two is detectable."""
    count = n % (pr.RING + 3)
    return Record(
        seq=0,
        rank=n % 100_000,
        local_rank=n % 8,
        pid=n % 4_000_000,
        restart=n % 5,
        state=pr.STATE_RUNNING,
        step=None if n % 7 == 0 else n,
        steps_completed=n * 3,
        started_ns=n + 1,
        section_started_ns=n + 2,
        updated_ns=n + 3,
        updated_wall_ns=n + 4,
        step_done_ns=n + 5,
        last_step_ns=n + 6,
        last_wait_ns=n + 7,
        last_checkpoint_ns=n + 8,
        max_checkpoint_ns=n + 9,
        checkpoints=n % 1000,
        section=f"s{n}",
        step_ns=tuple(n + i for i in range(count)),
        wait_ns=tuple(n - i for i in range(count)),
    )


def consistent(record: Record) -> bool:
    n = record.started_ns - 1
    expected = make(n)
    ring = min(len(expected.step_ns), pr.RING)
    return record == Record(
        **{
            **expected.__dict__,
            "seq": record.seq,
            "step_ns": expected.step_ns[len(expected.step_ns) - ring :],
            "wait_ns": expected.wait_ns[len(expected.wait_ns) - ring :],
        }
    )


def test_layout_is_fixed_and_aligned() -> None:
    assert pr.HEADER.size == 16
    assert pr.SLOT_SIZE % 64 == 0 and pr.SEQ_BEGIN_AT % 8 == 0
    assert pr.FILE_SIZE == 16 + 2 * pr.SLOT_SIZE
    assert pr.PAYLOAD.size + 8 + 4 + 8 <= pr.SLOT_SIZE
    assert pr.file_name(5) == "rank-00005.progress"


def test_round_trip_of_every_field(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / pr.file_name(3))
    for n in (1, 14, 40, 7):
        original = make(n)
        writer.write(original.values())
        back = read_file(writer.path)
        assert back.seq == writer.seq
        assert consistent(back)
    assert back.step is None  # n = 7: no step yet is -1 on disk, None decoded
    assert read_file(writer.path).section == "s7"
    writer.close()


def test_the_ring_keeps_the_newest_durations(tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path / "rank-00000.progress")
    writer.write(
        Record(**{**make(1).__dict__, "step_ns": tuple(range(40)), "wait_ns": ()}).values()
    )
    assert read_file(writer.path).step_ns == ()  # rings are written in pairs
    steps = tuple(range(40))
    writer.write(Record(**{**make(1).__dict__, "step_ns": steps, "wait_ns": steps}).values())
    assert read_file(writer.path).step_ns == steps[-pr.RING :]
    writer.close()


def test_section_names_are_cut_at_a_character_boundary() -> None:
    name = "é" * 20  # 40 bytes of UTF-8
    encoded = pr.encode_section(name)
    assert len(encoded) == 32 and encoded.decode() == "é" * 16
    assert pr.encode_section("forward") == b"forward"
    assert len(pr.encode_section("x" * 31 + "é")) == 31


def test_a_file_appears_only_once_it_holds_a_record(tmp_path: Path) -> None:
    path = tmp_path / "rank-00001.progress"
    writer = RecordWriter(path)
    assert not path.exists()
    writer.write(make(5).values())
    assert consistent(read_file(path))
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    writer.close()


def test_not_a_record(tmp_path: Path) -> None:
    path = tmp_path / "rank-00000.progress"
    path.write_bytes(b"x" * 10)
    with pytest.raises(RecordError, match="bytes"):
        read_file(path)
    path.write_bytes(b"NOPE" + bytes(pr.FILE_SIZE - 4))
    with pytest.raises(RecordError, match="magic"):
        read_file(path)
    header = pr.HEADER.pack(pr.MAGIC, pr.VERSION + 1, 16, pr.SLOT_SIZE, 2)
    path.write_bytes(header + bytes(pr.FILE_SIZE - 16))
    with pytest.raises(RecordError, match="unsupported"):
        read_file(path)
    header = pr.HEADER.pack(pr.MAGIC, pr.VERSION, 16, pr.SLOT_SIZE, 2)
    path.write_bytes(header + bytes(pr.FILE_SIZE - 16))
    with pytest.raises(RecordError, match="no intact record"):
        read_record(path.read_bytes(), attempts=2)


def _buffer(*records: Record) -> bytearray:
    """The bytes of a file after writing ``records`` in order."""
    buf = bytearray(pr.FILE_SIZE)
    pr.HEADER.pack_into(buf, 0, pr.MAGIC, pr.VERSION, 16, pr.SLOT_SIZE, 2)
    for seq, record in enumerate(records, start=1):
        body = pr.PAYLOAD.pack(seq, *record.values())
        base = 16 + (seq & 1) * pr.SLOT_SIZE
        pr.SEQ.pack_into(buf, base + pr.SEQ_BEGIN_AT, seq)
        buf[base + pr.PAYLOAD_AT : base + pr.CRC_AT] = body
        pr.CRC.pack_into(buf, base + pr.CRC_AT, pr.zlib.crc32(body))
        pr.SEQ.pack_into(buf, base + pr.SEQ_END_AT, seq)
    return buf


def test_a_writer_stopped_mid_write_leaves_the_previous_record_readable() -> None:
    buf = _buffer(make(10), make(11))  # seq 2 (n=11) in slot 0, seq 1 (n=10) in slot 1
    assert read_record(bytes(buf)).started_ns == 12
    # the third write (slot 1) stops after seq_begin and half of the payload
    base = 16 + pr.SLOT_SIZE
    pr.SEQ.pack_into(buf, base + pr.SEQ_BEGIN_AT, 3)
    half = pr.PAYLOAD.pack(3, *make(12).values())[: pr.PAYLOAD.size // 2]
    buf[base + pr.PAYLOAD_AT : base + pr.PAYLOAD_AT + len(half)] = half
    assert pr.read_slot(bytes(buf), 1) is None
    newest = read_record(bytes(buf))
    assert newest.seq == 2 and consistent(newest) and newest.started_ns == 12


@pytest.mark.parametrize("where", ["end", "payload", "crc", "begin"])
def test_any_inconsistency_in_a_slot_rejects_it(where: str) -> None:
    buf = _buffer(make(20), make(21))
    base = 16  # slot 0 holds seq 2
    offset = {
        "end": pr.SEQ_END_AT,
        "payload": pr.PAYLOAD_AT + 40,
        "crc": pr.CRC_AT,
        "begin": pr.SEQ_BEGIN_AT,
    }[where]
    buf[base + offset] ^= 0x01
    assert pr.read_slot(bytes(buf), 0) is None
    assert read_record(bytes(buf)).seq == 1  # the other slot's record, intact


def test_a_payload_of_another_write_with_matching_counters_is_rejected() -> None:
    buf = _buffer(make(30), make(31), make(32))  # slot 1: seq 3, slot 0: seq 2
    base0, base1 = 16, 16 + pr.SLOT_SIZE
    buf[base0 + pr.PAYLOAD_AT : base0 + pr.SEQ_BEGIN_AT] = buf[
        base1 + pr.PAYLOAD_AT : base1 + pr.SEQ_BEGIN_AT
    ]  # slot 0's counters say 2, its payload (and crc) are seq 3's
    assert pr.read_slot(bytes(buf), 0) is None


def test_readers_racing_a_writer_in_threads_never_see_a_mixed_record(tmp_path: Path) -> None:
    path = tmp_path / "rank-00000.progress"
    writer = RecordWriter(path)
    writer.write(make(1).values())
    done = threading.Event()
    seen: list[int] = []
    bad: list[Record] = []

    def write() -> None:
        try:
            for n in range(2, 40_000):
                writer.write(make(n).values())
        finally:
            done.set()

    def read() -> None:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            while not done.is_set():
                record = read_record(buf)
                seen.append(record.seq)
                if not consistent(record):
                    bad.append(record)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave the threads between every few bytecodes
    try:
        threads = [threading.Thread(target=write), threading.Thread(target=read)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(switch)
        done.set()
    writer.close()
    assert not bad, bad[:2]
    assert len(set(seen)) > 10  # the reader really raced the writer
    assert seen == sorted(seen)  # and never went back to an older record


WRITER = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_progress_record import make
from rtj_shim.wire.progress_record import RecordWriter
writer = RecordWriter(Path({path!r}), reuse=True)
print("ready", flush=True)
for n in range(2, 300_000):
    writer.write(make(n).values())
"""


def test_a_reader_racing_a_writer_process_never_sees_a_mixed_record(tmp_path: Path) -> None:
    path = tmp_path / "rank-00000.progress"
    first = RecordWriter(path)
    first.write(make(1).values())
    first.close()
    code = WRITER.format(tests=str(Path(__file__).parent), path=str(path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        seen: set[int] = set()
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            while proc.poll() is None:
                record = read_record(buf)
                assert consistent(record), record
                seen.add(record.seq)
        assert proc.wait(timeout=120) == 0
        assert len(seen) > 10
        assert consistent(read_file(path)) and read_file(path).started_ns == 300_000
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
