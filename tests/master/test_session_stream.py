"""The master's side of trainer sessions, spoken raw over a real gRPC stream."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.aio import until
from helpers.datasets import ten_record_chunks
from helpers.inproc import InProcessMaster
from helpers.raw_session import RawSession, position
from helpers.sqlite_lock import next_write_held
from helpers.waits import wait_for

from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.store.sqlite import SqliteStore

RECORDS_PER_TASK = 10


@pytest.fixture
def dataset(tmp_path: Path) -> str:
    return ten_record_chunks(tmp_path / "d.rio")


@pytest.fixture
def master(dataset: str) -> Iterator[InProcessMaster]:
    with InProcessMaster(chunks_per_task=1, trainer_ttl=30.0) as m:
        assert m.service is not None
        service = m.service
        m.call(lambda: service.set_dataset([dataset]))
        yield m


def next_task(s: RawSession, pass_id: int = 0, finished: list[Any] | None = None) -> Any:
    seq = s.send(
        next=pb.NextTask(finished=finished or [], want_task=True, pass_id=pass_id, wait_seconds=5)
    )
    resp = s.recv()
    assert resp.seq == seq
    assert resp.WhichOneof("body") == "task", resp
    return resp.task


def test_a_session_gets_tasks_and_a_finish_travels_with_the_next_request(
    master: InProcessMaster,
) -> None:
    s = RawSession(master.addr)
    welcome = s.hello(name="alice")
    assert welcome.welcome.session_id
    assert welcome.welcome.ttl_seconds == 30.0
    t1 = next_task(s)
    assert t1.start == 0
    t2 = next_task(s, finished=[position(t1, RECORDS_PER_TASK)])
    assert t2.meta.id != t1.meta.id
    st = master.status()
    assert st["done"] == 1 and st["pending"] == 1
    (trainer,) = st["trainers"]
    assert trainer["name"] == "alice" and trainer["tasks_held"] == 1
    assert trainer["records_consumed"] == RECORDS_PER_TASK
    s.close()


def test_progress_moves_the_position_a_task_is_handed_out_again_at(
    master: InProcessMaster,
) -> None:
    a = RawSession(master.addr)
    a.hello(name="a")
    t = next_task(a)
    a.send(keep_alive=pb.KeepAlive(progress=[position(t, 7)]))
    wait_for(lambda: master.status_view().trainers[0].records_consumed == 7, "progress")
    seq = a.send(goodbye=pb.Goodbye(progress=[position(t, 8)]))
    resp = a.recv()
    assert resp.seq == seq and resp.ack.applied == 1  # one task handed back
    a.close()
    b = RawSession(master.addr)
    b.hello(name="b")
    again = next_task(b)
    assert again.meta.id == t.meta.id  # first in line
    assert again.start == 8
    led = master.status()["ledger"][-1]
    assert led["consumed"] == 8
    assert led["redispatched"] == {}  # a goodbye says exactly where it stopped
    b.close()


def test_a_silent_trainer_loses_its_session_and_its_tasks_go_back(dataset: str) -> None:
    with InProcessMaster(chunks_per_task=1, trainer_ttl=0.5, timeout_dur=3600) as m:
        assert m.service is not None
        service = m.service
        m.call(lambda: service.set_dataset([dataset]))
        a = RawSession(m.addr)
        sid = a.hello(name="a").welcome.session_id
        t = next_task(a)
        a.send(keep_alive=pb.KeepAlive(progress=[position(t, 3)]))
        wait_for(lambda: m.status_view().ledger[-1].consumed == 3, "progress")
        a.close()  # silent from now on
        wait_for(lambda: m.status_view().sessions == 0, "the lease to run out")
        st = m.status()
        assert st["pending"] == 0 and st["todo"] == 4
        # The task it was reading counts a failure (docs/failures.md), and says so when it is
        # handed out again.
        assert st["tasks_with_failures"] == 1
        assert st["ledger"][-1]["redispatched"] == {"trainer lost": RECORDS_PER_TASK - 3}
        b = RawSession(m.addr)
        resp = b.hello(session_id=sid)
        assert resp.error.error == "SessionExpiredError"
        b.hello(name="b")
        again = next_task(b)
        assert (again.meta.id, again.start, again.failures) == (t.meta.id, 3, 1)
        b.close()


def test_commit_is_acknowledged_and_counted(master: InProcessMaster) -> None:
    s = RawSession(master.addr)
    s.hello()
    t = next_task(s)
    seq = s.send(commit=pb.Commit(positions=[position(t, 4)]))
    resp = s.recv()
    assert resp.seq == seq and resp.ack.applied == 1
    assert master.status_view().ledger[-1].committed == 4
    bad = position(t, 4)
    bad.epoch = 99
    seq = s.send(commit=pb.Commit(positions=[bad]))
    resp = s.recv()
    assert resp.seq == seq and resp.error.error == "CheckpointRefusedError"
    assert "epoch 99" in resp.error.message
    s.close()


def test_messages_before_hello_and_malformed_bytes_are_refused(master: InProcessMaster) -> None:
    s = RawSession(master.addr)
    s.send(keep_alive=pb.KeepAlive())
    resp = s.recv()
    assert resp.error.error == "InvalidArgumentError"
    s.send_raw(b"\xff\xff\xff")
    resp = s.recv()
    assert resp.error.error == "InvalidArgumentError"
    assert s.recv() is None  # the master ends the stream
    s.close()
    assert master.status_view().sessions == 0


def next_batch(s: RawSession, count: int, request_id: str, pass_id: int = 0) -> Any:
    msg = pb.NextTask(
        want_task=True, pass_id=pass_id, wait_seconds=5, request_id=request_id, max_tasks=count
    )
    seq = s.send(next=msg)
    resp = s.recv()
    assert resp.seq == seq
    return resp


def test_a_batch_holds_the_tasks_free_at_once_and_a_repeat_gets_the_same_ones(
    master: InProcessMaster,
) -> None:
    s = RawSession(master.addr)
    s.hello(name="batcher")
    first = next_batch(s, 3, "r1")
    assert first.WhichOneof("body") == "tasks"
    ids = [t.meta.id for t in first.tasks.tasks]
    assert len(set(ids)) == 3
    again = next_batch(s, 3, "r1")  # its answer was lost, say: the same tasks come back
    assert [t.meta.id for t in again.tasks.tasks] == ids
    st = master.status_view()
    assert st.pending == 3 and st.todo == 1
    assert st.trainers[0].tasks_held == 3
    rest = next_batch(s, 3, "r2")  # one left: a batch of one, at once
    (last,) = rest.tasks.tasks
    assert last.meta.id not in ids
    held = [*first.tasks.tasks, last]
    seq = s.send(next=pb.NextTask(finished=[position(t, RECORDS_PER_TASK) for t in held]))
    assert s.recv().seq == seq
    wait_for(lambda: master.status_view().cur_pass == 1, "the pass to end")
    late = next_batch(s, 3, "r3")  # pass 0 is over: the same error as a single request
    assert late.error.error == "PassBeforeError"
    whole = next_batch(s, 100, "r4", pass_id=1)
    assert sorted(t.meta.id for t in whole.tasks.tasks) == sorted(t.meta.id for t in held)
    s.close()


def test_a_batch_is_durable_before_it_is_answered(dataset: str, tmp_path: Path) -> None:
    db = str(tmp_path / "store.db")
    with InProcessMaster(SqliteStore(db), chunks_per_task=1, trainer_ttl=30.0) as m:
        assert m.service is not None
        service = m.service
        m.call(lambda: service.set_dataset([dataset]))
        s = RawSession(m.addr)
        sid = s.hello(name="a").welcome.session_id
        got = [t.meta.id for t in next_batch(s, 2, "req").tasks.tasks]
        s.close()
    with InProcessMaster(SqliteStore(db), chunks_per_task=1, trainer_ttl=30.0) as m:
        st = m.status_view()
        assert st.pending == 2 and st.todo == 2
        s = RawSession(m.addr)
        assert s.hello(session_id=sid).welcome.session_id == sid
        again = next_batch(s, 2, "req")  # the retry after a restart: the same two tasks
        assert [t.meta.id for t in again.tasks.tasks] == got
        s.close()


def test_a_session_whose_trainer_leaves_while_it_is_written_still_expires(
    tmp_path: Path,
) -> None:
    """A trainer that exits right after its Hello (a refused set_dataset, say) cancels the
    opening while the OpenSession write is in flight. The session is in the state from the
    moment it is applied, so its lease must be too: before, it was granted after the write,
    and such a session never ended (it counted as a live trainer for ever)."""
    import asyncio

    from chunkmaster.master.service import Service

    async def main() -> None:
        store = SqliteStore(tmp_path / "s.db", busy_timeout=60.0)
        svc = Service(store, timeout_dur=60, trainer_ttl=0.3)
        await svc.start()
        try:
            with next_write_held(tmp_path / "s.db"):
                opening = asyncio.ensure_future(svc.open_session("", "t", "h", 1, 0))
                await until(lambda: len(svc.ledger.state.sessions) == 1, "the opening applied")
                assert not opening.done()  # its write in flight
                opening.cancel()
            deadline = time.monotonic() + 30
            while svc.ledger.state.sessions:
                assert time.monotonic() < deadline, "the session never ended: it had no lease"
                await asyncio.sleep(0.05)
        finally:
            await svc.close()

    asyncio.run(main())


def test_a_session_reports_only_its_own_tasks_without_tls_too(master: InProcessMaster) -> None:
    """No TLS, so no identities: still, a report of session b on a task session a holds is
    refused (PERMISSION_DENIED), whatever its epoch, and changes nothing."""
    a, b = RawSession(master.addr), RawSession(master.addr)
    a.hello(name="a")
    b.hello(name="b")
    t = next_task(a)
    end = position(t, RECORDS_PER_TASK)
    older = pb.TaskPosition(task_id=t.meta.id, epoch=0, pass_id=0, records=RECORDS_PER_TASK)
    for body in (
        {"next": pb.NextTask(finished=[end])},
        {"next": pb.NextTask(finished=[older], want_task=True, pass_id=0, wait_seconds=1)},
        {"failed": pb.TaskFailedRequest(meta=t.meta, reason="not mine")},
        {"keep_alive": pb.KeepAlive(progress=[position(t, 5)])},
        {"commit": pb.Commit(positions=[position(t, 5)])},
    ):
        seq = b.send(**body)
        resp = b.recv()
        assert resp.seq == seq and resp.error.error == "PermissionDeniedError", (body, resp)
        assert f"task {t.meta.id}" in resp.error.message
    st = master.status()
    assert st["pending"] == 1 and st["done"] == 0 and st["tasks_with_failures"] == 0, st
    held = {x["name"]: (x["tasks_held"], x["records_consumed"]) for x in st["trainers"]}
    assert held == {"a": (1, 0), "b": (0, 0)}
    assert st["ledger"][-1]["consumed"] == 0 and st["ledger"][-1]["committed"] == 0
    a.send(next=pb.NextTask(finished=[end]))
    assert a.recv().ack.applied == 1  # its holder's finish is applied
    a.close()
    b.close()
