"""The trainer's session: one long-lived bidirectional stream to the master (docs/sessions.md).

The session's thread opens the stream (Hello, then Welcome: through the link's addresses,
backoff and etcd lookups), sends again what was not answered when a stream broke, and sends the
keep-alives that carry progress. A reader thread per stream hands each answer to the `Reply`
its sender waits on. Callers send from their own threads: the pass fetcher a NextTask, which
carries the finishes queued since the last one (a finish and the next request travel in one
message); the client a Commit or the Goodbye.

A message that expects an answer stays pending until answered and is sent again as is (same
seq, same request_id) on the next stream: the master treats a repeat as the original. If the
session ended while the trainer was away (SessionExpiredError), its tasks went to other
trainers: `on_lost` tells the client to stop reading them, the finishes and failures not yet
sent are dropped (they are no longer this trainer's to report), a new session is opened and
the other pending messages go out in it; task requests get fresh request IDs.

Fencing: the master ends a session `ttl` seconds after it last heard from it, so a trainer
that was frozen or cut off may hold tasks that are someone else's already. `lease_ok()` says
whether the master has certainly heard from this session within 0.8 ttl (it answered a
message sent then); if not, the trainer hands out no more records of its tasks until it knows
(a ping, an empty NextTask, is answered: `on_alive`; or the session is found lost: `on_lost`).
While the trainer reads, the session pings ahead of need, so that it never waits.

A finish is never dropped while its session lasts: one the master answers with "not now"
(UnavailableError while its store refuses writes, NotReadyError) goes back into the queue and
out again with backoff, in whichever message carries it (a NextTask, alone, before a Commit or
the Goodbye), until the master applies it or answers that it is moot (an Ack: the task is not
pending, another epoch, the pass is over) or refuses it for good (a malformed report, or a task
no longer this session's: logged). Finishes refused together because one of them is on a task
no longer this session's go again one by one, each judged on its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from chunkmaster.client.connection import (
    CallCancelled,
    MasterConnection,
    TransportError,
    join_all,
)
from chunkmaster.client.fetcher import Dispatched
from chunkmaster.client.link import Cancelled, CancelToken, MasterLink, backoff_delay
from chunkmaster.client.progress import task_records
from chunkmaster.core.errors import (
    MasterError,
    NotReadyError,
    PermissionDeniedError,
    SessionExpiredError,
    UnauthenticatedError,
    UnavailableError,
)
from chunkmaster.core.model import Position, Task
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc.wire import MAX_BATCH, error_from_name, error_from_rpc, task_from_pb

log = logging.getLogger("chunkmaster.client")

REPORT_GAP = 0.1
"""Seconds between two progress reports at least: above report_every / REPORT_GAP records per
second, a report covers more than report_every records (REPORT_GAP seconds' worth). Each
report costs the master about a millisecond: a trainer reporting every 20 ms took 5% of a
core of it, a hundred of them five cores."""

DATA_WAIT_EVERY = 1.0
"""Seconds between two data-wait figures sent with progress reports, at least (the periodic
keep-alive carries them too)."""

FINISH_FLUSH = 0.1
"""Seconds a finish waits for a NextTask to ride on before it goes alone (want_task=false)."""

FINISH_FLUSH_ASKING = 0.02
"""... while a task request is in flight (the next one waits for its answer, and it may be a
long poll): the finishes of this while go together, in one message, not one each."""

#: The master's answers that mean "not now, ask again": a report or commit refused with one
#: of these is sent again with backoff (the master has not applied it).
TRY_AGAIN = (UnavailableError, NotReadyError)

LEASE_SAFE = 0.8
"""The part of the TTL after a message the master answered during which the trainer may go on
reading its tasks without hearing from the master again (its lease holds at least a TTL)."""


def session_error(err: pb.SessionError) -> MasterError:
    """The master's error carried by a SessionError."""
    exc = error_from_name(err.error, err.message)
    return exc if exc is not None else MasterError(f"{err.error}: {err.message}")


def position_to_pb(pos: Position) -> pb.TaskPosition:
    return pb.TaskPosition(
        task_id=pos.task_id, epoch=pos.epoch, pass_id=pos.pass_id, records=pos.records
    )


class Reply:
    """The master's answer to one message, awaited by the thread that sent it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._response: pb.SessionResponse | None = None
        self._error: BaseException | None = None
        self.cancelled = False
        self.generation = -1  # the session generation of the stream that answered
        self._callbacks: list[Callable[[], None]] = []

    def on_done(self, fn: Callable[[], None]) -> None:
        """Call `fn`, from the thread that settles this reply and with none of its locks held,
        once the answer, an error or a cancel comes. Not called if that happened already (the
        caller's locks may be held here): check `done` after."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)

    def _run_callbacks(self) -> None:
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()

    def resolve(self, response: pb.SessionResponse) -> bool:
        """Deliver the answer; False if the waiter gave up (cancelled) before it came."""
        with self._lock:
            if self.cancelled or self._done.is_set():
                return False
            self._response = response
            self._done.set()
        self._run_callbacks()
        return True

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if not self._done.is_set():
                self._error = exc
                self._done.set()
        self._run_callbacks()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> pb.SessionResponse:
        """The answer; raises the master's error, CallCancelled, or TimeoutError."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"no answer to {self.kind} within {timeout}s")
        with self._lock:
            response, error = self._response, self._error
        if error is not None:
            raise error
        if response is None:
            raise CallCancelled()
        if response.WhichOneof("body") == "error":
            raise session_error(response.error)
        return response

    def cancel(self) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self.cancelled = True
            self._done.set()
        self._run_callbacks()


@dataclass
class _Pending:
    request: pb.SessionRequest
    reply: Reply
    sent_at: float = 0.0  # time.monotonic() it last went out on a stream (0: not yet)


class _Stream:
    """One Session call: its outgoing queue, the call, the Hello it began with, and the two
    threads that use the call: this session's reader, and gRPC's thread that sends the
    requests, iterating `requests()` (it ends once `end()` ends that iterator).

    A thread still inside the call at interpreter exit can hold the call's lock while the
    finalization freezes it, and the call object's `__del__` then waits for that lock for
    ever (the process never exits): the session's close joins both threads (`join()`)."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.queue: queue.SimpleQueue[pb.SessionRequest | None] = queue.SimpleQueue()
        self.call: Any = None
        self.hello_seq = 0
        self.hello = Reply("Hello")
        self.broken = threading.Event()
        self.sender: threading.Thread | None = None  # gRPC's thread iterating requests()
        self.sending = threading.Event()  # set once that thread has started
        self.reader: threading.Thread | None = None  # the session's thread reading answers
        self.welcomed = False  # a stream that never got its Welcome fails quietly (the link logs)
        self.expired = False
        self.generation = 0  # TrainerSession.generation when it was opened

    def requests(self) -> Iterator[pb.SessionRequest]:
        self.sender = threading.current_thread()
        self.sending.set()
        while True:
            req = self.queue.get()
            if req is None:
                return
            yield req

    def send(self, req: pb.SessionRequest) -> None:
        self.queue.put(req)

    def end(self) -> None:
        """No more requests: gRPC's sending thread leaves requests() once at the end."""
        self.queue.put(None)

    def close(self) -> None:
        self.end()
        if self.call is not None:
            self.call.cancel()

    def let_go(self) -> bool:
        """Let go of the call once both threads that use it are gone (or never started):
        whether they are. Nothing of the session then holds the call object (an error kept
        in a log record may still hold this stream)."""
        reader, sender = self.reader, self.sender
        if reader is not None and reader.is_alive():
            return False
        if self.call is not None:
            if not self.sending.is_set() or sender is None or sender.is_alive():
                return False
            self.call = None
        return True

    def join(self, deadline: float) -> list[str]:
        """After close(): wait (until `deadline`, time.monotonic()) for the reader and gRPC's
        sending thread to be gone (that one always starts with the call, and leaves once the
        call is cancelled), then let go of the call. The names of those still alive."""
        left = join_all([self.reader], deadline)
        if self.call is not None:
            if not self.sending.wait(max(0.0, deadline - time.monotonic())):
                left.append(f"gRPC's sender of the stream to {self.addr} (not started)")
            left += join_all([self.sender], deadline)
        if not left:
            self.call = None
        return left


class TrainerSession:
    """The client side of one trainer's session, across reconnects and renewals.

    `progress()` returns the positions to send with a keep-alive (called without this
    session's lock: it takes the client's). `on_unclaimed(task)` gets a task that arrived for
    a request its sender gave up on (a pass abandoned meanwhile). `on_lost()` is called when
    the master ended the session while the trainer was away (its tasks are others' now),
    before a new session is opened; `on_alive()` when the master answered while `lease_ok()`
    had said no. Both are called without this session's lock.
    """

    def __init__(
        self,
        link: MasterLink,
        *,
        name: str,
        report_every: int,
        report_interval: float,
        progress: Callable[[], list[Position]],
        on_unclaimed: Callable[[Task], None],
        world_size: int = 0,
        rank: int = 0,
        data_wait: Callable[[], pb.DataWait | None] | None = None,
        on_lost: Callable[[], None] | None = None,
        on_alive: Callable[[], None] | None = None,
    ) -> None:
        self._link = link
        self._on_lost = on_lost
        self._on_alive = on_alive
        self._ttl = 0.0  # the master's session TTL (0: no Welcome yet)
        self._heard_at = 0.0  # when the newest message the master answered was sent
        self._fence_used = 0.0  # when the trainer last asked lease_ok()
        self._fence_waiting = False  # lease_ok() said no: on_alive() once the master answers
        self._ping_due = False
        self._pinged_at = 0.0
        self._ping: Reply | None = None
        self._failure: Exception | None = None  # why the master is out of reach, if it is
        self.generation = 0  # sessions found lost so far: tasks of an older one are not ours
        self.name = name
        self._world_size = world_size
        self._rank = rank
        self._data_wait = data_wait
        self._report_every = report_every
        self._report_interval = report_interval
        self._progress = progress
        self._on_unclaimed = on_unclaimed
        self._lock = threading.Lock()
        self._seq = 0
        self._pending: dict[int, _Pending] = {}
        self._finishes: list[pb.TaskPosition] = []
        self._flush_at: float | None = None
        self._finish_retries = 0  # finishes refused "not now" in a row (the backoff's attempt)
        self._finish_retry_at: float | None = None  # no finish goes out before (monotonic)
        self._stream: _Stream | None = None  # set once Welcome came and the pending went out
        self._session_id = ""
        self.keep_alive_seconds = report_interval
        self._wake = threading.Event()
        self._report_due = False
        self._reported = 0.0  # when progress was last sent (time.monotonic())
        self._waits_at = 0.0  # when data-wait figures may go with a report again
        self._closing = False
        self._streams: list[_Stream] = []  # the streams opened and not over; joined at close
        self._said_goodbye = False
        self._token = CancelToken()
        self._thread = threading.Thread(
            target=self._main, name=f"chunkmaster-session-{name}", daemon=True
        )
        self._thread.start()

    @property
    def session_id(self) -> str:
        """The master's ID of this session ("" until the first Welcome)."""
        return self._session_id

    # ---- what callers send ----------------------------------------------------------------

    max_batch = MAX_BATCH

    def next_tasks(
        self, pass_id: int, count: int, wait: float, request_id: str, cancel: CancelToken
    ) -> list[Task]:
        """Up to `count` tasks of `pass_id` in one message (at least one: the master waits up
        to `wait` s for it), with the finishes queued meanwhile riding along. Raises the
        master's answer otherwise, or Cancelled."""
        attempt = 0
        while True:
            with self._lock:
                if self._closing:
                    raise Cancelled()
                finished = self._take_finishes()
                msg = pb.NextTask(
                    finished=finished,
                    want_task=True,
                    pass_id=pass_id,
                    wait_seconds=wait,
                    request_id=request_id,
                    max_tasks=count if count > 1 else 0,
                )
                reply = self._send("next", msg, answered=True)
            assert reply is not None
            try:
                resp = cancel.run(reply)
                if reply.generation != self.generation:
                    continue  # answered in a session lost since: its tasks went to others
            except MasterError as exc:
                if finished and isinstance(exc, PermissionDeniedError):
                    # A finish on a task no longer this session's (its dispatch timed out and
                    # went to another trainer) refuses the whole message, and nothing changed:
                    # each finish goes again alone (_on_response); the request without them.
                    log.warning("NextTask(pass %d): %s", pass_id, exc)
                    continue
                # finishes it carried that the master did not take for now are queued again
                # already (_on_response)
                if not isinstance(exc, UnavailableError):
                    raise
                if attempt == 0:
                    log.warning("NextTask(pass %d): %s; retrying with backoff", pass_id, exc)
                link = self._link
                cancel.sleep(backoff_delay(attempt, link.backoff_base, link.backoff_max))
                attempt += 1
                continue
            if resp.WhichOneof("body") == "tasks":
                tasks = [task_from_pb(t) for t in resp.tasks.tasks]
            else:
                tasks = [task_from_pb(resp.task)]
            return Dispatched(tasks, reply.generation)

    def finished(self, task: Task, *, last: bool = False) -> None:
        """Queue the finish of `task`: it rides on the next NextTask, or goes alone soon;
        `last` (the trainer holds no other task, so no other finish is coming to share the
        message, and the pass may be waiting for this one to end) while a task request is in
        flight (a long poll, maybe, that nothing rides on): alone at once."""
        meta = task.meta
        pos = pb.TaskPosition(
            task_id=meta.id, epoch=meta.epoch, pass_id=task.pass_id, records=task_records(task)
        )
        with self._lock:
            self._finishes.append(pos)
            # A task request in flight may be a long poll: the finish does not wait for it.
            asking = self._asking()
            if last and asking:
                sooner = self._arm_flush(0.0)
            else:
                sooner = self._arm_flush(FINISH_FLUSH_ASKING if asking else FINISH_FLUSH)
        if sooner:  # the session's thread sleeps until the time it knew: wake it
            self._wake.set()

    def failed(self, task: Task, reason: str, at: Position | None = None) -> None:
        """Report `task` failed; `at`, the records of it consumed before the failure, goes
        first (as progress) so that the master hands the task out again from there."""
        meta = task.meta
        msg = pb.TaskFailedRequest(meta=pb.TaskMeta(id=meta.id, epoch=meta.epoch), reason=reason)
        with self._lock:
            if at is not None:
                self._send("keep_alive", pb.KeepAlive(progress=[position_to_pb(at)]), False)
            self._send("failed", msg, answered=True)

    def hand_back(self, positions: Sequence[Position]) -> None:
        """Hand held tasks back at `positions` (their pass is no longer read here): at once,
        for any trainer, not at the end of the session or after a timeout. Sent again after a
        reconnect until answered (a repeat changes nothing)."""
        if not positions:
            return
        with self._lock:
            if self._closing:
                return  # the Goodbye hands them back
            msg = pb.Return(positions=[position_to_pb(p) for p in positions])
            self._send("returned", msg, answered=True)

    def settle(self, wake: Callable[[], None]) -> Reply | None:
        """Send the queued finishes now, in a message the master answers once it has applied
        them and everything sent before (it handles a stream's messages in order); `wake` is
        called when the answer (or an error) comes later (check `done` first). None if the
        client is closing.

        Before a trainer reads a task that failed before, and after it finishes one, so that
        if it dies then the master knows which task it was reading (docs/failures.md).
        """
        with self._lock:
            if self._closing:
                return None
            msg = pb.NextTask(finished=self._take_finishes())
            reply = self._send("next", msg, answered=True)
        assert reply is not None
        reply.on_done(wake)
        return reply

    def commit(self, positions: Sequence[Position], timeout: float | None = None) -> None:
        """Send a Commit (after the finishes queued before it) and return once it is durable.
        Refused "not now" (a store outage), it goes again with backoff, the finishes before
        it, until answered or `timeout` s have passed (TimeoutError). Raises the master's
        error otherwise; Cancelled or CallCancelled once the session closes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        attempt = 0
        while True:
            with self._lock:
                if self._closing:
                    raise Cancelled()
                self._flush_finishes()
                reply = self._send(
                    "commit", pb.Commit(positions=[position_to_pb(p) for p in positions]), True
                )
            assert reply is not None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                reply.result(left)
                return
            except TRY_AGAIN as exc:
                delay = self._backoff(attempt)
                if deadline is not None and time.monotonic() + delay >= deadline:
                    raise TimeoutError(f"commit not made durable within {timeout}s: {exc}") from exc
                if attempt == 0:
                    log.warning("commit: %s; sending it again with backoff", exc)
                self._token.sleep(delay)
                attempt += 1

    def lease_ok(self) -> bool:
        """Whether the trainer may hand out records of its tasks: the master answered a
        message sent less than LEASE_SAFE x ttl ago, so the session still holds them. If not,
        a ping goes out and `on_alive` (or `on_lost`) follows. Called with the client's lock
        held (not this session's)."""
        ttl = self._ttl
        if ttl <= 0:
            return True  # no Welcome yet, so no task either
        now = time.monotonic()
        self._fence_used = now
        if now < self._heard_at + LEASE_SAFE * ttl:
            return True
        if self._failure is not None:  # the master could not be reached in retry_timeout
            raise self._failure
        self._fence_waiting = True
        self._ping_due = True
        self._wake.set()
        return False

    def report_now(self) -> None:
        """Send progress soon: enough records were consumed since the last report. Called
        at run boundaries (client lock held) until it is sent; the session's thread sends
        it, at most every REPORT_GAP seconds (each wake of another thread costs the trainer's
        thread a turn of the GIL)."""
        self._report_due = True
        if time.monotonic() - self._reported >= REPORT_GAP:
            self._wake.set()

    def close(self, positions: Sequence[Position], timeout: float) -> None:
        """Say Goodbye, handing the held tasks back at `positions`; wait (bounded) for the ack.
        A Goodbye refused "not now" (a store outage) goes again with backoff, after the
        finishes refused with it, until acknowledged or `timeout` s have passed. Then stop:
        whoever waits for an answer is told, the streams' calls are cancelled, the session's
        thread told to end (`join()` waits for the threads)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closing:
                return
            self._closing = True
            opened = bool(self._session_id) or self._stream is not None
        self._wake.set()
        try:
            attempt = 0
            while opened:  # never opened: nothing to hand back
                with self._lock:
                    self._flush_finishes()
                    msg = pb.Goodbye(progress=[position_to_pb(p) for p in positions])
                    reply = self._send("goodbye", msg, answered=True)
                assert reply is not None
                try:
                    ack = reply.result(max(0.0, deadline - time.monotonic()))
                except TRY_AGAIN:
                    delay = self._backoff(attempt)
                    if time.monotonic() + delay >= deadline:
                        raise
                    self._answered_finishes(deadline)  # refused ones are queued again
                    time.sleep(delay)
                    attempt += 1
                    continue
                log.info(
                    "session %s closed; %d task(s) handed back", self._session_id, ack.ack.applied
                )
                break
        except TimeoutError:
            log.warning(
                "session %s: no answer to Goodbye within %.1fs; the master hands this "
                "trainer's tasks back when its lease runs out",
                self._session_id,
                timeout,
            )
        except MasterError as exc:
            log.warning("session %s: Goodbye: %s", self._session_id, exc)
        except TransportError as exc:  # the session's reconnects gave up (retry_timeout)
            log.warning(
                "session %s: Goodbye not sent (%s); the master hands this trainer's tasks back "
                "when its lease runs out",
                self._session_id,
                exc,
            )
        finally:
            self._token.cancel()
            with self._lock:
                self._stream = None
                streams = list(self._streams)
                pending, self._pending = self._pending, {}
                unsent = len(self._finishes) + sum(
                    len(p.request.next.finished) for p in pending.values() if p.reply.kind == "next"
                )
            if unsent:
                log.warning(
                    "session %s closed with %d finish(es) the master did not take; those "
                    "tasks go back when the session's lease runs out, from their last reported "
                    "position",
                    self._session_id,
                    unsent,
                )
            for p in pending.values():  # whoever still waits (a commit) learns it is over
                p.reply.cancel()
            for open_stream in streams:
                open_stream.close()
            self._wake.set()

    def join(self, deadline: float) -> list[str]:
        """After close(): wait (until `deadline`, time.monotonic()) for the session's thread,
        and for each stream's reader and gRPC's thread sending its requests, to be gone. The
        names of those still alive then."""
        left = join_all([self._thread], deadline)
        with self._lock:
            streams, self._streams = self._streams, []
        for stream in streams:  # their calls are cancelled: each thread leaves at once
            left += stream.join(deadline)
        return left

    # ---- sending (lock held) -----------------------------------------------------------------

    def _send(self, kind: str, msg: Any, answered: bool) -> Reply | None:
        self._seq += 1
        req = pb.SessionRequest(seq=self._seq, **{kind: msg})
        reply = None
        stream = self._stream
        if answered:
            reply = Reply(kind)
            sent = 0.0 if stream is None else time.monotonic()
            self._pending[self._seq] = _Pending(req, reply, sent)
        if stream is not None:
            stream.send(req)
        return reply

    def _maybe_ping(self, now: float) -> None:
        """Ask for an answer (an empty NextTask) when lease_ok() found the lease in doubt, or
        ahead of that while the trainer reads and the master has not answered for a third of
        the TTL, so that the trainer does not wait for it."""
        if self._ping is not None and not self._ping.done:
            return
        reading = self._fence_used > self._pinged_at
        if not self._ping_due and not (reading and now - self._heard_at > self._ttl / 3):
            return
        self._ping_due = False
        self._pinged_at = now
        self._ping = self._send("next", pb.NextTask(), answered=True)

    def _take_finishes(self) -> list[pb.TaskPosition]:
        finished, self._finishes = self._finishes, []
        self._flush_at = None
        return finished

    def _asking(self) -> bool:
        """A task request is in flight (a long poll, maybe): nothing rides on one soon."""
        return any(
            p.reply.kind == "next" and p.request.next.want_task and not p.reply.cancelled
            for p in self._pending.values()
        )

    def _arm_flush(self, after: float = FINISH_FLUSH) -> bool:
        """Send the queued finishes alone in `after` s at the latest (not before a retry's
        backoff is over). Whether that is sooner than the time set before."""
        at = time.monotonic() + after
        if self._finish_retry_at is not None:
            at = max(at, self._finish_retry_at)
        if self._flush_at is None or at < self._flush_at:
            self._flush_at = at
            return True
        return False

    def _flush_finishes(self) -> None:
        if self._finishes:
            self._send("next", pb.NextTask(finished=self._take_finishes()), answered=True)

    def _backoff(self, attempt: int) -> float:
        return backoff_delay(attempt, self._link.backoff_base, self._link.backoff_max)

    def _finishes_refused(self, finished: Sequence[pb.TaskPosition], why: MasterError) -> None:
        """The master did not apply these finishes, for now: queue them again (lock held);
        they go with the next message that carries finishes, or alone after a backoff."""
        if self._finish_retries == 0:
            log.warning(
                "session %s: the master did not take the finish of task(s) %s (%s); sending "
                "them again with backoff",
                self._session_id,
                ", ".join(str(p.task_id) for p in finished),
                why,
            )
        self._finish_retry_at = time.monotonic() + self._backoff(self._finish_retries)
        self._finish_retries += 1
        self._finishes[:0] = finished
        self._flush_at = None
        self._arm_flush()

    def _answered_finishes(self, deadline: float) -> None:
        """Wait (until `deadline`) for the answers to the finishes in flight."""
        with self._lock:
            replies = [
                p.reply
                for p in self._pending.values()
                if p.reply.kind == "next" and p.request.next.finished
            ]
        for reply in replies:
            with contextlib.suppress(Exception):
                reply.result(max(0.0, deadline - time.monotonic()))

    def _fail_pending(self, exc: BaseException) -> None:
        """Give every waiter `exc` (the master cannot be reached, or refuses this trainer);
        the finishes they carried stay queued for the next stream."""
        with self._lock:
            pending, self._pending = self._pending, {}
            for p in pending.values():
                if p.reply.kind == "next" and p.request.next.finished:
                    self._finishes[:0] = p.request.next.finished
                    self._arm_flush()
        for p in pending.values():
            p.reply.fail(exc)

    def _renew(self) -> None:
        """The session ended on the master: the next Hello opens a new one, and the pending
        task requests get fresh IDs (the old IDs belong to the old session's dispatches). Its
        finishes and failures not yet applied are dropped: those tasks went to others, whose
        reports they are now (the new session's would be refused)."""
        self._session_id = ""
        self.generation += 1
        self._finishes = []
        self._flush_at = None
        self._finish_retries, self._finish_retry_at = 0, None
        for seq, p in list(self._pending.items()):
            if p.reply.kind == "failed":
                del self._pending[seq]
                p.reply.cancel()
                continue
            if p.reply.kind != "next":
                continue
            want = p.request.next.want_task
            if want and p.reply.cancelled:
                del self._pending[seq]
                continue
            req = pb.SessionRequest()
            req.CopyFrom(p.request)
            del req.next.finished[:]
            if want:
                req.next.request_id = uuid.uuid4().hex
            self._pending[seq] = _Pending(req, p.reply)

    def _lost(self, old: str) -> None:
        """Tell the client its session `old` ended on the master (no lock held)."""
        log.warning(
            "session %s ended while this trainer was away (its tasks went to other trainers); "
            "opening a new session",
            old,
        )
        if self._on_lost is not None:
            self._on_lost()

    def _unreachable(self, exc: Exception) -> None:
        """The master stayed out of reach (no lock held): a trainer fenced waits no more."""
        self._failure = exc
        if self._fence_waiting:
            self._fence_waiting = False
            if self._on_alive is not None:
                self._on_alive()

    def _heard(self, sent_at: float) -> None:
        """The master answered a message sent at `sent_at` (no lock held): the lease held then."""
        if sent_at > self._heard_at:
            self._heard_at = sent_at
        if self._fence_waiting and self._heard_at + LEASE_SAFE * self._ttl > time.monotonic():
            self._fence_waiting = False
            if self._on_alive is not None:
                self._on_alive()

    # ---- the session's thread ------------------------------------------------------------

    def _main(self) -> None:
        while not self._token.cancelled:
            try:
                stream = self._connect()
            except Cancelled:
                return
            except TransportError as exc:  # retry_timeout or startup_timeout ran out: the
                self._fail_pending(exc)  # waiters get the error; the next try after a pause
                self._unreachable(exc)  # (a master never reached fails the next one at once)
                try:
                    self._token.sleep(self._link.backoff_max)
                except Cancelled:
                    return
                continue
            except UnauthenticatedError as exc:  # no retry mends a wrong token or certificate
                self._fail_pending(exc)
                self._unreachable(exc)
                log.error("Session: %s", exc)
                try:
                    self._token.sleep(self._link.backoff_max)
                except Cancelled:
                    return
                continue
            self._serve(stream)
            with self._lock:
                if self._stream is stream:
                    self._stream = None
            if self._said_goodbye:
                return

    def _connect(self) -> _Stream:
        attempt = 0
        while True:
            try:
                return self._link.call("Session", self._open, self._token)
            except SessionExpiredError:
                with self._lock:
                    closing = self._closing
                    old = self._session_id
                    self._renew()
                if closing:
                    self._end_goodbye()
                    raise Cancelled() from None
                self._lost(old)
            except UnauthenticatedError:
                raise
            except MasterError as exc:
                log.warning("Session: the master refused Hello: %s; retrying", exc)
                self._token.sleep(
                    backoff_delay(attempt, self._link.backoff_base, self._link.backoff_max)
                )
                attempt += 1

    def _end_goodbye(self) -> None:
        """The session is over without a Goodbye's ack: release whoever waits for it."""
        with self._lock:
            for seq, p in list(self._pending.items()):
                if p.reply.kind == "goodbye":
                    del self._pending[seq]
                    p.reply.resolve(pb.SessionResponse(seq=seq, ack=pb.Ack(applied=0)))
            self._said_goodbye = True

    def _open(self, conn: MasterConnection) -> _Stream:
        """Open a stream and say Hello; once welcomed, send everything pending again."""
        stream = _Stream(conn.addr)
        with self._lock:
            stream.generation = self.generation
            if self._closing and not self._session_id:
                self._said_goodbye = True
                raise Cancelled()
            self._seq += 1
            stream.hello_seq = self._seq
            hello = pb.SessionRequest(
                seq=self._seq,
                hello=pb.Hello(
                    session_id=self._session_id,
                    name=self.name,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    report_every=self._report_every,
                    world_size=self._world_size,
                    rank=self._rank,
                ),
            )
            resuming = self._session_id
        hello_sent = time.monotonic()
        stream.send(hello)
        stream.call = conn.open_session(stream.requests())
        reader = threading.Thread(
            target=self._read,
            args=(stream,),
            name=f"chunkmaster-session-read-{self.name}",
            daemon=True,
        )
        stream.reader = reader
        with self._lock:
            self._streams = [s for s in self._streams if not s.let_go()] + [stream]
        reader.start()
        timeout = self._link.rpc_timeout
        try:
            resp = self._token.run(_Bounded(stream.hello, timeout))
        except TimeoutError:
            stream.close()
            no_welcome = grpc.RpcError(f"no Welcome within {timeout}s")
            raise TransportError(conn.addr, no_welcome) from None
        except BaseException:
            stream.close()
            raise
        welcome = resp.welcome
        with self._lock:
            self._session_id = welcome.session_id
            if welcome.keep_alive_seconds > 0:
                self.keep_alive_seconds = welcome.keep_alive_seconds
            self._ttl = max(0.0, welcome.ttl_seconds)
            self._failure = None
            now = time.monotonic()
            for seq in sorted(self._pending):
                entry = self._pending[seq]
                entry.sent_at = now
                stream.send(entry.request)
            resent = len(self._pending)
            self._stream = stream
            stream.welcomed = True
        self._heard(hello_sent)
        if resuming:
            log.warning(
                "session %s resumed with the master at %s (%d message(s) sent again)",
                welcome.session_id,
                conn.addr,
                resent,
            )
        else:
            log.info("session %s opened with the master at %s", welcome.session_id, conn.addr)
        return stream

    def _serve(self, stream: _Stream) -> None:
        """Keep-alives with progress, and finishes nothing else carried, until the stream
        breaks or the session closes."""
        period = min(self.keep_alive_seconds, self._report_interval)
        next_keep_alive = time.monotonic() + period
        while not stream.broken.is_set() and not self._token.cancelled:
            with self._lock:
                flush_at = self._flush_at
            now = time.monotonic()
            timeout = next_keep_alive - now
            if flush_at is not None:
                timeout = min(timeout, flush_at - now)
            if self._report_due:
                timeout = min(timeout, self._reported + REPORT_GAP - now)
            if timeout > 0:
                self._wake.wait(timeout)
            self._wake.clear()
            if stream.broken.is_set() or self._token.cancelled:
                return
            now = time.monotonic()
            with self._lock:
                if self._flush_at is not None and now >= self._flush_at:
                    self._flush_finishes()
                if not self._closing:
                    self._maybe_ping(now)
            due = self._report_due and now - self._reported >= REPORT_GAP
            if due or now >= next_keep_alive:
                self._report_due = False
                progress = [position_to_pb(p) for p in self._progress()]
                wait = None
                periodic = now >= next_keep_alive
                if self._data_wait is not None and (periodic or now >= self._waits_at):
                    wait = self._data_wait()
                    self._waits_at = now + DATA_WAIT_EVERY
                with self._lock:
                    if not self._closing:
                        # A finish waits no longer than a progress report: a finished task is
                        # gone from the positions, and a trainer that dies before it was sent
                        # would have it delivered again from its last reported position.
                        # (Finishes refused "not now" wait for their backoff instead.)
                        retry_at = self._finish_retry_at
                        if retry_at is None or now >= retry_at:
                            self._flush_finishes()
                        keep_alive = pb.KeepAlive(progress=progress, data_wait=wait)
                        self._send("keep_alive", keep_alive, False)
                self._reported = now
                next_keep_alive = now + period

    # ---- the reader thread of one stream ----------------------------------------------------

    def _read(self, stream: _Stream) -> None:
        why: BaseException | None = None
        try:
            for resp in stream.call:
                self._on_response(stream, resp)
        except grpc.RpcError as exc:
            why = exc
        except Exception as exc:  # a bug here must not leave the session silent
            log.exception("session %s: reading the stream failed", self._session_id)
            why = exc
        finally:
            stream.broken.set()
            refused = error_from_rpc(why) if isinstance(why, grpc.RpcError) else None
            stream.hello.fail(
                refused
                if isinstance(refused, UnauthenticatedError)
                else TransportError(
                    stream.addr,
                    why if isinstance(why, grpc.RpcError) else grpc.RpcError("the stream ended"),
                )
            )
            with self._lock:
                if self._stream is stream:
                    self._stream = None
                closing = self._closing
            quiet = closing or stream.expired or not stream.welcomed or self._token.cancelled
            if why is not None and not quiet:
                log.warning(
                    "session %s: stream broken (%s); reconnecting",
                    self._session_id,
                    TransportError(stream.addr, why) if isinstance(why, grpc.RpcError) else why,
                )
            self._wake.set()
            # What is queued goes again on the next stream (it is pending). gRPC's sending
            # thread leaves requests(); close() joins it.
            stream.end()

    def _on_response(self, stream: _Stream, resp: pb.SessionResponse) -> None:
        if resp.seq == stream.hello_seq and not stream.hello.done:
            stream.hello.resolve(resp)
            return
        if stream.expired:
            return  # the old session's: what it answers now is no longer this trainer's
        kind = resp.WhichOneof("body")
        if kind == "error" and resp.error.error == SessionExpiredError.__name__:
            self._expired(stream, resp.seq)
            return
        with self._lock:
            entry = self._pending.pop(resp.seq, None)
            if entry is not None and entry.reply.kind == "goodbye" and kind != "error":
                self._said_goodbye = True
            if entry is not None and entry.reply.kind == "next" and entry.request.next.finished:
                refused = session_error(resp.error) if kind == "error" else None
                if isinstance(refused, TRY_AGAIN):
                    self._finishes_refused(entry.request.next.finished, refused)
                elif isinstance(refused, PermissionDeniedError) and (
                    len(entry.request.next.finished) > 1
                ):
                    # One of them is on a task no longer this session's (its dispatch timed
                    # out and went to another trainer), which refused them all and changed
                    # nothing: each goes again alone, judged on its own.
                    for one in entry.request.next.finished:
                        self._send("next", pb.NextTask(finished=[one]), answered=True)
                else:
                    self._finish_retries, self._finish_retry_at = 0, None
                    if refused is not None and not entry.request.next.want_task:
                        # for good: sending them again cannot change that (a task request's
                        # error is its fetcher's to raise)
                        log.warning(
                            "session %s: the master refused the finish of task(s) %s: %s",
                            self._session_id,
                            ", ".join(str(p.task_id) for p in entry.request.next.finished),
                            refused,
                        )
        if kind == "error" and entry is not None and entry.reply.kind == "next":
            self._wake.set()  # the finishes may go again once their backoff is over
        if entry is not None:
            self._heard(entry.sent_at)  # answered under the session: its lease was renewed
        if entry is None:
            if kind == "error":
                log.warning("session %s: master: %s", self._session_id, session_error(resp.error))
            return
        entry.reply.generation = stream.generation
        if entry.reply.resolve(resp):
            return
        if kind == "task":  # its request was given up on: hand the task to whoever can use it
            self._on_unclaimed(task_from_pb(resp.task))
        elif kind == "tasks":  # the same, for a request of several
            for t in resp.tasks.tasks:
                self._on_unclaimed(task_from_pb(t))
        elif kind == "error" and entry.reply.kind in ("failed", "next"):
            log.warning(
                "session %s: %s report: %s",
                self._session_id,
                entry.reply.kind,
                session_error(resp.error),
            )

    def _expired(self, stream: _Stream, seq: int) -> None:
        """The master no longer knows this session: open a new one on a new stream."""
        with self._lock:
            if stream.expired:
                return
            stream.expired = True
            closing = self._closing
            old = self._session_id
            self._renew()
        if closing:  # the session is over anyway: that is what Goodbye asked for
            self._end_goodbye()
            stream.close()
            return
        self._lost(old)
        stream.close()


class _Bounded:
    """A Reply awaited with a timeout, cancellable through a CancelToken."""

    def __init__(self, reply: Reply, timeout: float) -> None:
        self._reply = reply
        self._timeout = timeout

    def result(self) -> pb.SessionResponse:
        return self._reply.result(self._timeout)

    def cancel(self) -> None:
        self._reply.cancel()
