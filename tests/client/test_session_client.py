"""The client's session against a real master: finishes riding on task requests, progress,
commit, data checkpoints, Goodbye handing tasks back at their exact position, a master
restarted under the trainer (the session resumes) and one that forgot it (a new session)."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import write_records
from helpers.inproc import InProcessMaster
from helpers.master_process import MasterProcess
from helpers.reading import rest_of_pass
from helpers.status_view import status_view
from helpers.waits import wait_for

from chunkmaster.client import Client, Connection, Reading, Session
from chunkmaster.client.connection import MasterConnection
from chunkmaster.client.outbox import Outbox
from chunkmaster.client.session import TrainerSession
from chunkmaster.core.checkpoint import decode


def _dataset(tmp_path: Path, n: int, chunk: int = 40) -> tuple[str, list[bytes]]:
    records = [b"%06d" % i for i in range(n)]
    return str(write_records(tmp_path / "d.rio", records, max_chunk_size=chunk)), records


def _read_in_session(c: Client, path: str, n: int) -> list[bytes]:
    """Set the dataset and read `n` records of pass 0; return once the session is open."""
    c.set_dataset([path])
    c.start_get_records(0)
    got = [c.next_record(timeout=30) for _ in range(n)]
    wait_for(lambda: bool(c.session_id), "the session to open")
    return got


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every (kind, message) the client's sessions send, in order."""
    out: list[tuple[str, Any]] = []
    real_send = Outbox.send

    def spy(self: Outbox, kind: str, msg: Any, answered: bool, now: float) -> Any:
        out.append((kind, msg))
        return real_send(self, kind, msg, answered, now)

    monkeypatch.setattr(Outbox, "send", spy)
    return out


def test_finishes_ride_on_task_requests_and_the_ledger_counts_every_record(
    tmp_path: Path, sent: list[tuple[str, Any]]
) -> None:
    path, records = _dataset(tmp_path, 300)
    with InProcessMaster(chunks_per_task=2, timeout_dur=60.0) as m:
        # Holding one task at a time, the trainer asks for the next one only after it took the
        # last record of the one it holds: the finish is queued by then and rides along
        # (unless the machine stalls the fetcher past FINISH_FLUSH: then it goes alone).
        with Client(
            m.addr, name="alice", session=Session(report_every=7), reading=Reading(prefetch_tasks=0)
        ) as c:
            c.set_dataset([path])
            assert Counter(c.records(0)) == Counter(records)
            st = m.status()
            assert [t["name"] for t in st["trainers"]] == ["alice"]
            assert st["cur_pass"] == 1
            led = st["ledger"][0]
            assert led["dispatched"] == led["consumed"] == len(records)
        assert status_view(m.status()).sessions == 0  # Goodbye ended it
    nexts = [msg for kind, msg in sent if kind == "next"]
    riding = [msg for msg in nexts if msg.want_task and msg.finished]
    finished = [f.task_id for msg in nexts for f in msg.finished]
    rode = sum(len(msg.finished) for msg in riding)
    assert rode >= len(finished) // 2, f"only {rode} of {len(finished)} finishes rode on requests"
    assert sorted(finished) == sorted(set(finished))  # each task finished once
    assert len(set(finished)) == m_tasks(path)


def test_a_trainer_that_prefetches_gets_its_tasks_several_to_a_message(
    tmp_path: Path, sent: list[tuple[str, Any]]
) -> None:
    path, records = _dataset(tmp_path, 600)
    tasks = m_tasks(path, 1)
    with (
        InProcessMaster(chunks_per_task=1, timeout_dur=60.0) as m,
        Client(m.addr, name="bulk", reading=Reading(prefetch_tasks=7)) as c,
    ):
        c.set_dataset([path])
        for p in (0, 1):
            assert Counter(c.records(p)) == Counter(records)
            led = m.status()["ledger"][p]
            assert led["dispatched"] == led["consumed"] == len(records)
    asks = [msg for kind, msg in sent if kind == "next" and msg.want_task]
    assert all(msg.max_tasks >= 4 for msg in asks), [msg.max_tasks for msg in asks]
    assert len(asks) <= 2 * tasks // 4 + 4, f"{len(asks)} requests for {2 * tasks} tasks"


def m_tasks(path: str, chunks_per_task: int = 2) -> int:
    from chunkmaster.master.indexing import load_dataset

    return len(load_dataset([path], chunks_per_task).task_records)


def test_progress_commit_checkpoint_and_goodbye_are_at_exact_positions(tmp_path: Path) -> None:
    path, records = _dataset(tmp_path, 200)
    with InProcessMaster(chunks_per_task=1000, timeout_dur=600.0) as m:  # one task
        with Client(m.addr, session=Session(report_every=5, report_interval=60.0)) as a:
            a.set_dataset([path])
            a.start_get_records(0)
            got = [a.next_record(timeout=30) for _ in range(12)]
            assert got == records[:12]

            def consumed() -> int:
                return int(status_view(m.status()).trainers[0].records_consumed)

            # A run boundary every 5 records: 10 records since the last report wake the sender.
            wait_for(lambda: consumed() >= 10, "progress to reach the master")
            a.commit()
            assert status_view(m.status()).ledger[0].committed == 12
            assert decode(a.data_checkpoint()).passes[0].partial == {0: 12}
            a.commit()  # nothing new: returns at once
            assert a.next_record(timeout=30) == records[12]
        # close() said Goodbye with the exact position: 13 records taken
        assert status_view(m.status()).sessions == 0
        with Client(m.addr) as b:
            b.start_get_records(0)
            assert Counter(rest_of_pass(b)) == Counter(records[13:])
        led = m.status()["ledger"][0]
        assert led["redispatched"] == {}  # handed back exactly: nothing may come twice


def test_commit_needs_a_session(tmp_path: Path) -> None:
    with InProcessMaster() as m, Client(m.addr, session=False) as c:
        with pytest.raises(RuntimeError, match="session"):
            c.commit()
        assert c.session_id is None


def test_a_master_restarted_under_the_trainer_resumes_its_session(tmp_path: Path) -> None:
    path, records = _dataset(tmp_path, 300)
    master = MasterProcess(
        ["--store", str(tmp_path / "s.db"), "--chunk-per-task", "2", "--task-timeout-dur", "10m"],
        log_path=tmp_path / "m.log",
    ).start()
    try:
        with Client(
            master.addr, session=Session(report_every=3), connection=Connection(rpc_timeout=5.0)
        ) as c:
            got = _read_in_session(c, path, 20)
            sid = c.session_id
            master.restart()
            got += rest_of_pass(c)
            assert c.session_id == sid
            assert set(got) == set(records)
            with MasterConnection(master.addr) as conn:
                st = conn.status()
            assert st["cur_pass"] == 1
            assert [t["session"] for t in st["trainers"]] == [sid]
    finally:
        master.kill()


def test_a_session_the_master_forgot_is_replaced_by_a_new_one(tmp_path: Path) -> None:
    path, records = _dataset(tmp_path, 200)
    args = ["--chunk-per-task", "2", "--task-timeout-dur", "10m"]
    first = MasterProcess([*args, "--store", str(tmp_path / "a.db")]).start()
    port = int(str(first.addr).rsplit(":", 1)[1])
    second = MasterProcess([*args, "--store", str(tmp_path / "b.db")], port=port)
    try:
        with Client(first.addr, connection=Connection(rpc_timeout=5.0)) as c:
            got = _read_in_session(c, path, 10)
            old = c.session_id
            first.kill()
            second.start()  # a fresh store: it never heard of that session
            with MasterConnection(second.addr, timeout=30) as conn:
                conn.set_dataset([path])
            got += rest_of_pass(c)
            assert c.session_id not in ("", old)
            assert set(got) == set(records)
    finally:
        first.kill()
        second.kill()


def test_goodbye_hands_back_tasks_held_but_not_read(tmp_path: Path) -> None:
    path, _ = _dataset(tmp_path, 100)
    with InProcessMaster(chunks_per_task=2, timeout_dur=600.0) as m:
        with Client(m.addr, reading=Reading(prefetch_tasks=2)) as a:
            a.set_dataset([path])
            a.start_get_records(0)
            a.next_record(timeout=30)
            wait_for(lambda: status_view(m.status()).pending == 3, "the prefetched tasks")
        st = status_view(m.status())
        assert st.pending == 0 and st.sessions == 0


def _in_request_iterator(frame: Any) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name == "requests" and code.co_filename.endswith("client/stream.py"):
            return True
        frame = frame.f_back
    return False


def test_a_stream_that_ends_leaves_no_grpc_thread_inside_it(tmp_path: Path) -> None:
    """gRPC sends a stream's requests from a daemon thread iterating ours; one left there at
    interpreter exit can hang the process in the call's finalizer, so a stream that ends (here
    the master goes away) ends the iteration too, without waiting for close()."""
    path, records = _dataset(tmp_path, 100)

    def stuck() -> list[str]:
        frames = sys._current_frames()
        return [t.name for t in threading.enumerate() if _in_request_iterator(frames.get(t.ident))]

    with InProcessMaster(chunks_per_task=2, timeout_dur=60.0) as m:
        c = Client(m.addr, name="left")
        c.set_dataset([path])
        assert Counter(c.records(0)) == Counter(records)
        assert stuck(), "the session's stream is open: gRPC's sending thread is in it"
    try:
        wait_for(lambda: not stuck(), "gRPC's sending thread to leave the ended stream", 10)
    finally:
        c.close()


def test_before_reading_a_task_that_failed_the_master_has_every_earlier_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task with failures comes with `failures`; the trainer has its earlier finishes applied
    before it reads it, so that if it dies there the master charges that task and not one
    finished a moment before (docs/failures.md). Finishes otherwise wait up to FINISH_FLUSH
    for a request to ride on: made long here, so only the settle can bring them."""
    import chunkmaster.client.finishes as finishes_module

    monkeypatch.setattr(finishes_module, "FINISH_FLUSH", 600.0)
    path, records = _dataset(tmp_path, 50, chunk=6)  # 50 tasks of one record each
    with InProcessMaster(chunks_per_task=1, timeout_dur=600.0, failure_max=5) as m:
        finished: list[int] = []
        with MasterConnection(m.addr) as unary:
            unary.set_dataset([path])
            suspect = unary.get_task(0)
            assert unary.task_failed(suspect.meta, "flaky")  # to the back, with a failure
        done = finished.append
        with Client(
            m.addr, on_task_done=lambda t: done(t.meta.id), reading=Reading(prefetch_tasks=3)
        ) as c:
            c.start_get_records(0)
            got = []
            while True:
                record = c.next_record(timeout=60)
                if record == records[suspect.meta.id]:
                    break  # the suspect's first record: everything before it is applied
                got.append(record)
            # (its one record is its last too: the client has just taken it as finished)
            assert finished[-1] == suspect.meta.id and len(got) == 49
            assert status_view(m.status()).done == len(finished) - 1 == 49, status_view(
                m.status()
            ).done


def test_finishes_refused_together_for_one_taken_task_are_each_judged_alone(
    tmp_path: Path, sent: list[tuple[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer finishes task 0, whose dispatch timed out and went to another session, and
    task 1, still its own, in one message: the master refuses the message whole (task 0 is
    another's), so each finish goes again alone and task 1's is applied, not dropped with it
    (before, a message that asked for no task was refused for good, both finishes lost)."""
    from helpers.raw_session import RawSession

    # Finishes go out only when settle() sends them: both in one message.
    import chunkmaster.client.finishes as finishes_module
    from chunkmaster.client.link import CancelToken, MasterLink
    from chunkmaster.rpc import master_pb2 as pb

    monkeypatch.setattr(finishes_module, "FINISH_FLUSH", 600.0)
    data, _ = _dataset(tmp_path, 40, chunk=200)  # 2 tasks of 1 chunk each
    with InProcessMaster(chunks_per_task=1, timeout_dur=5.0, trainer_ttl=300.0) as m:
        assert m.service is not None
        service = m.service
        m.call(lambda: service.set_dataset([data]))
        assert status_view(m.status()).num_tasks == 2
        s = TrainerSession(
            MasterLink(m.addr),
            name="a",
            report_every=0,
            report_interval=600.0,
            progress=list,
            on_unclaimed=lambda task: None,
        )
        other = RawSession(m.addr)
        try:
            (first,) = s.next_tasks(0, 1, 5.0, "r1", CancelToken())
            wait_for(lambda: status_view(m.status()).pending == 0, "task 0's dispatch to time out")
            (second,) = s.next_tasks(0, 1, 5.0, "r2", CancelToken())
            other.hello(name="b")
            other.send(next=pb.NextTask(want_task=True, pass_id=0, wait_seconds=5))
            assert other.recv().task.meta.id == first.meta.id  # task 0 is b's now
            s.finished(first)
            s.finished(second)
            woken = threading.Event()
            reply = s.settle(woken.set)
            assert reply is not None
            wait_for(lambda: reply.done, "the answer to both finishes")
            wait_for(lambda: status_view(m.status()).done == 1, "task 1's finish to be applied")
            st = m.status()
            held = {t["name"]: t["tasks_held"] for t in st["trainers"]}
            assert st["pending"] == 1 and held == {"a": 0, "b": 1}, st
            together = [msg for kind, msg in sent if kind == "next" and len(msg.finished) == 2]
            assert len(together) == 1
        finally:
            other.close()
            s.close([], timeout=10)
            s.join(time.monotonic() + 10)
