"""Parts of the master hear the ledger through one interface (master/ledger.py
`LedgerSubscriber`): each subscribes once and overrides the hooks it needs."""

from __future__ import annotations

from pathlib import Path

from helpers.aio import run

from chunkmaster.core.events import Configure, Event
from chunkmaster.core.model import FailedPolicy
from chunkmaster.master.ledger import Ledger, LedgerSubscriber, Result
from chunkmaster.store.sqlite import SqliteStore


class Heard(LedgerSubscriber):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def state_changed(self) -> None:
        self.log.append(f"{self.name} changed")

    def state_rebuilt(self) -> None:
        self.log.append(f"{self.name} rebuilt")

    def event_applied(self, event: Event, result: Result) -> None:
        self.log.append(f"{self.name} applied {type(event).__name__} {result}")

    def batch_written(self, entries: int, seconds: float) -> None:
        self.log.append(f"{self.name} wrote {entries}")


class Quiet(LedgerSubscriber):
    """A part that needs none of the hooks: they do nothing."""


def test_subscribers_hear_each_hook_in_the_order_they_subscribed(tmp_path: Path) -> None:
    async def main() -> None:
        ledger = Ledger(SqliteStore(str(tmp_path / "s.db")))
        await ledger.recover()
        log: list[str] = []
        ledger.subscribe(Heard("a", log))
        ledger.subscribe(Quiet())
        ledger.subscribe(Heard("b", log))
        await ledger.commit(Configure(5, FailedPolicy.RETRY))
        assert log == [
            "a changed",
            "b changed",
            "a applied Configure True",
            "b applied Configure True",
            "a wrote 1",
            "b wrote 1",
        ]
        log.clear()
        await ledger.replace([Configure(6, FailedPolicy.RETRY)])
        assert log == ["a rebuilt", "b rebuilt", "a changed", "b changed"]
        assert ledger.state.failure_max == 6
        await ledger.close()
        await ledger.store.shutdown()

    run(main())
