"""The fetcher thread of one pass: asks the master for tasks (long-polling) and buffers them.

It holds enough tasks to cover a round trip to the master at the trainer's pace (pace.py; at
least 1 + prefetch_tasks), so the next task is at hand when the trainer ends the current one:
the trainer never waits on the network between tasks. Over a session it asks once half the
slots are free, for all of them in one message: one round trip for several small tasks. The
master's other answers (the pass is over, nothing free yet, the job stopped) mean what
answers.TABLE says; `PassAnswers` acts on them for this loop and the Loader's feed.
How a task is asked for is a `TaskSource`: a unary GetTask (`UnaryTasks`, below) or a NextTask
on the trainer's session stream (session.py).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from chunkmaster.client.answers import Act, meaning
from chunkmaster.client.buffer import PassBuffer
from chunkmaster.client.connection import MasterConnection
from chunkmaster.client.errors import EndOfPass
from chunkmaster.client.link import Cancelled, CancelToken, MasterLink, Startup
from chunkmaster.client.pace import Pace
from chunkmaster.client.stream import Dispatched
from chunkmaster.core.errors import NotReadyError, PassBeforeError, PassOverError
from chunkmaster.core.model import Task
from chunkmaster.waitlog import WaitLog

log = logging.getLogger("chunkmaster.client")

PASS_POLL_MAX = 0.5  # seconds between GetTask calls while the master is still in an older pass
WAIT_LOG_EVERY = 30.0


class TaskSource(Protocol):
    """Asks the master for the next tasks of a pass (at least one, at most `count`, and at
    most `max_batch` at a time); raises the master's answer otherwise."""

    max_batch: int

    def next_tasks(
        self, pass_id: int, count: int, wait: float, request_id: str, cancel: CancelToken
    ) -> list[Task]: ...


class UnaryTasks:
    """Tasks by unary GetTask calls, one per call, retried through the link (no session)."""

    max_batch = 1

    def __init__(self, link: MasterLink, worker: str) -> None:
        self._link = link
        self._worker = worker

    def next_tasks(
        self, pass_id: int, count: int, wait: float, request_id: str, cancel: CancelToken
    ) -> list[Task]:
        task = self._link.call(
            f"GetTask(pass {pass_id})",
            functools.partial(
                self._get_task, pass_id=pass_id, wait=wait, request_id=request_id, cancel=cancel
            ),
            cancel,
        )
        return [task]

    def _get_task(
        self,
        conn: MasterConnection,
        *,
        pass_id: int,
        wait: float,
        request_id: str,
        cancel: CancelToken,
    ) -> Task:
        # Abandoning the pass cancels the long poll; a task the master dispatched meanwhile
        # keeps its timer there (the dispatch is shielded) and comes back after its timeout.
        call = conn.get_task_async(pass_id, wait=wait, worker=self._worker, request_id=request_id)
        return cancel.run(call)


class TaskFetcher:
    """The thread that fills one PassBuffer with tasks; stopped by cancelling the buffer.

    `on_unclaimed` gets a task that arrived after the pass was abandoned (the session hands
    it back); without it such a task comes back after the master's timeout.
    """

    def __init__(
        self,
        source: TaskSource,
        buffer: PassBuffer,
        *,
        worker: str,
        poll_wait: float,
        pace: Pace,
        on_unclaimed: Callable[[Task], None] | None = None,
        startup: Startup | None = None,
    ) -> None:
        self._source = source
        self._startup = startup
        self._buffer = buffer
        self._poll_wait = poll_wait
        self._pace = pace
        self._on_unclaimed = on_unclaimed
        self.thread = threading.Thread(
            target=self._loop,
            name=f"chunkmaster-fetch-{worker}-pass{buffer.pass_id}",
            daemon=True,
        )

    def _loop(self) -> None:
        buf = self._buffer
        until_end(self._fetch, buf.cancel, buf.finish, f"fetcher of pass {buf.pass_id}")

    def _fetch(self) -> None:
        buf = self._buffer
        answers = PassAnswers(buf.pass_id, buf.cancel, self._startup)
        while True:
            # As many slots as cover a round trip at the trainer's pace (pace.py). A source
            # that hands out several tasks a message is asked once half the slots are free:
            # one round trip for several tasks, and as many still at hand meanwhile.
            slots = self._pace.slots()
            batch = min(self._source.max_batch, max(1, slots // 2))
            count = min(buf.wait_free(slots, batch), self._source.max_batch)
            # One ID per request, the same for its retries: if an answer is lost (the master
            # failed over, a deadline passed), the retry gets those same tasks back.
            request_id = uuid.uuid4().hex
            asked_at = time.monotonic()
            wait = self._poll_wait if self._startup is None else self._startup.poll(self._poll_wait)
            try:
                tasks = self._source.next_tasks(buf.pass_id, count, wait, request_id, buf.cancel)
            except Exception as exc:
                end = answers.end(exc, buf.got_task, buf.joined)
                if end is not None:
                    buf.finish(end)  # raised to the trainer once the tasks it holds are read
                    return
                continue
            answers.tasks()
            self._pace.answered(time.monotonic() - asked_at, count, len(tasks))
            generation = tasks.generation if isinstance(tasks, Dispatched) else None
            try:
                buf.add_tasks(tasks, generation)
            except Cancelled:
                if self._on_unclaimed is not None:
                    for unclaimed in tasks:
                        self._on_unclaimed(unclaimed)
                raise


def until_end(
    fetch: Callable[[], None],
    cancel: CancelToken,
    finish: Callable[[BaseException], None],
    what: str,
) -> None:
    """Run a pass's fetch loop; the error that stops it (a bug, a fatal answer) ends the
    pass's reading with it, which the trainer must see."""
    try:
        fetch()
    except Cancelled:
        pass
    except BaseException as exc:
        if not cancel.cancelled:
            log.exception("%s failed", what)
        finish(exc)


class PassAnswers:
    """The answers to one pass's task requests that are not tasks (answers.TABLE): the end of
    the pass's reading they bring, or the wait they mean, logged. `quiet`: answers whose wait
    is normal enough to say only once it lasts."""

    def __init__(
        self,
        pass_id: int,
        cancel: CancelToken,
        startup: Startup | None,
        quiet: tuple[type[Exception], ...] = (),
    ) -> None:
        self._cancel = cancel
        self._startup = startup
        self._quiet = quiet
        self._waits = WaitLog(log, f"pass {pass_id}", WAIT_LOG_EVERY)
        self._polls = 0
        self.pass_id = pass_id

    def end(self, exc: Exception, got_task: bool, joined: bool) -> BaseException | None:
        """What ends the pass's reading on the answer `exc`; None: ask again (after a pause,
        for an answer that came at once). Raises an answer no task request expects."""
        row = meaning(exc)
        if row.task is Act.END:
            assert isinstance(exc, PassBeforeError)
            return pass_end(self.pass_id, exc, got_task, joined)
        if row.task is Act.STOP:
            return exc
        if row.task not in (Act.WAIT, Act.POLL):
            raise exc
        every, startup = WAIT_LOG_EVERY, self._startup
        if startup is not None and not startup.dataset:
            if not isinstance(exc, NotReadyError):
                startup.dataset = True  # any other answer says the master has a dataset
            elif startup.over(time.monotonic()):  # none for the whole start-up bound
                return startup.no_dataset(time.monotonic())
            else:
                every = startup.log_every(WAIT_LOG_EVERY)
        first = None if isinstance(exc, self._quiet) else logging.INFO
        if self._waits.wait(type(exc), row.why, every=every, first=first):
            self._polls = 0
        if row.task is Act.POLL:
            self._cancel.sleep(min(PASS_POLL_MAX, 0.02 * 2**self._polls))
            self._polls += 1
        return None

    def tasks(self) -> None:
        """Tasks came: the wait is over, and the master has a dataset."""
        self._waits.over()
        if self._startup is not None:
            self._startup.dataset = True


def pass_end(pass_id: int, exc: PassBeforeError, got_task: bool, joined: bool) -> BaseException:
    """What a trainer gets when the master says `pass_id` is over: its end, if the trainer took
    part in it (got a task of it, or read the pass before it to its end: the others were
    faster); else PassOverError, naming the master's pass (it asked for a pass already over)."""
    if got_task or joined:
        if not got_task:
            log.warning(
                "pass %d ended before this trainer got any of it (the others read it all): %s",
                pass_id,
                exc,
            )
        return EndOfPass(pass_id)
    return PassOverError(
        f"pass {pass_id} was over before this trainer read any of it: {exc}; ask for the "
        "master's current pass (client.status()['cur_pass'])"
    )
