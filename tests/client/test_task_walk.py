"""The one walker over a task's chunks (client/reading.py): where a dispatch starts and stops,
which chunk is the last, and a chunk that cannot be read. No master, no threads."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.datasets import write_records

from chunkmaster.client.errors import TaskReadError
from chunkmaster.client.reading import TaskReader
from chunkmaster.core.model import Chunk, Task, TaskMeta
from chunkmaster.formats.recordio import FORMAT as RECORDIO
from chunkmaster.formats.storage import LOCAL


def _task(path: Path, per_chunk: int, chunks: int, start: int = 0, end: int = 0) -> Task:
    """A task of `chunks` chunks of `per_chunk` records each, records numbered from 0."""
    records = [b"%03d" % i for i in range(per_chunk * chunks)]
    write_records(path, records, max_chunk_size=3 * per_chunk)
    ix = RECORDIO.index(str(path), LOCAL)
    assert list(ix.records) == [per_chunk] * chunks
    found = tuple(
        Chunk(str(path), off, n, length)
        for off, n, length in zip(ix.offsets, ix.records, ix.lengths, strict=True)
    )
    return Task(TaskMeta(1, 0), found, start=start, end=end)


def _read(task: Task) -> list[tuple[int, list[bytes]]]:
    return [(first, list(records)) for first, records, _ in TaskReader().runs(task)]


def test_a_whole_task_is_its_chunks_in_order_the_last_one_marked(tmp_path: Path) -> None:
    task = _task(tmp_path / "a.rio", 3, 3)
    spans = list(TaskReader().walk(task))
    assert [(s.first, s.start, s.stop, s.last) for s in spans] == [
        (0, 0, 3, False),
        (3, 0, 3, False),
        (6, 0, 3, True),
    ]
    assert _read(task)[2] == (6, [b"006", b"007", b"008"])


def test_a_dispatch_handed_out_again_skips_what_was_consumed(tmp_path: Path) -> None:
    task = _task(tmp_path / "a.rio", 3, 3, start=4)
    walk = TaskReader().walk(task)
    assert walk.index == 1  # the first chunk is skipped unread
    assert _read(task) == [(4, [b"004", b"005"]), (6, [b"006", b"007", b"008"])]


def test_a_piece_stops_at_its_end(tmp_path: Path) -> None:
    task = _task(tmp_path / "a.rio", 3, 2, start=1, end=5)
    spans = list(TaskReader().walk(task))
    assert [(s.first, s.start, s.stop, s.last) for s in spans] == [
        (0, 1, 3, False),
        (3, 0, 2, True),
    ]
    assert _read(task) == [(1, [b"001", b"002"]), (3, [b"003", b"004"])]


def test_a_task_read_to_its_end_walks_no_chunk(tmp_path: Path) -> None:
    task = _task(tmp_path / "a.rio", 3, 2, start=6)
    walk = TaskReader().walk(task)
    assert walk.done
    assert list(walk) == []


def test_a_chunk_that_cannot_be_read_raises_after_the_chunks_before_it(tmp_path: Path) -> None:
    task = _task(tmp_path / "a.rio", 3, 2)
    with open(task.chunks[1].path, "r+b") as f:  # damage the second chunk's payload
        f.seek(task.chunks[1].offset + task.chunks[1].length - 2)
        f.write(b"\xff\xff")
    runs = TaskReader().runs(task)
    first, records, _ = next(runs)
    assert (first, list(records)) == (0, [b"000", b"001", b"002"])
    with pytest.raises(TaskReadError):
        next(runs)
