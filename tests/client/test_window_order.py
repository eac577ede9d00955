"""A job's record shuffle seen by a real client over gRPC (an in-process master): the same
seed and window give the same record order on a rerun, pass by pass; another seed, another
pass or no window give others; every record once a pass, through a commit and a restore."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster

from chunkmaster.client import Client
from chunkmaster.recordio import load_index
from chunkmaster.store.sqlite import SqliteStore

N = 600


def one_pass(data: str, pass_id: int, **shuffle: int) -> list[bytes]:
    """The records of pass `pass_id` in the order one client reads them."""
    with InProcessMaster(chunks_per_task=4, **shuffle) as m, Client(m.addr) as c:
        c.set_dataset([data])
        for p in range(pass_id):
            assert len(list(c.records(p))) == N
        return list(c.records(pass_id))


def test_the_same_seed_and_window_read_the_same_order_on_a_rerun(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "d.rio", N, max_chunk_size=60)
    task = 4 * load_index(data).chunk_records[0]  # records a task (4 chunks)
    a = one_pass(data, 0, shuffle_seed=5, shuffle_window=16)
    assert a == one_pass(data, 0, shuffle_seed=5, shuffle_window=16)
    assert sorted(a) == [b"%06d" % i for i in range(N)]
    assert a != one_pass(data, 0, shuffle_seed=6, shuffle_window=16)
    assert a != one_pass(data, 1, shuffle_seed=5, shuffle_window=16)
    seeded = one_pass(data, 0, shuffle_seed=5)
    assert a != seeded
    for i in range(0, N, task):  # the same tasks, each read in another order
        assert sorted(a[i : i + task]) == sorted(seeded[i : i + task])
    consecutive = sum(int(y) == int(x) + 1 for x, y in pairwise(a))
    assert consecutive < N // 10  # file order within a chunk would give most of them


def test_a_commit_then_a_restore_reads_the_rest_of_the_order_once(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "d.rio", N, max_chunk_size=60)
    shuffle = {"shuffle_seed": 5, "shuffle_window": 16}
    with (
        InProcessMaster(SqliteStore(str(tmp_path / "a.db")), chunks_per_task=4, **shuffle) as m,
        Client(m.addr) as c,
    ):
        c.set_dataset([data])
        c.start_get_records(0)
        taken = [c.next_record() for _ in range(250)]
        c.commit()
        checkpoint = c.data_checkpoint()
    with InProcessMaster(SqliteStore(str(tmp_path / "b.db")), chunks_per_task=4, **shuffle) as m:
        assert m.service is not None
        service = m.service
        m.call(lambda: service.restore(checkpoint))
        with Client(m.addr) as c:
            rest = list(c.records(0))
    assert sorted(taken + rest) == [b"%06d" % i for i in range(N)]
