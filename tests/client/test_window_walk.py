"""A task read in shuffle windows (client/reading.py WindowWalk, core/record_order.py): every
record once, the same order for every reader, and a dispatch that starts or stops anywhere
reads exactly the positions of the whole order it covers. Real RecordIO files; no master."""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from pathlib import Path

import pytest
from helpers.datasets import write_records
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkmaster.client.errors import TaskReadError
from chunkmaster.client.reading import TaskReader
from chunkmaster.core.model import Chunk, Task, TaskMeta
from chunkmaster.core.record_order import task_order_key, window_permutation
from chunkmaster.formats.recordio import FORMAT as RECORDIO
from chunkmaster.formats.storage import LOCAL


def _chunks(path: Path, per_chunk: int, chunks: int) -> tuple[Chunk, ...]:
    """A file of `chunks` chunks of `per_chunk` records b"%05d", numbered from 0."""
    records = [b"%05d" % i for i in range(per_chunk * chunks)]
    write_records(path, records, max_chunk_size=5 * per_chunk)
    ix = RECORDIO.index(str(path), LOCAL)
    assert list(ix.records) == [per_chunk] * chunks
    return tuple(
        Chunk(str(path), off, n, length)
        for off, n, length in zip(ix.offsets, ix.records, ix.lengths, strict=True)
    )


def _task(chunks: tuple[Chunk, ...], window: int, start: int = 0, end: int = 0) -> Task:
    return Task(
        TaskMeta(7, 0), chunks, pass_id=3, start=start, end=end, order_key=11,
        shuffle_window=window,
    )  # fmt: skip


def _read(task: Task) -> list[bytes]:
    """The records of the dispatch in the order read, checking each run's first position."""
    out: list[bytes] = []
    for first, records, count in TaskReader().runs(task):
        assert first == task.start + len(out)
        got = list(records)
        assert len(got) == count
        out.extend(got)
    return out


PINNED_KEY = 5065951930056289016
PINNED = [5, 3, 1, 6, 2, 4, 7, 0]


@pytest.fixture(scope="module")
def file_chunks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Chunk, ...]:
    """10 chunks of 37 records: windows fall across chunk boundaries and inside chunks."""
    return _chunks(tmp_path_factory.mktemp("w") / "a.rio", 37, 10)


def test_each_window_is_a_permutation_of_its_records(file_chunks: tuple[Chunk, ...]) -> None:
    order = _read(_task(file_chunks, 100))
    assert sorted(order) == [b"%05d" % i for i in range(370)]
    for w in range(4):  # the windows' records stay in their windows
        assert sorted(order[100 * w : 100 * w + 100]) == [
            b"%05d" % i for i in range(100 * w, min(370, 100 * w + 100))
        ]
    consecutive = sum(int(b) == int(a) + 1 for a, b in pairwise(order))
    assert consecutive < 15  # about 1 in 100 by chance; file order would give 369


def test_the_order_is_a_function_of_the_order_key(file_chunks: tuple[Chunk, ...]) -> None:
    task = _task(file_chunks, 100)
    assert _read(task) == _read(task)
    assert _read(dataclasses.replace(task, order_key=12)) != _read(task)
    # Another dispatch or a piece (another ID and epoch) with the key reads the same order.
    assert _read(dataclasses.replace(task, meta=TaskMeta(9, 5))) == _read(task)


def test_the_master_keys_a_task_by_seed_pass_and_the_datasets_task() -> None:
    key = task_order_key(5, 2, 3)
    assert key == task_order_key(5, 2, 3)
    assert (
        len({key, task_order_key(6, 2, 3), task_order_key(5, 3, 3), task_order_key(5, 2, 4)}) == 4
    )


def test_the_permutation_is_pinned() -> None:
    """A trainer of another build or Python version must read the same order."""
    assert task_order_key(1, 2, 3) == PINNED_KEY
    assert window_permutation(PINNED_KEY, 4, 8) == PINNED


def test_a_window_larger_than_the_task_shuffles_the_whole_task(
    file_chunks: tuple[Chunk, ...],
) -> None:
    order = _read(_task(file_chunks, 10_000))
    assert sorted(order) == [b"%05d" % i for i in range(370)]
    assert int(order[0]) > 0 or int(order[1]) > 1


@settings(max_examples=60, deadline=None)
@given(window=st.integers(1, 400), cut=st.integers(0, 370), end=st.integers(0, 370))
def test_any_start_and_end_read_those_positions_of_the_whole_order(
    file_chunks: tuple[Chunk, ...], window: int, cut: int, end: int
) -> None:
    """A dispatch handed out again at `cut`, or a piece [cut, end), reads exactly what the
    whole order holds at those positions: a position means the same record to every reader."""
    whole = _read(_task(file_chunks, window))
    assert _read(_task(file_chunks, window, start=cut)) == whole[cut:]
    if end > cut:
        assert _read(_task(file_chunks, window, start=cut, end=end)) == whole[cut:end]


def test_chunks_before_the_starting_window_are_not_loaded(
    file_chunks: tuple[Chunk, ...],
) -> None:
    walk = TaskReader().walk(_task(file_chunks, 50, start=160))
    assert walk.index == 4  # window 3 (records 150..199) starts in chunk 4 (148..184)
    spans = list(walk)
    assert (spans[0].first, spans[0].start, spans[0].stop) == (150, 10, 50)
    assert spans[-1].last and not any(s.last for s in spans[:-1])


def test_a_chunk_that_cannot_be_read_fails_the_task_after_the_windows_before(
    tmp_path: Path,
) -> None:
    chunks = _chunks(tmp_path / "b.rio", 20, 4)
    broken = dataclasses.replace(chunks[2], offset=chunks[2].offset + 1)
    task = _task((*chunks[:2], broken, chunks[3]), 30)
    reader = TaskReader()
    got: list[bytes] = []
    with pytest.raises(TaskReadError) as err:
        for _, records, _ in reader.runs(task):
            got.extend(records)
    assert len(got) == 30  # window 0 (records 0..29); window 1 needs the broken chunk
    assert err.value.chunk == broken


def test_record_batches_are_refused_for_a_shuffled_job(file_chunks: tuple[Chunk, ...]) -> None:
    with pytest.raises(TypeError, match="--shuffle-window"):
        TaskReader(batches=True).walk(_task(file_chunks, 100))
