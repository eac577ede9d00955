"""A store that fails its writes (a full disk, I/O errors): the master refuses changes with the
cause, says so in status, logs the cause once and then rarely, backs off, and resumes by itself
when the store works again, losing nothing acknowledged (issue 9)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers.aio import run, until
from helpers.clock import Clock
from helpers.datasets import numbered_records
from helpers.full_disk import fill
from helpers.master_process import MasterProcess
from helpers.status_view import status_view

from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import UnavailableError
from chunkmaster.core.events import Finish
from chunkmaster.master.ledger import Ledger
from chunkmaster.master.service import Service
from chunkmaster.store.base import Recovered, StoreError
from chunkmaster.store.memory import InMemStore


def finish_one(c: MasterConnection) -> int:
    t = c.get_task(0)
    assert c.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=0)
    return t.meta.id


def test_full_disk_refuses_changes_says_why_and_resumes_by_itself(
    tmp_path: Path, small_fs: Path
) -> None:
    data = numbered_records(tmp_path / "d.rio", 60, b"%03d")
    db = small_fs / "state.db"
    master = MasterProcess(["--store", str(db), "--chunk-per-task", "1"]).start()
    try:
        with MasterConnection(master.addr) as c:
            c.set_dataset([data])
            acked = {finish_one(c) for _ in range(5)}
            filler = fill(small_fs)
            with pytest.raises(UnavailableError, match="database or disk is full") as first:
                for _ in range(50):  # the WAL may have room for a few more frames
                    acked.add(finish_one(c))
            assert str(db) in str(first.value)
            st = status_view(c.status())
            assert st.healthy is False and st.store.healthy is False
            assert "database or disk is full" in st.store.error
            assert "bytes free on its filesystem" in st.store.error
            for _ in range(200):  # refused at once, with the cause, without touching the disk
                with pytest.raises(UnavailableError, match="database or disk is full"):
                    c.get_task(0)
            st = status_view(c.status())
            assert st.store.failed_attempts < 20
            failures = [ln for ln in master.log().splitlines() if "ERROR chunkmaster.ledger" in ln]
            assert 1 <= len(failures) <= 3, failures
            assert "database or disk is full" in failures[0]
            filler.unlink()
            assert master.wait_log("store is writable again", timeout=30)
            assert status_view(c.status()).healthy is True
            acked |= {finish_one(c) for _ in range(3)}
            assert status_view(c.status()).done == len(acked)
        master.kill()
        master.start()
        with MasterConnection(master.addr) as c:
            assert status_view(c.status()).done == len(acked)
    finally:
        master.kill()


class FlakyStore:
    """Wraps a store; while `failing` is set its writes raise like a full disk does."""

    def __init__(self) -> None:
        self.inner = InMemStore()
        self.failing: str | None = None
        self.attempts = 0

    async def load(self) -> Recovered:
        return await self.inner.load()

    async def save(self, entries: Sequence[tuple[int, bytes]]) -> None:
        self.attempts += 1
        if self.failing is not None:
            raise StoreError(self.failing)
        await self.inner.save(entries)

    async def compact(self, snapshot: bytes, seq: int) -> None:
        await self.inner.compact(snapshot, seq)

    async def shutdown(self) -> None:
        await self.inner.shutdown()

    def describe(self) -> str:
        return "flaky store"


def test_failing_writes_back_off_log_rarely_and_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The same rules on any store (etcd's writes fail through the same ledger path)."""
    data = numbered_records(tmp_path / "d.rio", 10, b"%03d")
    store = FlakyStore()

    async def main() -> None:
        svc = Service(store, chunks_per_task=1, timeout_dur=600)
        await svc.start()
        await svc.set_dataset([data])
        t = await svc.get_task(0)
        assert await svc.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=0)
        store.failing = "disk I/O error on /dev/fake"
        with pytest.raises(UnavailableError, match="disk I/O error on /dev/fake"):
            await svc.get_task(0)
        attempts = store.attempts
        for _ in range(500):
            with pytest.raises(UnavailableError, match="disk I/O error on /dev/fake"):
                await svc.get_task(0)
        assert store.attempts - attempts <= 2  # refused changes never reach the store
        st = svc.status_view()
        assert not st.healthy and st.store.error == "disk I/O error on /dev/fake"
        assert st.pending == 0 and st.done == 1  # rebuilt: the failed dispatch is gone
        while svc.status_view().store.failed_attempts < 4:  # a few backed-off retries
            await asyncio.sleep(0.05)
        store.failing = None
        while not svc.status_view().healthy:
            await asyncio.sleep(0.05)
        t2 = await svc.get_task(0)
        assert await svc.task_finished(t2.meta.id, epoch=t2.meta.epoch, pass_id=0)
        await svc.close()
        rebuilt = Service(store, chunks_per_task=1, timeout_dur=600)
        await rebuilt.start()
        assert rebuilt.status_view().done == 2
        await rebuilt.close()

    with caplog.at_level(logging.INFO, logger="chunkmaster.ledger"):
        run(main(), timeout=60)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "disk I/O error on /dev/fake" in errors[0].getMessage()
    assert any("store is writable again" in r.getMessage() for r in caplog.records)


def test_backoff_doubles_up_to_its_cap(caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore()

    async def main() -> None:
        ledger = Ledger(store, retry_first=0.01, retry_max=0.08, log_every=0)
        await ledger.recover()
        store.failing = "no space left"
        with pytest.raises(UnavailableError, match="no space left"):
            await ledger.commit(Finish(0, 0, 0))
        while ledger.outage.attempts < 7:
            await asyncio.sleep(0.01)
        with pytest.raises(UnavailableError, match="no space left; retrying in"):
            await ledger.commit(Finish(0, 0, 0))
        await ledger.close()

    with caplog.at_level(logging.ERROR, logger="chunkmaster.ledger"):
        run(main())
    delays = [r.args[3] for r in caplog.records if "still failing" in r.getMessage()]
    assert isinstance(delays[0], float)
    assert delays[:6] == [0.02, 0.04, 0.08, 0.08, 0.08, 0.08]


def test_a_store_outage_does_not_count_against_task_deadlines(tmp_path: Path) -> None:
    """While the store refuses writes no trainer can report its task finished: when it works
    again every pending task has a full timeout, instead of expiring under a live trainer."""
    data = numbered_records(tmp_path / "d.rio", 4, b"%03d")
    store = FlakyStore()
    clock = Clock(1_000_000.0)  # a store outage of an hour, at once

    async def main() -> None:
        svc = Service(store, chunks_per_task=1, timeout_dur=60, clock=clock)
        await svc.start()
        await svc.set_dataset([data])
        held = await svc.get_task(0)
        store.failing = "No space left on device"
        with pytest.raises(UnavailableError):
            await svc.get_task(0)
        clock.now += 3600.0  # the store refused writes for an hour
        while svc.status_view().store.failed_attempts < 2:
            await asyncio.sleep(0.02)
        store.failing = None
        while not svc.status_view().healthy:
            await asyncio.sleep(0.02)
        # The timer looked at the deadlines on the clock's time: one on the old would fire.
        await until(lambda: clock.idle_timers() == 1, "the timer to wait on the clock")
        st = svc.status()
        assert st["pending"] == 1 and st["failed"] == 0, st
        (pending,) = st["pending_tasks"]
        assert pending["id"] == held.meta.id
        assert pending["expires_in"] == pytest.approx(60.0)
        assert await svc.task_finished(held.meta.id, epoch=held.meta.epoch, pass_id=0)
        await svc.close()

    run(main(), timeout=60)
