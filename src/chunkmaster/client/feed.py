"""One pass's tasks for readers outside the client's thread: the DataLoader workers of
`chunkmaster.torch`, which read chunks in processes of their own.

The client's own passes (buffer.py) read each chunk in the trainer's thread. Here the feed's
thread fetches tasks over the trainer's session into a small stock, readers take them one at a
time (`take`), and the trainer's thread says how far the training loop has *taken* each task's
records (`taken`): that, not what a reader has read ahead, is what progress reports, finishes
and commits count.

When the master has no task free for this trainer (every task of the pass is handed out, or it
has its equal-steps quota) the feed is *dry*: `take` answers None at once, so readers stop
instead of waiting for the pass to end (a reader that waits would hold up a DataLoader that
takes its workers' batches in order, and with it the records that end the pass). The feed
keeps asking the master meanwhile; `wait_ready` says when a task came back or the pass ended.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import replace

from chunkmaster.client.fetcher import PassAnswers, until_end
from chunkmaster.client.link import Cancelled, CancelToken
from chunkmaster.client.pace import Pace
from chunkmaster.client.pass_reader import ReaderSetup
from chunkmaster.client.session import TrainerSession
from chunkmaster.core.errors import NoMoreAvailableError
from chunkmaster.core.model import Position, Task


class PassFeed:
    """Tasks of one pass for outside readers; `stock` tasks at least are fetched ahead of them,
    more when the readers take tasks faster than a round trip to the master (pace.py: the
    stock then covers a round trip at their pace; tasks that take long keep it at `stock`).

    Everything is guarded by the client's lock (`setup.buffer.cond`). `joined`: the trainer
    read the pass before this one to its end (see buffer.PassBuffer.joined).
    """

    def __init__(
        self, pass_id: int, setup: ReaderSetup, session: TrainerSession, *, stock: int, joined: bool
    ) -> None:
        self.pass_id = pass_id
        self._startup = setup.startup
        self.cancel = CancelToken(setup.buffer.parent)
        self._cond = setup.buffer.cond
        self._session = session
        self._progress = setup.buffer.progress
        self._size = max(1, stock)
        self.pace = Pace(self._size)
        self._taken_at: float | None = None  # when a reader took the task before
        self._waited = 0.0  # what readers waited for the stock since then
        self._poll_wait = setup.poll_wait
        self._joined = joined
        self._stock: deque[Task] = deque()
        self.dry = False
        self.end: BaseException | None = None
        self.got_task = False
        self._abandoned = False
        self.thread = threading.Thread(
            target=self._loop, name=f"chunkmaster-feed-{setup.worker}-pass{pass_id}", daemon=True
        )

    # ---- readers ------------------------------------------------------------------------

    def take(self) -> Task | None:
        """A task for a reader, waiting while one is on its way; None when none is coming now
        (the feed is dry, the pass is over or cannot go on, or the feed was abandoned)."""
        with self._cond:
            started = time.monotonic()
            while not self._stock and not self.dry and self.end is None:
                if self.cancel.cancelled:
                    return None
                self._cond.wait()
            now = time.monotonic()
            self._waited += now - started
            if not self._stock:
                return None
            task = self._stock.popleft()
            if self._taken_at is not None:  # the readers' time over a task, waits left out
                self.pace.task_took(now - self._taken_at - self._waited)
            self._taken_at, self._waited = now, 0.0
            self._cond.notify_all()  # room in the stock
            return task

    def wait_ready(self) -> bool:
        """Wait for a task to be at hand (True) or for the pass's end (False: `end` says
        how it ended)."""
        with self._cond:
            while not self._stock and self.end is None and not self.cancel.cancelled:
                self._cond.wait()
            return bool(self._stock)

    def restock(self, task: Task, records: int) -> None:
        """A task a reader got but did not read to its end (its reader went away) goes back to
        the stock, to be read from record `records` on."""
        with self._cond:
            self._stock.appendleft(replace(task, start=max(records, task.start)))
            self._cond.notify_all()

    def lose_stock(self) -> list[Task]:
        """The session was lost: the tasks in stock went to other trainers (lock held)."""
        lost = list(self._stock)
        self._stock.clear()
        self._cond.notify_all()
        return lost

    # ---- the trainer's thread: how far the training loop took each task --------------------

    def held(self, task: Task) -> bool:
        """Whether this trainer still holds `task` (not if its session was lost meanwhile)."""
        with self._cond:
            return self._progress.holds(task)

    def taken(self, task: Task, records: int) -> bool:
        """The training loop took records [0, records) of `task`; at its end it is finished.
        False for a task this trainer no longer holds (its session was lost: another trainer
        has it now), which nothing is reported of."""
        with self._cond:
            if not self._progress.holds(task):
                return False
            due = self._progress.advance(task, records)
            if records >= task.num_records:
                self._progress.finished(task)
                self._session.finished(task, last=not self._progress.held)
            elif due:
                self._session.report_now()
            return True

    def failed(self, task: Task, records: int, reason: str) -> None:
        """A chunk of `task` could not be read: the training loop took [0, records) of it.
        The master learns that position, then the failure (it hands the task out again from
        there, or quarantines it)."""
        with self._cond:
            if not self._progress.holds(task):
                return  # another trainer's now: its failure is not ours to report
            self._progress.advance(task, records)
            self._progress.dropped(task)
            meta = task.meta
            at = Position(meta.id, meta.epoch, task.pass_id, records)
        self._session.failed(task, reason, at)

    def abandon(self) -> None:
        """Stop fetching; hand every task of the pass this trainer holds back to the master at
        the position the training loop took it to. Once: a later call (the iteration that read
        this feed collected after a newer one began) hands back nothing of the newer one's."""
        with self._cond:
            if self._abandoned:
                return
            self._abandoned = True
        self.cancel.cancel()
        with self._cond:
            self._stock.clear()
            back = self._progress.release(self.pass_id)
            self._cond.notify_all()
        self._session.hand_back(back)

    # ---- the feed's thread --------------------------------------------------------------------

    def _loop(self) -> None:
        until_end(self._fetch, self.cancel, self._finish, f"feed of pass {self.pass_id}")

    def _finish(self, end: BaseException) -> None:
        with self._cond:
            if self.end is None:
                self.end = end
            self._cond.notify_all()

    def _fetch(self) -> None:
        answers = PassAnswers(self.pass_id, self.cancel, self._startup, (NoMoreAvailableError,))
        while True:
            with self._cond:
                size = self.pace.slots()
                while len(self._stock) >= size and not self.cancel.cancelled:
                    self._cond.wait()
                want = min(size - len(self._stock), self._session.max_batch)
                # Not dry yet: ask without waiting, to learn at once that nothing is free.
                wait = self._poll_wait if self.dry else 0.0
            if self._startup is not None:
                wait = self._startup.poll(wait)
            self.cancel.check()
            asked_at = time.monotonic()
            try:
                tasks = self._session.next_tasks(
                    self.pass_id, max(1, want), wait, uuid.uuid4().hex, self.cancel
                )
            except Exception as exc:
                end = answers.end(exc, self.got_task, self._joined)
                if end is not None:
                    self._finish(end)
                    return
                if isinstance(exc, NoMoreAvailableError):
                    with self._cond:
                        if not self.dry:
                            self.dry = True
                            self._cond.notify_all()
                continue
            answers.tasks()
            with self._cond:
                self.pace.answered(time.monotonic() - asked_at, max(1, want), len(tasks))
                if self.cancel.cancelled:  # abandoned meanwhile: hand them straight back
                    back = [Position(t.meta.id, t.meta.epoch, t.pass_id, t.start) for t in tasks]
                else:
                    back = []
                    for task in tasks:
                        self._progress.add(task)
                    self._stock.extend(tasks)
                    self.got_task = True
                    self.dry = False
                    self._cond.notify_all()
            if back:
                self._session.hand_back(back)
                raise Cancelled()
