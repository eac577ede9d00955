"""A commit covers everything the trainer consumed before it, in every pass (issue 18, 1).

A trainer reads pass 0 to its end without committing, then reads into pass 1 and commits there.
The same task IDs come back in pass 1: the commit must still carry each task of pass 0 (they are
owed by pass, not by task ID), so a data checkpoint taken then restores to pass 1, with exactly
the records of pass 1 not yet taken left to deliver.
"""

from __future__ import annotations

from pathlib import Path

from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster

from chunkmaster.client.client import Client
from chunkmaster.client.errors import EndOfPass
from chunkmaster.store.sqlite import SqliteStore

RECORDS = 60  # one record a chunk, 6 chunks a task: 10 tasks


def test_a_commit_in_pass_1_also_commits_what_pass_0_consumed(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "d.rio", RECORDS)
    with InProcessMaster(SqliteStore(str(tmp_path / "a.db")), chunks_per_task=6) as m:
        with Client(m.addr, prefetch_tasks=0) as c:
            c.set_dataset([data])
            assert len(list(c.records(0))) == RECORDS  # no commit in pass 0
            c.start_get_records(1)
            taken = {c.next_record() for _ in range(25)}  # tasks 0..3 done again, 4 begun
            c.commit()
            blob = c.data_checkpoint()
    with InProcessMaster(SqliteStore(str(tmp_path / "b.db")), chunks_per_task=6) as m:
        assert m.service is not None
        service = m.service
        m.call(lambda: service.restore(blob))
        st = m.status()
        assert st["cur_pass"] == 1, "pass 0 was consumed whole and committed: not again"
        with Client(m.addr) as c:
            c.start_get_records(1)
            rest = []
            while True:
                try:
                    rest.append(c.next_record())
                except EndOfPass:
                    break
    everything = {b"%06d" % i for i in range(RECORDS)}
    assert sorted(rest) == sorted(everything - taken)
