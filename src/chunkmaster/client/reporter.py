"""The reporter thread: sends TaskFinished / TaskFailed, so a report never waits behind a poll."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import NamedTuple, Protocol

from chunkmaster.client.connection import join_all
from chunkmaster.client.link import Cancelled, CancelToken, MasterLink
from chunkmaster.client.stream import Reply
from chunkmaster.core.errors import MasterError
from chunkmaster.core.model import Task

log = logging.getLogger("chunkmaster.client")


class ReportSink(Protocol):
    """Where a pass buffer sends its finishes and failures (this Reporter, or the session)."""

    def finished(self, task: Task, *, last: bool = False) -> None:
        """`last`: the trainer holds no other task (nothing else will finish soon)."""
        ...

    def failed(self, task: Task, reason: str) -> None: ...

    def settle(self, wake: Callable[[], None]) -> Reply | None:
        """Have the finishes reported so far applied by the master; `wake` is called when they
        are. None: nothing to wait for."""
        ...


class Report(NamedTuple):
    """One report to send: "finish" or "fail" (with its reason)."""

    kind: str
    task: Task
    reason: str = ""


class Reporter:
    """A queue of reports and the thread that sends them in order, retrying like any call."""

    def __init__(self, link: MasterLink, worker: str) -> None:
        self._link = link
        self._queue: queue.SimpleQueue[Report | None] = queue.SimpleQueue()
        self._token = CancelToken()  # not the client's: close() first lets reports drain
        self._thread = threading.Thread(
            target=self._loop, name=f"chunkmaster-reporter-{worker}", daemon=True
        )
        self._thread.start()

    def finished(self, task: Task, *, last: bool = False) -> None:
        self._queue.put(Report("finish", task))  # sent at once, `last` or not

    def failed(self, task: Task, reason: str) -> None:
        self._queue.put(Report("fail", task, reason))

    def settle(self, wake: Callable[[], None]) -> Reply | None:
        """Nothing to wait for: without a session no trainer is charged for dying (its tasks
        come back by their timeouts, which count against the task)."""
        return None

    def close(self, flush_timeout: float) -> None:
        """Send what is queued (for up to flush_timeout s), then give the rest up: a report in
        flight ends with the channel (the client closes it next; `join()` waits)."""
        self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(flush_timeout)
        self._token.cancel()

    def join(self, deadline: float) -> list[str]:
        """After close(): wait until `deadline` (time.monotonic()) for the thread to be gone;
        its name if it is not."""
        return join_all([self._thread], deadline)

    def _loop(self) -> None:
        while True:
            report = self._queue.get()
            if report is None:
                return
            try:
                applied = self._send(report)
            except Cancelled:
                left = 1 + sum(1 for _ in iter(self._queue.get_nowait, None))
                log.warning(
                    "client closed with %d task report(s) unsent; those tasks come back "
                    "after the master's timeout",
                    left,
                )
                return
            except MasterError as exc:
                meta = report.task.meta
                log.warning("%s of task %d (epoch %d): %s", report.kind, meta.id, meta.epoch, exc)
                continue
            if not applied:
                log.info(
                    "master ignored %s of task %d (epoch %d): it timed out and went to "
                    "another trainer, or its pass is over",
                    report.kind,
                    report.task.meta.id,
                    report.task.meta.epoch,
                )

    def _send(self, report: Report) -> bool:
        task = report.task
        meta = task.meta
        if report.kind == "finish":
            return self._link.call(
                f"TaskFinished(task {meta.id})",
                lambda c: c.task_finished(meta.id, epoch=meta.epoch, pass_id=task.pass_id),
                self._token,
            )
        return self._link.call(
            f"TaskFailed(task {meta.id})",
            lambda c: c.task_failed(meta, report.reason),
            self._token,
        )
