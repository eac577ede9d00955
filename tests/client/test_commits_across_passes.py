"""A commit covers everything the trainer consumed before it, in every pass (issue 18, 1).

A trainer reads pass 0 to its end without committing, then reads into pass 1 and commits there.
The same task IDs come back in pass 1: the commit must still carry each task of pass 0 (they are
owed by pass, not by task ID), so a data checkpoint taken then restores to pass 1, with exactly
the records of pass 1 not yet taken left to deliver.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster

from chunkmaster.client import Reading
from chunkmaster.client.client import Client
from chunkmaster.client.errors import EndOfPass
from chunkmaster.core.errors import PassOverError
from chunkmaster.store.sqlite import SqliteStore

RECORDS = 60  # one record a chunk, 6 chunks a task: 10 tasks


def test_a_commit_in_pass_1_also_commits_what_pass_0_consumed(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "d.rio", RECORDS)
    store = SqliteStore(str(tmp_path / "a.db"))
    with (
        InProcessMaster(store, chunks_per_task=6) as m,
        Client(m.addr, reading=Reading(prefetch_tasks=0)) as c,
    ):
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
        st = m.status_view()
        assert st.cur_pass == 1, "pass 0 was consumed whole and committed: not again"
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


def test_asking_for_a_pass_that_is_over_names_the_current_pass(tmp_path: Path) -> None:
    """Issue 18, 3: records(p) of a pass that was over before this trainer took part in it is
    an error naming the master's pass, not an empty pass. A trainer that read the pass before
    and finds this one over (the others were faster) gets an empty pass, with a warning."""
    data = numbered_records(tmp_path / "d.rio", 12)
    with InProcessMaster(chunks_per_task=6) as m:
        with Client(m.addr) as fast:
            fast.set_dataset([data])
            for p in range(4):
                assert len(list(fast.records(p))) == 12
        with Client(m.addr) as late:
            with pytest.raises(PassOverError, match=r"pass 3 is over; the master is in pass 4"):
                list(late.records(3))
            assert len(list(late.records(4))) == 12  # the current pass: read as usual
            with Client(m.addr) as other:
                assert len(list(other.records(5))) == 12  # pass 5, while `late` is elsewhere
            assert list(late.records(5)) == []  # `late` read pass 4: pass 5 is simply over


def test_a_pass_left_early_hands_its_tasks_back_at_once(tmp_path: Path) -> None:
    """Leaving a pass hands the tasks it held back at their exact positions (a Return), so
    another trainer (or this one, asking again) reads the rest at once, not after the task
    timeout (20 minutes here)."""
    data = numbered_records(tmp_path / "d.rio", 60)
    with (
        InProcessMaster(chunks_per_task=6) as m,
        Client(m.addr, reading=Reading(prefetch_tasks=3)) as first,
    ):
        first.set_dataset([data])
        first.start_get_records(0)
        got = [first.next_record() for _ in range(9)]  # task 0 whole, 3 records of task 1
        first.start_get_records(1)  # leaves pass 0 while holding tasks: they go back now
        with Client(m.addr) as second:
            rest = list(second.records(0))
        assert sorted(got + rest) == [b"%06d" % i for i in range(60)]
        assert m.status_view().cur_pass == 1
