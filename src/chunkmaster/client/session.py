"""The trainer's session: one long-lived bidirectional stream to the master (docs/sessions.md).

Callers send from their own threads: the pass fetcher a NextTask, which carries the finishes
queued since the last one (a finish and the next request travel in one message); the client a
Commit, a hand-back or the Goodbye. The session's thread (session_thread.py) keeps the stream
open and alive and reads the answers. Its pure parts: what awaits an answer (outbox.py), the
finishes not yet applied (finishes.py), and the lease fence (lease.py), which says whether
the trainer may still hand out records of its tasks.

A finish is never dropped while its session lasts: one the master answers with "not now"
(answers.Act.RETRY) goes back into the queue and out again with backoff, in whichever message
carries it (a NextTask, alone, before a Commit or the Goodbye), until the master applies it
or answers that it is moot or refuses it for good (logged). A session that ended while the
trainer was away drops them: those tasks went to other trainers, whose reports they are now.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from chunkmaster.client.answers import Act, meaning
from chunkmaster.client.connection import TransportError, join_all
from chunkmaster.client.link import Cancelled, CancelToken, MasterLink
from chunkmaster.client.session_thread import REPORT_GAP, SessionState, SessionThread, Trainer
from chunkmaster.client.stream import Dispatched, Reply, position_to_pb
from chunkmaster.core.errors import MasterError, PermissionDeniedError
from chunkmaster.core.model import Position, Task
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc.wire import MAX_BATCH, task_from_pb
from chunkmaster.waitlog import WaitLog

log = logging.getLogger("chunkmaster.client")


class TrainerSession:
    """The client side of one trainer's session, across reconnects and renewals.

    `progress()` returns the positions to send with a keep-alive (called without this
    session's lock: it takes the client's). `on_unclaimed(task)` gets a task that arrived for
    a request its sender gave up on (a pass abandoned meanwhile). `on_lost()` is called when
    the master ended the session while the trainer was away (its tasks are others' now),
    before a new session is opened; `on_alive()` when the master answered while `lease_ok()`
    had said no. Both are called without this session's lock.
    """

    max_batch = MAX_BATCH

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
        self.name = name
        self._state = SessionState()
        trainer = Trainer(
            name, report_every, report_interval, progress, world_size, rank, data_wait
        )
        self._thread = SessionThread(link, self._state, trainer, on_unclaimed, on_lost, on_alive)

    @property
    def session_id(self) -> str:
        """The master's ID of this session ("" until the first Welcome)."""
        return self._state.session_id

    @property
    def generation(self) -> int:
        """Sessions found lost so far: tasks got in an older one are someone else's now."""
        return self._state.generation

    # ---- what callers send ----------------------------------------------------------------

    def next_tasks(
        self, pass_id: int, count: int, wait: float, request_id: str, cancel: CancelToken
    ) -> list[Task]:
        """Up to `count` tasks of `pass_id` in one message (at least one: the master waits up
        to `wait` s for it), with the finishes queued meanwhile riding along. Raises the
        master's answer otherwise, or Cancelled."""
        waits = WaitLog(log, f"NextTask(pass {pass_id})")
        while True:
            with self._state.lock:
                if self._state.closing:
                    raise Cancelled()
                finished = self._state.finishes.take()
                msg = pb.NextTask(
                    finished=finished,
                    want_task=True,
                    pass_id=pass_id,
                    wait_seconds=wait,
                    request_id=request_id,
                    max_tasks=count if count > 1 else 0,
                )
                reply = self._send("next", msg)
            try:
                resp = cancel.run(reply)
                if reply.generation != self._state.generation:
                    continue  # answered in a session lost since: its tasks went to others
            except MasterError as exc:
                if finished and isinstance(exc, PermissionDeniedError):
                    # A finish on a task no longer this session's refuses the whole message,
                    # and nothing changed: each finish goes again alone (session_thread), the
                    # request without them.
                    log.warning("NextTask(pass %d): %s", pass_id, exc)
                    continue
                # finishes it carried that the master did not take for now are queued again
                # already (session_thread)
                if meaning(exc).task is not Act.RETRY:
                    raise
                waits.wait(type(exc), f"{exc}; retrying with backoff")
                cancel.sleep(self._thread.backoff(waits.attempts - 1))
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
            task_id=meta.id, epoch=meta.epoch, pass_id=task.pass_id, records=task.num_records
        )
        st = self._state
        with st.lock:
            asking = st.outbox.asking()
            sooner = st.finishes.add(pos, time.monotonic(), asking=asking, last=last)
        if sooner:  # the session's thread sleeps until the time it knew: wake it
            self._thread.wake.set()

    def failed(self, task: Task, reason: str, at: Position | None = None) -> None:
        """Report `task` failed; `at`, the records of it consumed before the failure, goes
        first (as progress) so that the master hands the task out again from there."""
        meta = task.meta
        msg = pb.TaskFailedRequest(meta=pb.TaskMeta(id=meta.id, epoch=meta.epoch), reason=reason)
        with self._state.lock:
            if at is not None:
                self._state.send("keep_alive", pb.KeepAlive(progress=[position_to_pb(at)]), False)
            self._send("failed", msg)

    def hand_back(self, positions: Sequence[Position]) -> None:
        """Hand held tasks back at `positions` (their pass is no longer read here): at once,
        for any trainer, not at the end of the session or after a timeout. Sent again after a
        reconnect until answered (a repeat changes nothing)."""
        if not positions:
            return
        with self._state.lock:
            if self._state.closing:
                return  # the Goodbye hands them back
            self._send("returned", pb.Return(positions=[position_to_pb(p) for p in positions]))

    def settle(self, wake: Callable[[], None]) -> Reply | None:
        """Send the queued finishes now, in a message the master answers once it has applied
        them and everything sent before (it handles a stream's messages in order); `wake` is
        called when the answer (or an error) comes later (check `done` first). None if the
        client is closing.

        Before a trainer reads a task that failed before, and after it finishes one, so that
        if it dies then the master knows which task it was reading (docs/failures.md).
        """
        with self._state.lock:
            if self._state.closing:
                return None
            reply = self._send("next", pb.NextTask(finished=self._state.finishes.take()))
        reply.on_done(wake)
        return reply

    def commit(self, positions: Sequence[Position], timeout: float | None = None) -> None:
        """Send a Commit (after the finishes queued before it) and return once it is durable.
        Refused "not now" (a store outage), it goes again with backoff, the finishes before
        it, until answered or `timeout` s have passed (TimeoutError). Raises the master's
        error otherwise; Cancelled or CallCancelled once the session closes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waits = WaitLog(log, "commit")
        while True:
            with self._state.lock:
                if self._state.closing:
                    raise Cancelled()
                self._state.flush_finishes()
                msg = pb.Commit(positions=[position_to_pb(p) for p in positions])
                reply = self._send("commit", msg)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                reply.result(left)
                return
            except MasterError as exc:
                if meaning(exc).report is not Act.RETRY:
                    raise
                delay = self._thread.backoff(waits.attempts)
                if deadline is not None and time.monotonic() + delay >= deadline:
                    raise TimeoutError(f"commit not made durable within {timeout}s: {exc}") from exc
                waits.wait(type(exc), f"{exc}; sending it again with backoff")
                self._thread.token.sleep(delay)

    def lease_ok(self) -> bool:
        """Whether the trainer may hand out records of its tasks (lease.LeaseFence). If not, a
        ping goes out and `on_alive` (or `on_lost`) follows. Called with the client's lock
        held (not this session's)."""
        if self._state.fence.ok(time.monotonic()):
            return True
        self._thread.wake.set()
        return False

    def report_now(self) -> None:
        """Send progress soon: enough records were consumed since the last report. Called
        at run boundaries (client lock held) until it is sent; the session's thread sends
        it, at most every REPORT_GAP seconds (each wake of another thread costs the trainer's
        thread a turn of the GIL)."""
        thread = self._thread
        thread.report_due = True
        if time.monotonic() - thread.reported >= REPORT_GAP:
            thread.wake.set()

    # ---- the end ---------------------------------------------------------------------------

    def close(self, positions: Sequence[Position], timeout: float) -> None:
        """Say Goodbye, handing the held tasks back at `positions`; wait (bounded) for the ack.
        A Goodbye refused "not now" (a store outage) goes again with backoff, after the
        finishes refused with it, until acknowledged or `timeout` s have passed. Then stop:
        whoever waits for an answer is told, the streams' calls are cancelled, the session's
        thread told to end (`join()` waits for the threads)."""
        st = self._state
        with st.lock:
            if st.closing:
                return
            st.closing = True
            opened = bool(st.session_id) or st.outbox.stream is not None
        self._thread.wake.set()
        try:
            if opened:  # never opened: nothing to hand back
                self._goodbye(positions, time.monotonic() + timeout)
        except (TimeoutError, TransportError) as exc:  # or the reconnects gave up
            log.warning(
                "session %s: Goodbye not acknowledged (%s); the master hands this trainer's "
                "tasks back when its lease runs out",
                st.session_id,
                exc,
            )
        except MasterError as exc:
            log.warning("session %s: Goodbye: %s", st.session_id, exc)
        finally:
            self._stop()

    def _goodbye(self, positions: Sequence[Position], deadline: float) -> None:
        """Send the Goodbye until acknowledged; refused "not now", again after a backoff."""
        attempt = 0
        while True:
            with self._state.lock:
                self._state.flush_finishes()
                reply = self._send(
                    "goodbye", pb.Goodbye(progress=[position_to_pb(p) for p in positions])
                )
            try:
                ack = reply.result(max(0.0, deadline - time.monotonic()))
            except MasterError as exc:
                delay = self._thread.backoff(attempt)
                if meaning(exc).report is not Act.RETRY or time.monotonic() + delay >= deadline:
                    raise
                self._answered_finishes(deadline)  # refused ones are queued again
                time.sleep(delay)
                attempt += 1
                continue
            log.info(
                "session %s closed; %d task(s) handed back", self._state.session_id, ack.ack.applied
            )
            return

    def _stop(self) -> None:
        """Tell whoever still waits (a commit) that the session is over; cancel the calls."""
        st = self._state
        self._thread.token.cancel()
        with st.lock:
            st.outbox.stream = None
            streams = list(st.streams)
            pending = st.outbox.take_all()
            unsent = len(st.finishes) + sum(len(p.finished) for p in pending)
        if unsent:
            log.warning(
                "session %s closed with %d finish(es) the master did not take; those "
                "tasks go back when the session's lease runs out, from their last reported "
                "position",
                st.session_id,
                unsent,
            )
        for p in pending:
            p.reply.cancel()
        for open_stream in streams:
            open_stream.close()
        self._thread.wake.set()

    def join(self, deadline: float) -> list[str]:
        """After close(): wait (until `deadline`, time.monotonic()) for the session's thread,
        and for each stream's reader and gRPC's thread sending its requests, to be gone. The
        names of those still alive then."""
        left = join_all([self._thread.thread], deadline)
        with self._state.lock:
            streams, self._state.streams = self._state.streams, []
        for stream in streams:  # their calls are cancelled: each thread leaves at once
            left += stream.join(deadline)
        return left

    # ---- sending (lock held) -----------------------------------------------------------------

    def _send(self, kind: str, msg: Any) -> Reply:
        """Send a message the master answers; the Reply to wait on."""
        reply = self._state.outbox.send(kind, msg, True, time.monotonic())
        assert reply is not None
        return reply

    def _answered_finishes(self, deadline: float) -> None:
        """Wait (until `deadline`) for the answers to the finishes in flight."""
        with self._state.lock:
            replies = self._state.outbox.carrying_finishes()
        for reply in replies:
            with contextlib.suppress(Exception):
                reply.result(max(0.0, deadline - time.monotonic()))
