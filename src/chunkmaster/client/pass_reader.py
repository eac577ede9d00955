"""One pass's reader: its buffer (buffer.py), its fetcher thread (fetcher.py), and the one
loop that waits for the next run of records, shared by next_record(), records(), batches()
and the shuffle buffer (shuffled.py).

A reader asks the client (`PassHost`, passes.py) for what is the client's: whether it is still
open, what to do when the pass ends or is left early, who to tell that a task is done with.
Everything here but `start` runs under the client's lock, `cond`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chunkmaster.client.buffer import BufferSetup, PassBuffer, Run
from chunkmaster.client.errors import EndOfPass
from chunkmaster.client.fetcher import TaskFetcher, TaskSource
from chunkmaster.client.link import Startup
from chunkmaster.client.reading import TaskReader
from chunkmaster.client.reporter import ReportSink
from chunkmaster.core.model import Task
from chunkmaster.formats.base import Storage

log = logging.getLogger("chunkmaster.client")


class PassReplaced(Exception):
    """The reader's pass is no longer the client's: a new pass (or a feed) replaced it."""

    def __init__(self, pass_id: int, now: int | None) -> None:
        super().__init__(f"pass {pass_id} was replaced by pass {now} while iterating it")

    def log(self) -> None:
        log.warning("%s", self)


class PassHost(Protocol):
    """What a pass reader asks of its client (passes.py's `Passes`)."""

    def check_open(self) -> None: ...

    def current_pass(self) -> int | None: ...

    def pass_ended(self, reader: PassReader) -> None: ...

    def abandon(self, reader: PassReader, why: str) -> None: ...

    def tasks_done(self, done: list[Task]) -> None: ...

    def take_installed(self) -> Iterator[Any] | None: ...


@dataclass(frozen=True)
class ReaderSetup:
    """What every pass reader of one client shares: its buffers' setup, where tasks come from
    (`source`, asked by `worker` with long polls of `poll_wait` s) and finishes go
    (`reports`), how chunks are read (`storage`, `max_inflated`), and the client's host."""

    buffer: BufferSetup
    reports: ReportSink
    source: TaskSource
    worker: str
    poll_wait: float
    storage: Callable[[str], Storage]
    max_inflated: int
    host: PassHost
    startup: Startup | None = None
    on_unclaimed: Callable[[Task], None] | None = None


class PassReader:
    """The reading of one pass (see the module's text). `reports`: where its finishes go
    (default the client's; a shuffle buffer defers them), `paced_by_take` as PassBuffer has
    it. `joined`: the trainer read the pass before to its end."""

    def __init__(
        self,
        pass_id: int,
        setup: ReaderSetup,
        *,
        columns: Sequence[str] | None = None,
        batches: bool = False,
        reports: ReportSink | None = None,
        paced_by_take: bool = True,
        joined: bool = False,
    ) -> None:
        ahead = setup.buffer.readahead
        reader = TaskReader(
            setup.storage,
            columns,
            setup.max_inflated,
            batches=batches,
            fetched=None if ahead is None else ahead.take,
        )
        self.pass_id = pass_id
        self.cond = setup.buffer.cond
        self.progress = setup.buffer.progress
        self.reports = setup.reports if reports is None else reports
        self.buffer = PassBuffer(
            pass_id,
            setup.buffer,
            self.reports,
            reader,
            batches=batches,
            paced_by_take=paced_by_take,
        )
        self.buffer.joined = joined
        self._lease = setup.buffer.lease
        self._host = setup.host
        self.losses = 0  # times its session was found lost (its tasks dropped)
        fetcher = TaskFetcher(
            setup.source,
            self.buffer,
            worker=setup.worker,
            poll_wait=setup.poll_wait,
            pace=setup.buffer.pace,
            on_unclaimed=setup.on_unclaimed,
            startup=setup.startup,
        )
        self.thread: threading.Thread = fetcher.thread

    @property
    def cancelled(self) -> bool:
        return self.buffer.cancel.cancelled

    def lease_ok(self) -> bool:
        """Whether records of the held tasks may be handed out: with a session, only while
        its lease certainly holds."""
        return self._lease is None or self._lease.lease_ok()

    def check_current(self) -> None:
        """Raise if the pass is no longer the client's: ClientClosedError once closed, else
        PassReplaced."""
        if self.cancelled:
            self._host.check_open()
            raise PassReplaced(self.pass_id, self._host.current_pass())

    def drop_held(self) -> list[Task]:
        """The session was found lost: drop its tasks (see PassBuffer.drop_held)."""
        self.losses += 1
        return self.buffer.drop_held()

    def take(
        self,
        done: list[Task],
        deadline: float | None = None,
        changed: Callable[[], bool] | None = None,
    ) -> Run | None:
        """The next run of records: the one waiting loop of every reader (lock held).

        Waits until `deadline` (time.monotonic(); None: as long as the pass lasts), or until
        `changed()` says the caller should look again: None then. Raises EndOfPass at the end
        of the pass, its error (AllTaskFailedError, JobStoppedError, ...), a chunk's
        TaskReadError, ClientClosedError, and PassReplaced. Tasks finished by the run are
        appended to `done`.
        """
        buf = self.buffer
        while True:
            self.check_current()
            if changed is not None and changed():
                return None
            run = buf.next_run(done)
            if run is not None:
                return run
            if buf.end is not None and not buf.fenced:
                self._host.check_open()
                if isinstance(buf.end, EndOfPass):
                    self._host.pass_ended(self)
                    raise EndOfPass(self.pass_id)
                raise buf.end
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            buf.wait(remaining)

    def runs(self) -> Generator[Iterator[Any], None, None]:
        """The runs of records of the pass, each taken when the previous one is used up.

        Dropping the iterator early (a `break` out of records()) closes this generator, whose
        `finally` abandons the pass.
        """
        finished = False
        try:
            while True:
                done: list[Task] = []
                try:
                    with self.cond:
                        run = self._host.take_installed()  # left by next_record calls, if any
                        if run is None:
                            got = self.take(done)
                            assert got is not None
                            run = got.records
                except (EndOfPass, PassReplaced) as end:
                    if isinstance(end, PassReplaced):
                        end.log()
                    finished = True
                    return
                finally:
                    self._host.tasks_done(done)
                yield run
        finally:
            self.leave(finished)

    def leave(self, finished: bool) -> None:
        """A reading of the pass stopped; unless `finished`, the pass is left early."""
        if not finished:
            with self.cond:
                if not self.cancelled:
                    self._host.abandon(self, "records() left early")
