"""The client's shuffle buffer: its bookkeeping (pure), a real client through a real master
(every record once per pass, mixed across tasks, positions never past a buffered record), and
a whole-job crash with buffered trainers that resumes from the data checkpoint exactly once."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import hypothesis.strategies as st
import pytest
from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster
from helpers.master_process import MasterProcess
from helpers.session_trainer_process import SessionTrainerProcess
from helpers.status_view import status_view
from helpers.waits import wait_for
from hypothesis import given, settings

from chunkmaster.client import Reading, Session
from chunkmaster.client.client import Client
from chunkmaster.client.connection import MasterConnection
from chunkmaster.client.shuffle_buffer import ShuffleBuffer, buffer_rng
from chunkmaster.core.checkpoint import decode
from chunkmaster.master.indexing import load_dataset


@given(st.integers(1, 30), st.lists(st.integers(0, 3), max_size=300), st.integers(0, 99))
@settings(max_examples=80, deadline=None)
def test_oldest_is_the_lowest_index_still_buffered(size: int, script: list[int], seed: int) -> None:
    buf = ShuffleBuffer(size, random.Random(seed))
    inside: dict[tuple[int, int], set[int]] = {}
    nxt = {(t, 1): 5 * t for t in range(3)}  # a dispatch may start past its first record
    for op in script:
        if op < 3 and buf.room:
            key = (op, 1)
            buf.add([b"%d" % nxt[key]], key, nxt[key])
            inside.setdefault(key, set()).add(nxt[key])
            nxt[key] += 1
        elif buf:
            record, key = buf.pop()
            inside[key].remove(int(record))
        for key in nxt:
            want = min(inside.get(key) or {-1})
            assert buf.oldest(*key) == (None if want < 0 else want)
        assert len(buf) == sum(len(v) for v in inside.values())


def test_deferred_finishes_wait_for_their_records() -> None:
    from chunkmaster.core.model import Task, TaskMeta

    buf = ShuffleBuffer(4, random.Random(1))
    task = Task(TaskMeta(7, 2), ())
    buf.add([b"a"], (7, 2), 0)
    buf.add([], (8, 1), 0)
    assert buf.oldest(8, 1) is None
    buf.defer(task)
    assert buf.releasable(None) == []
    buf.pop()
    assert buf.releasable((7, 2)) == []  # its last record is still being read
    assert buf.releasable(None) == [task] and buf.deferred == 0


def numbered(tmp_path: Path, n: int, chunk: int = 50) -> str:
    return numbered_records(tmp_path / "data.rio", n, max_chunk_size=chunk)


def test_a_pass_through_the_buffer_has_every_record_once_and_mixes_tasks(tmp_path: Path) -> None:
    data = numbered(tmp_path, 2000)
    with InProcessMaster(chunks_per_task=2) as m:
        with Client(m.addr, session=Session(report_every=7)) as plain:
            plain.set_dataset([data])
            in_order = [int(r) for r in plain.records(0)]
        with Client(
            m.addr,
            reading=Reading(shuffle_buffer=300, shuffle_seed=3),
            session=Session(report_every=7),
        ) as c:
            got = [int(r) for r in c.records(1)]
            assert status_view(m.status()).cur_pass == 2
    assert Counter(got) == Counter(range(2000))
    assert got != in_order
    displaced = sum(1 for a, b in zip(got, sorted(got), strict=True) if abs(a - b) > 20)
    assert displaced > 1000, "records barely moved: the buffer does not mix"


def test_positions_and_commits_never_pass_a_buffered_record(tmp_path: Path) -> None:
    data = numbered(tmp_path, 600)
    with (
        InProcessMaster(chunks_per_task=1) as m,
        Client(m.addr, reading=Reading(shuffle_buffer=100), session=Session(report_every=1)) as c,
    ):
        assert m.service is not None
        state = m.service.ledger.state
        c.set_dataset([data])
        assert state.dataset is not None
        starts = [0]
        for n in state.dataset.task_records:
            starts.append(starts[-1] + n)
        seen: set[int] = set()
        it = c.records(0)
        for _ in range(150):
            seen.add(int(next(it)))
            c.commit()
            for task, records in state.commits.get(0, {}).items():
                assert set(range(starts[task], starts[task] + records)) <= seen, "committed"
            for task, records in state.progress.items():
                assert set(range(starts[task], starts[task] + records)) <= seen, "reported"
        it.close()


def task_records(data: str, seed: int, pass_id: int, cpt: int) -> list[list[int]]:
    """The record numbers of each task in a pass of a seeded job (records are numbered)."""
    ds = load_dataset([data], cpt).with_shuffle(seed)
    first = [0]
    for n in ds.chunk_records:
        first.append(first[-1] + n)
    return [
        [r for c in ds.chunk_ids(t, pass_id) for r in range(first[c], first[c + 1])]
        for t in range(ds.num_tasks)
    ]


class Trainer(SessionTrainerProcess):
    def __init__(self, addr: str, out: Path, *args: str) -> None:
        super().__init__(out, "--addr", addr, *args)


def test_buffered_trainers_crash_and_resume_from_the_data_checkpoint_exactly_once(
    tmp_path: Path,
) -> None:
    """Seeded master, buffered trainers committing every few records, everything SIGKILLed after
    a data checkpoint: it commits only records the trainers were handed, and a master restored
    from it delivers exactly the rest of the pass."""
    records, seed, cpt = 1500, 21, 2
    data = numbered(tmp_path, records)
    flags = ["--chunk-per-task", str(cpt), "--shuffle-seed", str(seed)]
    m = MasterProcess([*flags, "--store", str(tmp_path / "a.db")]).start()
    trainers: list[Trainer] = []
    ckpt = tmp_path / "job.ckpt"
    try:
        with MasterConnection(str(m.addr), timeout=60) as conn:
            conn.set_dataset([data])
        common = ["--passes", "1", "--commit-every", "9", "--step-time", "0.002"]
        common += ["--shuffle-buffer", "60", "--report-every", "5"]
        trainers = [Trainer(str(m.addr), tmp_path / f"a{i}.out", *common) for i in range(2)]
        wait_for(
            lambda: all(len(t.records(0)) >= 150 for t in trainers), "the trainers to read", 120
        )
        with MasterConnection(str(m.addr), timeout=60) as conn:
            ckpt.write_bytes(conn.data_checkpoint())
    finally:
        for t in trainers:
            t.kill()
        m.kill()
    cp = decode(ckpt.read_bytes())
    assert cp.shuffle_seed == seed and cp.floor == 0
    layout = task_records(data, seed, 0, cpt)
    committed: set[int] = set()
    for p in cp.passes:
        for t in p.full:
            committed.update(layout[t])
        for t, n in p.partial.items():
            committed.update(layout[t][:n])
    handed = {r for t in trainers for r in t.records(0)}
    assert committed, "nothing was committed"
    assert committed <= handed, "a commit covers records no trainer was handed"

    fresh = MasterProcess([*flags, "--store", str(tmp_path / "b.db"), "--restore", str(ckpt)])
    fresh.start()
    try:
        reader = Trainer(str(fresh.addr), tmp_path / "b.out", "--passes", "1")
        assert reader.proc.wait(120) == 0, reader.log.read_text()[-3000:]
    finally:
        fresh.kill()
    got = Counter(reader.records(0))
    assert all(n == 1 for n in got.values())
    assert set(got) == set(range(records)) - committed


@pytest.mark.parametrize("bad", [-1])
def test_a_negative_buffer_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="shuffle_buffer"):
        Client("127.0.0.1:1", reading=Reading(shuffle_buffer=bad))


def test_the_draw_depends_on_seed_pass_and_trainer() -> None:
    draws = {(s, p, n): buffer_rng(s, p, n).random() for s in (1, 2) for p in (0, 1) for n in "ab"}
    assert len(set(draws.values())) == len(draws)
    assert buffer_rng(1, 0, "a").random() == draws[(1, 0, "a")]


def test_a_drawn_batch_counts_as_buffered_until_handed() -> None:
    buf = ShuffleBuffer(10, random.Random(5))
    buf.add([b"0", b"1", b"2", b"3"], (1, 1), 0)
    drawn = buf.draw(4)
    assert sorted(r for r, _, _ in drawn) == [b"0", b"1", b"2", b"3"] and len(buf) == 0
    assert buf.oldest(1, 1) == 0  # the trainer has not got them yet
    buf.handed(drawn)
    assert buf.oldest(1, 1) is None
