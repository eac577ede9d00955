"""A DataLoader worker asks for its next task while it reads the end of the one it holds
(readers.ASK_AHEAD), so that it does not wait for the answer; the records and marks it sends
are the same."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers.datasets import write_records

from chunkmaster.client.files import OpenFiles
from chunkmaster.client.options import Reading
from chunkmaster.core.model import Chunk, Task, TaskMeta
from chunkmaster.recordio import Compressor
from chunkmaster.recordio.index import load_index
from chunkmaster.torch.batches import Batch, Loose
from chunkmaster.torch.readers import ASK_AHEAD, Readers


class ScriptedEnd:
    """A worker's channel end that hands out `tasks` and logs the worker's calls."""

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = list(tasks)
        self.log: list[str] = []

    def open(self) -> None:
        self.log.append("open")

    def ask(self) -> None:
        self.log.append("ask")

    def receive(self) -> Task | None:
        self.log.append("receive")
        return self.tasks.pop(0) if self.tasks else None


def _tasks(path: Path, per_task: int) -> list[Task]:
    index = load_index(str(path))
    chunks = [
        Chunk(str(path), o, n)
        for o, n in zip(index.chunk_offsets, index.chunk_records, strict=True)
    ]
    return [
        Task(TaskMeta(i, 1), tuple(chunks[i * per_task : (i + 1) * per_task]))
        for i in range(len(chunks) // per_task)
    ]


def test_a_worker_asks_for_its_next_task_before_the_last_batches_of_its_task(
    tmp_path: Path,
) -> None:
    records = [i.to_bytes(8, "big") * 4 for i in range(400)]  # 32 bytes: 10 a chunk
    path = write_records(
        tmp_path / "a.rio", records, max_chunk_size=320, compressor=Compressor.NONE
    )
    tasks = _tasks(path, 10)  # 4 tasks of 100 records, in chunks of 10
    batch = 8  # the next task is asked for with 2 batches (16 records) of a task to go
    assert ASK_AHEAD == 2
    readers = Readers(
        transform=None, batch_size=batch, collate=list, columns=None, reading=Reading()
    )
    end = ScriptedEnd(tasks)
    got: list[bytes] = []
    marks = []
    asked = []  # the requests made when each item was sent
    for item in readers._read(end, OpenFiles()):
        assert isinstance(item, Batch | Loose)
        got += item.data if isinstance(item, Batch) else item.samples
        marks.append(item.marks if isinstance(item, Batch) else None)
        asked.append(end.log.count("ask"))
    assert got == records  # the same records, in order, in the same batches
    assert marks[12] == (((0, 0, 1), 100), ((0, 1, 1), 4))
    assert end.log[:3] == ["open", "ask", "receive"]
    assert end.log.count("ask") == end.log.count("receive") == len(tasks) + 1
    # Batch 10 (records 80..87) holds record 84, the first of task 0's last 16: the request
    # for task 1 went before it was cut; batch 9 (72..79) was sent before.
    assert asked[9] == 1
    assert asked[10] == 2


def test_a_task_of_one_chunk_asks_for_the_next_before_its_last_batches(tmp_path: Path) -> None:
    """Where one chunk holds the whole task (the writer's default chunks of large records),
    the request still goes with two batches of it to go, not once it is all read."""
    records = [i.to_bytes(8, "big") * 4 for i in range(300)]  # 100 a chunk
    path = write_records(
        tmp_path / "a.rio", records, max_chunk_size=3200, compressor=Compressor.NONE
    )
    tasks = _tasks(path, 1)  # 3 tasks of one chunk of 100 records
    readers = Readers(transform=None, batch_size=8, collate=list, columns=None, reading=Reading())
    end = ScriptedEnd(tasks)
    got: list[bytes] = []
    asked = []
    for item in readers._read(end, OpenFiles()):
        assert isinstance(item, Batch | Loose)
        got += item.data if isinstance(item, Batch) else item.samples
        asked.append(end.log.count("ask"))
    assert got == records
    assert end.log.count("ask") == end.log.count("receive") == len(tasks) + 1
    # Batch 10 (records 80..87) holds record 84, the first of the last 16 of task 0: asked
    # for task 1 before it was cut; batch 9 (72..79) was sent before.
    assert asked[9] == 1
    assert asked[10] == 2
