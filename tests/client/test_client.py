"""The Client against a real master over real gRPC (in-process), on real RecordIO files."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import checksum_broken
from helpers.inproc import InProcessMaster
from helpers.reading import rest_of_pass
from helpers.threads import SeenPerPass, run_in_threads
from helpers.trainers import digest_of, sample_records
from helpers.waits import wait_for

from chunkmaster.client import Client, ClientClosedError, EndOfPass, TaskReadError
from chunkmaster.core.errors import (
    AllTaskFailedError,
    DatasetError,
    NoDatasetError,
    TrainerIdEmptyError,
)
from chunkmaster.core.model import Task
from chunkmaster.recordio import Compressor, load_index


def _client_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("chunkmaster-")]


def _wait_status(m: InProcessMaster, pred: Any, timeout: float = 20.0) -> dict[str, Any]:
    """Poll the master's status until `pred(status)` holds; that status."""
    st: dict[str, Any] = {}

    def holds() -> bool:
        st.update(m.status())
        return bool(pred(st))

    wait_for(
        holds, "the master's status to satisfy the condition", timeout, explain=lambda: f": {st}"
    )
    return st


@pytest.mark.parametrize("compressor", [Compressor.NONE, Compressor.SNAPPY, Compressor.GZIP])
def test_binary_and_empty_records_survive(rio: Any, compressor: Compressor) -> None:
    records = [*sample_records(300), b"", b"\x00", b"\x00" * 1000, bytes(range(256)) * 300]
    path = rio("bin.rio", records, max_chunk_size=500, compressor=compressor)
    with InProcessMaster(chunks_per_task=3, timeout_dur=30.0) as m, Client(m.addr) as c:
        c.set_dataset([path])
        assert Counter(c.records(0)) == Counter(records)  # the Pythonic way
        c.start_get_records(1)
        assert Counter(rest_of_pass(c)) == Counter(records)  # the original's way
        with pytest.raises(EndOfPass):  # and it stays ended
            c.next_record()
    assert _client_threads() == []


def test_finish_is_reported_when_the_last_record_is_taken(rio: Any) -> None:
    """D10: the whole task sits in the buffer, yet the master hears of it only at the take."""
    path = rio("one.rio", [b"a", b"b", b"c"], max_chunk_size=1 << 20)  # one chunk, one task
    finished: list[Task] = []
    with (
        InProcessMaster(chunks_per_task=1, timeout_dur=30.0) as m,
        Client(m.addr, on_task_done=finished.append) as c,
    ):
        c.set_dataset([path])
        c.start_get_records(0)
        assert c.next_record() == b"a"
        assert c.next_record() == b"b"
        st = m.status_view()
        assert (st.pending, st.done, st.cur_pass) == (1, 0, 0)
        assert finished == []
        assert c.next_record() == b"c"
        assert [t.meta.id for t in finished] == [0]
        _wait_status(m, lambda s: s["cur_pass"] == 1)
        with pytest.raises(EndOfPass):
            c.next_record()


def test_t4_four_clients_buffer_one_ten_passes(rio: Any) -> None:
    """The original's TestNextRecord, strict: per pass the union is exactly {0..49}, once each."""
    path = rio("t4.rio", [bytes([i]) for i in range(50)], max_chunk_size=1)
    assert load_index(path).num_chunks == 50
    seen = SeenPerPass()

    def trainer(addr: str) -> None:
        with Client(addr) as c:
            c.set_dataset([path])
            for p in range(10):
                c.start_get_records(p)
                mine: set[int] = set()
                while True:
                    try:
                        r = c.next_record(timeout=60)
                    except EndOfPass:
                        break
                    assert len(r) == 1 and r[0] not in mine
                    mine.add(r[0])
                seen.add(p, mine)

    with InProcessMaster(chunks_per_task=1, timeout_dur=60.0, failure_max=1) as m:
        run_in_threads(lambda: trainer(m.addr), 4)
        seen.assert_each_once(10, range(50))
        assert m.status_view().cur_pass == 10


def test_next_record_from_many_threads_hands_each_record_once(rio: Any) -> None:
    records = [i.to_bytes(4, "big") for i in range(5000)]
    path = rio("many.rio", records, max_chunk_size=2000, compressor=Compressor.NONE)
    got: list[list[bytes]] = [[] for _ in range(6)]
    with InProcessMaster(chunks_per_task=2, timeout_dur=30.0) as m, Client(m.addr) as c:
        c.set_dataset([path])
        for p in range(2):
            c.start_get_records(p)
            threads = [
                threading.Thread(target=lambda i=i: got[i].extend(rest_of_pass(c)))
                for i in range(6)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            together = [r for g in got for r in g]
            assert sorted(together) == records, f"pass {p}"
            for g in got:
                g.clear()


def test_abandoned_pass_never_mixes_into_the_next(rio: Any) -> None:
    """D19: A leaves pass 0 half-way; its buffered records must not show up in its pass 1."""
    records = sample_records(400, "r")
    path = rio("mix.rio", records, max_chunk_size=200)
    with (
        # A timeout short enough that a task A did not hand back would show in failed_tasks,
        # long enough that a loaded machine does not time out a task A or B is reading.
        InProcessMaster(chunks_per_task=1, timeout_dur=5.0, failure_max=5) as m,
        Client(m.addr) as a,
        Client(m.addr) as b,
    ):
        a.set_dataset([path])
        it = a.records(0)
        early = [next(it) for _ in range(5)]
        assert len(early) == 5
        it.close()  # leaving the loop early abandons pass 0 for A: it hands its tasks back
        b_pass0 = list(b.records(0))  # B finishes pass 0, A's tasks from where A stopped
        a.start_get_records(1)
        with ThreadResult(lambda: rest_of_pass(a)) as a_pass1:
            b_pass1 = list(b.records(1))
        assert digest_of(a_pass1.value + b_pass1) == digest_of(records)
        assert digest_of(early + b_pass0) == digest_of(records)  # each record once
        st = m.status()
        assert st["failed_tasks"] == []  # handed back at once: no timeout
    assert _client_threads() == []


class ThreadResult:
    """Run fn in a thread for the duration of a with block; `.value` afterwards."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> ThreadResult:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(60)
        if self.error is not None:
            raise self.error


def test_close_mid_pass_stops_every_thread(rio: Any) -> None:
    path = rio("close.rio", sample_records(500), max_chunk_size=100)
    with InProcessMaster(chunks_per_task=1, timeout_dur=30.0) as m:
        c = Client(m.addr)
        c.set_dataset([path])
        c.start_get_records(0)
        c.next_record()
        c.close()
        assert _client_threads() == []
        with pytest.raises(ClientClosedError):
            c.next_record()
        with pytest.raises(ClientClosedError):
            c.set_dataset([path])
        c.close()  # idempotent


def test_corrupt_chunk_is_raised_and_reported_with_its_reason(tmp_path: Path) -> None:
    path, records, bad_records, bad_offset = checksum_broken(tmp_path / "bad.rio")

    with (
        InProcessMaster(chunks_per_task=1, timeout_dur=30.0, failure_max=0) as m,
        Client(m.addr) as c,
    ):
        c.set_dataset([path])
        c.start_get_records(0)
        got: list[bytes] = []
        errors: list[TaskReadError] = []
        while True:
            try:
                got.append(c.next_record(timeout=30))
            except TaskReadError as exc:
                errors.append(exc)
            except (EndOfPass, AllTaskFailedError):
                break
        assert len(errors) == 1
        err = errors[0]
        assert err.chunk.offset == bad_offset and err.chunk.path == path
        assert f"offset {bad_offset}" in str(err) and path in str(err)
        assert "Checksum" in str(err)
        assert Counter(got) == Counter(r for r in records if r not in bad_records)
        st = _wait_status(m, lambda s: s["tasks_with_failures"] == 1)
        (failed,) = st["failed_tasks"]
        assert failed["id"] == errors[0].task.meta.id
        (reason,) = failed["reasons"]
        assert path in reason["reason"] and f"offset {bad_offset}" in reason["reason"]
        assert "ChecksumError" in reason["reason"]


def test_missing_file_is_raised_not_skipped(rio: Any) -> None:
    """D8: the original skipped an unopenable chunk and still reported the task finished."""
    path = rio("gone.rio", sample_records(40), max_chunk_size=1 << 20)
    with (
        InProcessMaster(
            chunks_per_task=1, timeout_dur=30.0, failure_max=0, failed_policy="keep"
        ) as m,
        Client(m.addr) as c,
    ):
        c.set_dataset([path])
        Path(path).unlink()
        with pytest.raises(TaskReadError, match="FileNotFoundError"):
            list(c.records(0))
        st = _wait_status(m, lambda s: s["tasks_with_failures"] == 1)
        assert "FileNotFoundError" in st["failed_tasks"][0]["reasons"][0]["reason"]
        # Every task has now failed: that is a job-level error, not a quiet end of pass.
        with pytest.raises(AllTaskFailedError):
            list(c.records(1))


def test_dataset_and_trainer_id_errors_are_raised(rio: Any, tmp_path: Path) -> None:
    with InProcessMaster() as m, Client(m.addr) as c:
        with pytest.raises(NoDatasetError):
            c.set_dataset([])
        with pytest.raises(DatasetError, match="no valid dataset"):
            c.set_dataset([str(tmp_path / "nothing-*.rio")])
        with pytest.raises(TrainerIdEmptyError):
            c.request_save_model("", 1.0)
        assert c.request_save_model("a", 30.0)
        assert not c.request_save_model("b", 30.0)
        assert c.request_save_model("a", 30.0)


def test_next_record_timeout_and_no_pass(rio: Any) -> None:
    path = rio("t.rio", [b"x"], max_chunk_size=1)
    with InProcessMaster() as m, Client(m.addr) as c:
        with pytest.raises(RuntimeError, match="start_get_records"):
            c.next_record()
        c.set_dataset([path])
        c.start_get_records(5)  # the master is in pass 0: nothing to read yet
        with pytest.raises(TimeoutError):
            c.next_record(timeout=0.2)
