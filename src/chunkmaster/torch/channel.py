"""How DataLoader workers get their tasks from the trainer's main process.

Only the main process talks to the master (one session per rank, whatever the workers). Each
worker asks it for one task at a time over multiprocessing queues made with the DataLoader's
own start method (so they reach workers under fork, spawn and forkserver alike), and the main
process's WorkerTasks thread answers from the pass's feed (client/feed.py): a task, or None
when none is coming now, which ends the worker's part of the round.

A worker opens each iteration with a hello carrying a fresh nonce and drops every answer that
does not carry it: answers meant for an iteration the DataLoader abandoned (a `break` in the
training loop, a persistent worker starting its next epoch) never reach the new one. The main
process knows which task went to which (worker, nonce) and takes back the tasks of iterations
that ended without reading them (`Round`).
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chunkmaster.core.model import Task

log = logging.getLogger("chunkmaster.torch")

TaskKey = tuple[int, int, int]
"""(pass, task ID, epoch): one dispatch of a task."""

PARENT_CHECK = 1.0  # seconds between checks that the main process still lives


def key_of(task: Task) -> TaskKey:
    return (task.pass_id, task.meta.id, task.meta.epoch)


@dataclass
class Round:
    """One iteration of the DataLoader over a pass: which worker iterations said hello, and
    the tasks handed to each (main process only)."""

    number: int
    hellos: dict[int, str] = field(default_factory=dict)  # worker -> nonce of its iteration
    given: dict[TaskKey, Task] = field(default_factory=dict)
    closed: bool = False


class WorkerTasks:
    """The main process's side: a thread answering the workers' requests from `take` (a pass
    feed's), for the round in progress."""

    def __init__(self, context: Any, workers: int) -> None:
        self.requests: Any = context.Queue()
        self.replies: list[Any] = [context.Queue() for _ in range(workers)]
        self._lock = threading.Lock()
        self._round: Round | None = None
        self._take: Callable[[], Task | None] | None = None
        self._restock: Callable[[Task], None] | None = None
        self._thread: threading.Thread | None = None

    def ends(self) -> WorkerEnds:
        """What the workers get (pickled into each): the queues."""
        return WorkerEnds(self.requests, self.replies)

    def begin(
        self, round_: Round, take: Callable[[], Task | None], restock: Callable[[Task], None]
    ) -> None:
        """Answer the workers of `round_` from `take` from now on; a task taken for a round
        that ended meanwhile goes back with `restock`."""
        with self._lock:
            self._round, self._take, self._restock = round_, take, restock
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._serve, name="chunkmaster-torch-dispatch", daemon=True
            )
            self._thread.start()

    def end(self, round_: Round) -> None:
        """No more answers for `round_` (a request still waiting gets None)."""
        with self._lock:
            round_.closed = True
            if self._round is round_:
                self._round = self._take = None

    def close(self) -> None:
        self.requests.put(None)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)
        for q in [self.requests, *self.replies]:
            q.cancel_join_thread()
            q.close()

    def _serve(self) -> None:
        while True:
            msg = self.requests.get()
            if msg is None:
                return
            kind, worker, nonce = msg
            with self._lock:
                round_, take, restock = self._round, self._take, self._restock
            if round_ is None or take is None or restock is None:
                continue  # between rounds: whoever asks is an iteration that is over
            if kind == "hello":
                round_.hellos[worker] = nonce
                self.replies[worker].put(("welcome", nonce, None))
                continue
            if round_.hellos.get(worker) != nonce:
                continue  # an iteration that is over (its worker started another)
            task = take()
            with self._lock:
                late = task is not None and round_.closed
                if task is not None and not late:
                    round_.given[key_of(task)] = task
            if late:
                assert task is not None
                restock(task)  # its round is over: nobody will read it there
                task = None
            self.replies[worker].put(("task", nonce, task))


@dataclass
class WorkerEnds:
    """The queues, as a worker holds them."""

    requests: Any
    replies: list[Any]


class QueueEnd:
    """A worker's end of the channel, for one iteration of it."""

    def __init__(self, ends: WorkerEnds, worker: int) -> None:
        self._ends = ends
        self._worker = worker
        self._nonce = secrets.token_hex(8)
        self._parent = os.getppid()

    def open(self) -> None:
        """Say hello and wait for the welcome (older answers to this worker are dropped)."""
        self._ends.requests.put(("hello", self._worker, self._nonce))
        while self._receive()[0] != "welcome":
            pass

    def ask(self) -> None:
        """Ask for the next task (answered by `receive`)."""
        self._ends.requests.put(("task", self._worker, self._nonce))

    def receive(self) -> Task | None:
        """The answer to `ask`: a task, or None (nothing more in this round)."""
        while True:
            kind, task = self._receive()
            if kind == "task":
                return task if isinstance(task, Task) else None

    def _receive(self) -> tuple[str, Any]:
        replies = self._ends.replies[self._worker]
        while True:
            try:
                kind, nonce, body = replies.get(timeout=PARENT_CHECK)
            except queue.Empty:
                if os.getppid() != self._parent:
                    raise RuntimeError("the trainer's main process is gone") from None
                continue
            if nonce == self._nonce:
                return kind, body


class LocalEnd:
    """The end used without workers: the dataset runs in the main process's own thread."""

    def __init__(self, round_: Round, take: Callable[[], Task | None]) -> None:
        self._round = round_
        self._take = take

    def open(self) -> None:
        pass

    def ask(self) -> None:
        pass

    def receive(self) -> Task | None:
        task = self._take()
        if task is not None:
            self._round.given[key_of(task)] = task
        return task
