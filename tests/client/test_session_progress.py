"""Positions read off the record iterators: LoadedChunk.cut on a real file, and PositionTracker."""

from __future__ import annotations

import operator
import zlib
from pathlib import Path

import pytest
from helpers.datasets import write_records

from chunkmaster.client.progress import PositionTracker
from chunkmaster.core.model import Chunk, Position, Task, TaskMeta
from chunkmaster.formats.recordio import ChunkReader
from chunkmaster.recordio import Compressor
from chunkmaster.recordio.errors import RecordIOError
from chunkmaster.recordio.header import HEADER_SIZE
from chunkmaster.recordio.index import load_index


def _chunks(path: Path) -> list[Chunk]:
    index = load_index(str(path))
    return [
        Chunk(str(path), o, n)
        for o, n in zip(index.chunk_offsets, index.chunk_records, strict=True)
    ]


def test_a_cut_yields_its_records_and_its_ends_say_how_many_are_left(tmp_path: Path) -> None:
    for compressor in (Compressor.NONE, Compressor.SNAPPY):
        records = [b"%03d" % i * (i % 5) for i in range(40)]  # empty records among them
        path = write_records(
            tmp_path / f"c{compressor}.rio", records, max_chunk_size=10**6, compressor=compressor
        )
        (chunk,) = _chunks(path)
        loaded = ChunkReader().load(chunk.path, chunk.offset, chunk.num_records)
        for a, b in [(0, 40), (0, 1), (3, 17), (39, 40), (12, 12)]:
            it, ends = loaded.cut(a, b)
            assert operator.length_hint(ends) == b - a
            got = []
            for taken, record in enumerate(it, 1):
                got.append(record)
                assert operator.length_hint(ends) == b - a - taken
            assert got == records[a:b]


def _task(tid: int, sizes: list[int], start: int = 0, epoch: int = 1) -> Task:
    chunks = tuple(Chunk("f", i, n) for i, n in enumerate(sizes))
    return Task(TaskMeta(tid, epoch), chunks, 0, start)


def test_positions_come_from_the_run_iterators_and_count_from_the_task_start() -> None:
    p = PositionTracker(report_every=4)
    t = _task(7, [5, 5], start=3)
    p.add(t)
    assert p.held_positions() == [Position(7, 1, 0, 3)]
    assert p.report() == []  # nothing read past the dispatch's start
    ends = iter([10, 20])
    assert not p.run_started(t, 3, 2, ends)
    next(ends)
    assert p.held_positions() == [Position(7, 1, 0, 4)]
    next(ends)
    ends2 = iter([1, 2, 3, 4, 5])
    assert not p.run_started(t, 5, 5, ends2)  # 2 consumed since the last report
    for _ in range(3):
        next(ends2)
    assert p.report() == [Position(7, 1, 0, 8)]
    assert p.report() == []  # unchanged since
    assert p.to_commit() == [Position(7, 1, 0, 8)]
    p.committed([Position(7, 1, 0, 8)])
    assert p.to_commit() == []
    next(ends2)
    ends3 = iter([9])
    assert not p.run_started(t, 9, 1, ends3)  # 1 record since the report
    p.finished(t)
    assert p.held_positions() == []
    assert p.to_commit() == [Position(7, 1, 0, 10)]
    p.committed(p.to_commit())
    assert p.to_commit() == []


def test_a_report_is_due_after_report_every_records() -> None:
    p = PositionTracker(report_every=3)
    t = _task(1, [100])
    p.add(t)
    due = []
    first = 0
    for _ in range(6):
        ends = iter(range(2))
        due.append(p.run_started(t, first, 2, ends))
        next(ends), next(ends)
        first += 2
    assert due == [False, False, True, True, True, True]  # never reported yet
    p.report()
    assert not p.run_started(t, first, 2, iter(range(2)))


def test_an_abandoned_run_keeps_its_exact_position_and_goodbye_lists_every_held_task() -> None:
    p = PositionTracker(report_every=0)
    a, b = _task(1, [10]), _task(2, [10], start=4)
    p.add(a)
    p.add(b)
    ends = iter(range(10))
    p.run_started(a, 0, 10, ends)
    for _ in range(6):
        next(ends)
    p.stop_reading()
    next(ends)  # taken after the pass was left: not counted
    assert p.held_positions() == [Position(1, 1, 0, 6), Position(2, 1, 0, 4)]
    assert p.to_commit() == [Position(1, 1, 0, 6)]
    p.dropped(a)  # failed: no longer this trainer's
    assert p.held_positions() == [Position(2, 1, 0, 4)]


def test_without_sessions_finished_tasks_are_not_kept() -> None:
    p = PositionTracker(report_every=0, keep_finished=False)
    t = _task(1, [1])
    p.add(t)
    p.run_started(t, 0, 1, iter([1]))
    p.finished(t)
    assert p.to_commit() == []


def test_large_records_are_read_each_into_bytes_of_their_own(tmp_path: Path) -> None:
    """Records of 4 KiB and more are each read into their own bytes (no chunk buffer): a
    record stays whole after the chunks after it are read, and a cut's ends count as before."""
    records = [bytes([i]) * (5000 + 997 * i) for i in range(12)]
    path = write_records(
        tmp_path / "large.rio", records, max_chunk_size=40_000, compressor=Compressor.NONE
    )
    reader = ChunkReader()
    got: list[bytes] = []
    for chunk in _chunks(path):
        loaded = reader.load(chunk.path, chunk.offset, chunk.num_records)
        it, ends = loaded.cut(1, loaded.count)
        assert operator.length_hint(ends) == loaded.count - 1
        first = next(loaded.cut(0, 1)[0])
        got += [first, *it]
        assert operator.length_hint(ends) == 0
    assert len(_chunks(path)) > 2
    assert got == records  # the first chunks' records, after the last chunk was read
    assert all(type(r) is bytes for r in got)


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        ("payload", "ChecksumError"),  # a flipped bit in a record
        ("length", "RecordOverrunError"),  # a record's length past the chunk's end
        ("truncate", "TruncatedChunkError"),  # the file ends inside the chunk
    ],
)
def test_a_damaged_chunk_of_large_records_names_its_file_and_chunk(
    tmp_path: Path, damage: str, error: str
) -> None:
    records = [bytes([i]) * 6000 for i in range(5)]
    path = write_records(
        tmp_path / "d.rio", records, max_chunk_size=10**6, compressor=Compressor.NONE
    )
    (chunk,) = _chunks(path)
    data = bytearray(path.read_bytes())
    payload = chunk.offset + HEADER_SIZE
    if damage == "payload":
        data[payload + 4 + 6000 + 4 + 100] ^= 1
    elif damage == "length":  # the second record's length ~8 MB, under a CRC that holds
        data[payload + 4 + 6000 + 2] = 0x7F
        end = payload + int.from_bytes(data[chunk.offset + 12 : chunk.offset + 16], "little")
        crc = zlib.crc32(data[payload:end])
        data[chunk.offset + 4 : chunk.offset + 8] = crc.to_bytes(4, "little")
    else:
        del data[-3000:]
    path.write_bytes(bytes(data))
    with pytest.raises(RecordIOError) as info:
        ChunkReader().load(str(path), chunk.offset, chunk.num_records)
    assert type(info.value).__name__ == error
    assert str(path) in str(info.value) and "chunk 0" in str(info.value)
