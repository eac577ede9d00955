"""The read-ahead's scheduling: requests in flight, the byte budget, neighbours fetched
together, errors on the chunk they belong to, cancellation. A recording Storage stands in for
the object store (the S3 tests run the real one); it holds every fetch until released."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import IO

import pytest

from chunkmaster.client.readahead import ReadAhead
from chunkmaster.core.model import Chunk, Task, TaskMeta


class HeldStorage:
    """read_ranges answers b"<path>:<offset>" padded to length, once `release` is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[int, int]]]] = []
        self.release = threading.Event()
        self.fail: set[str] = set()
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    def open(self, path: str) -> IO[bytes]:
        raise AssertionError("read-ahead reads ranges only")

    def size(self, path: str) -> int:
        raise AssertionError("read-ahead reads ranges only")

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        with self.changed:
            self.calls.append((path, list(ranges)))
            self.changed.notify_all()
        self.release.wait()
        if path in self.fail:
            raise OSError(f"{path}: access denied")
        return [f"{path}:{o}".encode().ljust(n, b".") for o, n in ranges]

    def wait_calls(self, n: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.calls) >= n, timeout=30)


def task(tid: int, chunks: list[tuple[str, int, int]], start: int = 0) -> Task:
    return Task(
        TaskMeta(tid, 0), tuple(Chunk(p, o, 10, n) for p, o, n in chunks), pass_id=0, start=start
    )


def test_in_flight_and_budget_bounds_and_every_chunk_arrives() -> None:
    storage = HeldStorage()
    ra = ReadAhead(lambda _: storage, lambda _: True, chunks=2, budget=1000)
    t = task(1, [(f"s3://b/f{i}", 0, 400) for i in range(5)])  # one file each: no groups
    ra.want(t)
    storage.wait_calls(2)
    assert len(storage.calls) == 2 and ra.held == 800  # 2 in flight; a third would pass 1000
    storage.release.set()
    for i in range(5):
        assert ra.take(t, i) == f"s3://b/f{i}:0".encode().ljust(400, b".")
    assert ra.held == 0
    ra.close()


def test_neighbouring_chunks_of_a_file_are_fetched_in_one_call() -> None:
    storage = HeldStorage()
    storage.release.set()
    ra = ReadAhead(lambda _: storage, lambda _: True, chunks=1, budget=1 << 30)
    t = task(1, [("s3://b/f", 0, 100), ("s3://b/f", 100, 100), ("s3://b/f", 300, 100),
                 ("s3://b/g", 0, 100)])  # fmt: skip
    ra.want(t)
    assert [ra.take(t, i) for i in range(4)] == [
        b"s3://b/f:0".ljust(100, b"."),
        b"s3://b/f:100".ljust(100, b"."),
        b"s3://b/f:300".ljust(100, b"."),
        b"s3://b/g:0".ljust(100, b"."),
    ]
    assert storage.calls == [
        ("s3://b/f", [(0, 100), (100, 100), (300, 100)]),
        ("s3://b/g", [(0, 100)]),
    ]
    ra.close()


def test_an_error_is_raised_for_the_chunks_it_belongs_to() -> None:
    storage = HeldStorage()
    storage.fail.add("s3://b/bad")
    storage.release.set()
    ra = ReadAhead(lambda _: storage, lambda _: True, chunks=4, budget=1 << 20)
    t = task(1, [("s3://b/ok", 0, 10), ("s3://b/bad", 0, 10), ("s3://b/ok", 10, 10)])
    ra.want(t)
    assert ra.take(t, 0) == b"s3://b/ok:0"
    with pytest.raises(OSError, match="s3://b/bad: access denied"):
        ra.take(t, 1)
    ra.drop(t)  # the buffer drops the failed task's other chunks
    assert ra.take(t, 2) is None and ra.held == 0
    ra.close()


def test_local_files_unknown_lengths_and_other_formats_are_not_fetched() -> None:
    storage = HeldStorage()
    ra = ReadAhead(lambda _: storage, lambda fmt: fmt == "recordio", chunks=4, budget=1 << 20)
    local = task(1, [("/data/f.rio", 0, 10), ("file:///data/f.rio", 10, 10), ("s3://b/f", 0, 0)])
    ra.want(local)
    columnar = Task(TaskMeta(2, 0), (Chunk("s3://b/p.parquet", 0, 10, 100),), format="parquet")
    ra.want(columnar)
    assert [ra.take(local, i) for i in range(3)] == [None, None, None]
    assert ra.take(columnar, 0) is None
    assert storage.calls == []
    ra.close()


def test_a_task_handed_out_again_is_fetched_from_its_start_and_cancel_forgets_all() -> None:
    storage = HeldStorage()
    ra = ReadAhead(lambda _: storage, lambda _: True, chunks=8, budget=1 << 20)
    t = task(1, [("s3://b/f", 0, 100), ("s3://b/g", 0, 100), ("s3://b/h", 0, 100)], start=15)
    ra.want(t)  # 10 records a chunk: record 15 is in the second chunk
    storage.wait_calls(2)
    assert [p for p, _ in storage.calls] == ["s3://b/g", "s3://b/h"]
    ra.cancel()
    assert ra.held == 0 and ra.take(t, 1) is None
    storage.release.set()
    ra.close()


def test_ready_says_when_take_would_not_wait_and_on_ready_tells_it() -> None:
    storage = HeldStorage()
    woken = threading.Event()
    ra = ReadAhead(lambda _: storage, lambda _: True, chunks=1, budget=150, on_ready=woken.set)
    t = task(1, [("s3://b/f", 0, 100), ("s3://b/g", 0, 100)])
    ra.want(t)
    storage.wait_calls(1)
    assert not ra.ready(t, 0)  # in flight
    assert ra.ready(t, 1)  # not started (no slot, no room): take would fetch it itself
    assert ra.ready(t, 5)  # never wanted
    storage.release.set()
    assert woken.wait(30)
    assert ra.ready(t, 0) and ra.take(t, 0) == b"s3://b/f:0".ljust(100, b".")
    assert ra.take(t, 1) == b"s3://b/g:0".ljust(100, b".")
    ra.close()
