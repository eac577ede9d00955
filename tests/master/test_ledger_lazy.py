"""Events nobody waits for (progress reports) do not cost a store write each: they go with the
next write somebody waits for, or after the ledger's lazy delay; and what is acknowledged as
durable still is, on a real SQLite store reopened as a restarted master reopens it
(docs/sessions.md, "A progress report is acknowledged before it is durable")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from helpers.aio import run, still_waiting

from chunkmaster.core.events import Configure
from chunkmaster.core.model import FailedPolicy
from chunkmaster.master.ledger import Ledger, LedgerSubscriber
from chunkmaster.store.sqlite import SqliteStore

HOUR = 3600.0  # a lazy delay no test waits out: only a write somebody waits for may flush


class Writes(LedgerSubscriber):
    """Calls `then` with each batch the ledger writes."""

    def __init__(self, then: Callable[[int, float], None]) -> None:
        self._then = then

    def batch_written(self, entries: int, seconds: float) -> None:
        self._then(entries, seconds)


def configure(n: int) -> Configure:
    return Configure(n, FailedPolicy.RETRY)


async def opened(path: Path, lazy_flush: float) -> tuple[Ledger, list[int]]:
    ledger = Ledger(SqliteStore(str(path)), lazy_flush=lazy_flush)
    await ledger.recover()
    writes: list[int] = []
    ledger.subscribe(Writes(lambda n, _took: writes.append(n)))
    return ledger, writes


async def reopened(path: Path) -> Ledger:
    ledger = Ledger(SqliteStore(str(path)))
    await ledger.recover()
    return ledger


async def closed(ledger: Ledger) -> None:
    """A graceful stop: what is queued is written, then the store is let go."""
    await ledger.close()
    await ledger.store.shutdown()


def test_lazy_events_ride_with_the_next_awaited_one_in_one_write(tmp_path: Path) -> None:
    db = tmp_path / "s.db"

    async def main() -> None:
        ledger, writes = await opened(db, HOUR)
        lazy = asyncio.gather(*(ledger.submit(configure(i), lazy=True)[1] for i in range(1, 6)))
        assert await still_waiting([lazy]), "written for themselves alone"
        assert writes == [] and ledger.durable_seq == 0
        await ledger.commit(configure(9))
        assert writes == [6]  # the five reports and the commit: one write
        await lazy
        await closed(ledger)
        again = await reopened(db)
        assert again.seq == 6 and again.state.failure_max == 9
        await closed(again)

    run(main())


def test_lazy_events_alone_are_written_after_the_delay_and_at_close(tmp_path: Path) -> None:
    db = tmp_path / "s.db"

    async def main() -> None:
        ledger, writes = await opened(db, 0.01)
        await asyncio.gather(*(ledger.submit(configure(i), lazy=True)[1] for i in range(1, 4)))
        assert writes == [3] and ledger.durable_seq == 3
        await closed(ledger)

        ledger, writes = await opened(db, HOUR)
        ledger.submit(configure(7), lazy=True)
        await closed(ledger)  # a graceful stop writes what is queued, without the delay
        assert writes == [1]
        again = await reopened(db)
        assert again.seq == 4 and again.state.failure_max == 7
        await closed(again)

    run(main())


def test_sync_and_a_checkpoint_do_not_wait_out_the_lazy_delay(tmp_path: Path) -> None:
    db = tmp_path / "s.db"

    async def main() -> None:
        ledger, writes = await opened(db, HOUR)
        ledger.submit(configure(3), lazy=True)
        await ledger.sync()  # what a data checkpoint waits on: everything applied so far
        assert writes == [1] and ledger.durable_seq == 1
        await closed(ledger)

    run(main())


def test_a_crash_loses_only_the_lazy_tail_never_an_acknowledged_event(tmp_path: Path) -> None:
    db = tmp_path / "s.db"

    async def main() -> None:
        ledger, _ = await opened(db, HOUR)
        await ledger.commit(configure(4))
        ledger.submit(configure(5), lazy=True)  # acknowledged to nobody as durable
        # The master dies here: its store file is let go with the report unwritten.
        await ledger.store.shutdown()
        again = await reopened(db)
        assert again.seq == 1 and again.state.failure_max == 4
        await closed(again)

    run(main())


def test_sync_waits_for_what_was_applied_before_it_not_for_reports_after(tmp_path: Path) -> None:
    """A report that arrives while sync's write is under way (here: the moment it lands) is
    not sync's to wait for: sync returns once what was applied before it is durable, not a
    lazy delay later (under steady reports, never)."""
    db = tmp_path / "s.db"

    async def main() -> None:
        ledger, writes = await opened(db, HOUR)

        def report_meanwhile(_n: int, _took: float) -> None:
            if len(writes) == 1:
                ledger.submit(configure(8), lazy=True)

        ledger.subscribe(Writes(report_meanwhile))
        ledger.submit(configure(3), lazy=True)
        await asyncio.wait_for(ledger.sync(), 5.0)
        assert writes == [1] and ledger.durable_seq == 1 and ledger.seq == 2
        await closed(ledger)  # the report goes at close
        assert writes == [1, 1]

    run(main())


def test_sync_waits_for_a_change_somebody_waits_for_that_came_meanwhile(tmp_path: Path) -> None:
    """What a data checkpoint reads after sync is durable: a change that is not a report (a
    commit) applied while sync's write was under way is waited for too, and the report that
    came with it goes in the same write."""
    db = tmp_path / "s.db"

    async def main() -> None:
        ledger, writes = await opened(db, HOUR)

        def changes_meanwhile(_n: int, _took: float) -> None:
            if len(writes) == 1:
                ledger.submit(configure(8), lazy=True)
                ledger.submit(configure(9))

        ledger.subscribe(Writes(changes_meanwhile))
        ledger.submit(configure(3), lazy=True)
        await asyncio.wait_for(ledger.sync(), 5.0)
        assert writes == [1, 2] and ledger.durable_seq == ledger.seq == 3
        await closed(ledger)

    run(main())
