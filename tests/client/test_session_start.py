"""A task handed out again resumes at Task.start: whole chunks before it are not read (here
they are damaged: reading one would fail), the first records of the chunk it starts in are
dropped, and positions count from the task's first record. With a session and without."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from helpers.datasets import write_records
from helpers.inproc import InProcessMaster
from helpers.raw_session import RawSession, position
from helpers.reading import rest_of_pass

from chunkmaster.client import Client
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.checkpoint import decode

N = 120


def _hand_back_at(addr: str, skip_chunks: int, extra: int) -> tuple[int, str]:
    """Take the first task in a raw session and hand it back at `skip_chunks` whole chunks
    plus `extra` records; damage the chunks skipped. Returns (start, path)."""
    s = RawSession(addr)
    try:
        assert s.hello().WhichOneof("body") == "welcome"
        s.send(next={"want_task": True, "pass_id": 0, "wait_seconds": 5, "request_id": "r1"})
        task = s.recv().task
        assert task.meta.id == 0 and task.start == 0
        chunks = list(task.chunks)
        start = sum(c.num_records for c in chunks[:skip_chunks]) + extra
        s.send(goodbye={"progress": [position(task, start)]})
        assert s.recv().ack.applied == 1
    finally:
        s.close()
    path = chunks[0].path
    indexed = os.stat(path)
    with open(path, "r+b") as f:  # a byte of each skipped chunk's payload: unreadable now
        for after in chunks[1 : skip_chunks + 1]:
            f.seek(after.offset - 1)
            byte = f.read(1)
            f.seek(after.offset - 1)
            f.write(bytes([byte[0] ^ 0xFF]))
    # the file's time as indexed: a reader that read those chunks would fail on their checksum,
    # not on the file having changed (which it would check first)
    os.utime(path, ns=(indexed.st_atime_ns, indexed.st_mtime_ns))
    return start, path


@pytest.mark.parametrize("session", [True, False])
def test_a_task_resumes_at_its_start_without_reading_the_chunks_before(
    tmp_path: Path, session: bool
) -> None:
    records = [b"%06d" % i for i in range(N)]
    path = write_records(tmp_path / "d.rio", records, max_chunk_size=40)
    with InProcessMaster(chunks_per_task=4, timeout_dur=60.0) as m:
        with MasterConnection(m.addr) as conn:
            conn.set_dataset([str(path)])
        start, _ = _hand_back_at(m.addr, skip_chunks=2, extra=2)
        with Client(m.addr, session=session) as c:
            c.start_get_records(0)
            first = [c.next_record(timeout=30), c.next_record(timeout=30)]
            assert first == records[start : start + 2]  # the task handed back comes first
            if session:
                c.commit()  # the position counts from the task's first record
                committed = m.status_view().ledger[0].committed
                assert committed == start + 2
                assert decode(c.data_checkpoint()).passes[0].partial == {0: start + 2}
            rest = rest_of_pass(c)
        got = Counter(first + rest)
        assert got == Counter(records[start:]), "each record after the start exactly once"


def test_a_task_handed_back_at_its_end_is_finished_without_reading(tmp_path: Path) -> None:
    records = [b"%06d" % i for i in range(40)]
    path = write_records(tmp_path / "d.rio", records, max_chunk_size=40)
    with InProcessMaster(chunks_per_task=100, timeout_dur=60.0) as m:
        with MasterConnection(m.addr) as conn:
            conn.set_dataset([str(path)])
        s = RawSession(m.addr)
        try:
            s.hello()
            s.send(next={"want_task": True, "pass_id": 0, "wait_seconds": 5, "request_id": "r"})
            task = s.recv().task
            s.send(goodbye={"progress": [position(task, len(records))]})
            assert s.recv().ack.applied == 1
        finally:
            s.close()
        with Client(m.addr) as c:
            assert list(c.records(0)) == []
            assert m.status_view().cur_pass == 1
