"""The original's test scenarios (section 13), in their strict form, over real gRPC."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.datasets import write_records
from helpers.inproc import InProcessMaster
from helpers.status_view import status_view
from helpers.threads import SeenPerPass, run_in_threads

from chunkmaster import NoMoreAvailableError, PassBeforeError, TaskMeta
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.dataset import Dataset, count_tasks
from chunkmaster.recordio import Index, Writer, scan


@pytest.mark.parametrize(
    ("chunks", "cpt", "tasks"), [(100, 5, 20), (101, 5, 21), (101, 1, 101), (101, 0, 101)]
)
def test_t1_partition_count(chunks: int, cpt: int, tasks: int) -> None:
    ds = Dataset.build(["g"], ["f"], [(list(range(chunks)), [0] * chunks)], cpt)
    assert ds.num_tasks == tasks == count_tasks(chunks, cpt)


def test_t2_partition_ids_and_order() -> None:
    ds = Dataset.build(["g"], ["f"], [(list(range(100)), [1] * 100)], 20)
    assert ds.num_tasks == 5
    groups = [ds.task_chunks(t) for t in range(ds.num_tasks)]
    assert [len(g) for g in groups] == [20] * 5
    assert [c.offset for g in groups for c in g] == list(range(100))  # chunk order kept


def _two_hundred_single_record_chunks(path: Path) -> None:
    """As the original: a new writer appends one empty record 200 times, forcing 200 chunks."""
    for _ in range(200):
        with open(path, "ab") as f, Writer(f) as w:
            w.write(b"")


def test_t3_get_finish_fail_over_ten_passes(tmp_path: Path) -> None:
    path = tmp_path / "t3.rio"
    _two_hundred_single_record_chunks(path)
    with (
        InProcessMaster(chunks_per_task=10, timeout_dur=1.0, failure_max=1) as m,
        MasterConnection(m.addr) as c,
    ):
        c.set_dataset([str(path)])
        for p in range(10):
            tasks = [c.get_task(p) for _ in range(20)]
            assert len({t.meta.id for t in tasks}) == 20
            with pytest.raises(NoMoreAvailableError, match="^no more available task$"):
                c.get_task(p)
            first = tasks[0]
            assert c.task_finished(first.meta.id, epoch=first.meta.epoch, pass_id=p)
            assert not c.task_failed(first.meta, "late failure of a finished task")
            with pytest.raises(NoMoreAvailableError):
                c.get_task(p)
            for t in tasks[1:]:
                assert c.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=p)
            assert status_view(c.status()).cur_pass == p + 1
            with pytest.raises(PassBeforeError, match="^pass number smaller than master"):
                c.get_task(p)
        st = status_view(c.status())
        assert st.cur_pass == 10 and st.todo == 20 and st.failed == 0


def test_t4_concurrent_clients_each_record_once_per_pass(tmp_path: Path) -> None:
    path = tmp_path / "t4.rio"
    write_records(path, [bytes([i]) for i in range(50)])
    seen = SeenPerPass()

    def trainer(addr: str) -> None:
        with MasterConnection(addr) as c:
            c.set_dataset([str(path)])
            for p in range(10):
                mine: list[int] = []
                while True:
                    try:
                        task = c.get_task(p, wait=30.0)
                    except PassBeforeError:
                        break
                    for ch in task.chunks:
                        for rec in scan(ch.path, Index([ch.offset], [ch.num_records])):
                            assert len(rec) == 1
                            mine.append(rec[0])
                    c.task_finished(task.meta.id, epoch=task.meta.epoch, pass_id=p)
                assert len(mine) == len(set(mine))
                seen.add(p, mine)

    with InProcessMaster(chunks_per_task=1, timeout_dur=60.0, failure_max=1) as m:
        run_in_threads(lambda: trainer(m.addr), 4)
        seen.assert_each_once(10, range(50))
        assert m.status_view().cur_pass == 10


def test_failed_report_with_reason_over_grpc(tmp_path: Path) -> None:
    path = tmp_path / "one.rio"
    write_records(path, [b"a"])
    with InProcessMaster(chunks_per_task=1, timeout_dur=60.0, failure_max=0) as m:
        with MasterConnection(m.addr) as c:
            c.set_dataset([str(path)])
            t = c.get_task(0)
            assert c.task_failed(t.meta, "cannot open /x: permission denied")
            assert not c.task_failed(TaskMeta(99, 1), "unknown task")  # answered, no error
            assert not c.task_finished(99)
            st = c.status()
        assert st["cur_pass"] == 1 and st["failed"] == 0  # retry policy: back for pass 1
        (ft,) = st["failed_tasks"]
        assert ft["reasons"][0]["reason"] == "cannot open /x: permission denied"


def test_standard_health_service_reports_serving() -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with InProcessMaster() as m, grpc.insecure_channel(m.addr) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for name in ("", "chunkmaster.v1.Master"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_get_task_retried_after_a_lost_answer_gets_the_same_task(tmp_path: Path) -> None:
    """The store stalls (another process holds the SQLite lock), so the master answers after
    the caller's deadline: the caller sees a transport error and retries with the same ID."""
    import sqlite3

    from chunkmaster import SqliteStore
    from chunkmaster.client.connection import TransportError

    path = tmp_path / "d.rio"
    write_records(path, [b"%d" % i for i in range(3)])
    db = tmp_path / "state.db"
    store = SqliteStore(db, busy_timeout=30.0)
    with InProcessMaster(store, chunks_per_task=1, timeout_dur=600.0) as m:
        with MasterConnection(m.addr, timeout=0.5) as c:
            c.set_dataset([str(path)])
            blocker = sqlite3.connect(db, isolation_level=None)
            blocker.execute("BEGIN EXCLUSIVE")
            try:
                with pytest.raises(TransportError, match="DEADLINE_EXCEEDED"):
                    c.get_task(0, worker="w", request_id="attempt-1")
            finally:
                blocker.execute("ROLLBACK")
                blocker.close()
        with MasterConnection(m.addr, timeout=30.0) as c:
            again = c.get_task(0, worker="w", request_id="attempt-1")
            st = c.status()
        assert st["pending"] == 1  # one task held, not one stranded plus one new
        assert st["pending_tasks"][0]["id"] == again.meta.id
