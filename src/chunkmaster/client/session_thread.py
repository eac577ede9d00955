"""The session's thread: the threaded part of a trainer's session (session.py).

It opens the stream (Hello, then Welcome: through the link's addresses, backoff and etcd
lookups), sends again what was not answered when a stream broke, and sends the keep-alives
that carry progress and the finishes nothing else carried. A reader thread per stream hands
each answer to the `Reply` its sender waits on, and judges the answers to finishes
(finishes.py). If the session ended while the trainer was away (SessionExpiredError), its
tasks went to other trainers: `on_lost` tells the client to stop reading them, and a new
session is opened, in which what is still pending goes out (outbox.py).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from chunkmaster.client.answers import Act, meaning
from chunkmaster.client.connection import MasterConnection, TransportError
from chunkmaster.client.finishes import FinishQueue, Verdict
from chunkmaster.client.lease import LeaseFence
from chunkmaster.client.link import Cancelled, CancelToken, MasterLink, backoff_delay
from chunkmaster.client.outbox import Outbox, Pending
from chunkmaster.client.stream import Bounded, Reply, SessionStream, position_to_pb, session_error
from chunkmaster.core.errors import MasterError, SessionExpiredError, UnauthenticatedError
from chunkmaster.core.model import Position, Task
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc.wire import error_from_rpc, task_from_pb
from chunkmaster.waitlog import WaitLog

log = logging.getLogger("chunkmaster.client")

REPORT_GAP = 0.1
"""Seconds between two progress reports at least: above report_every / REPORT_GAP records per
second, a report covers more than report_every records (REPORT_GAP seconds' worth). Each
report costs the master about a millisecond: a trainer reporting every 20 ms took 5% of a
core of it, a hundred of them five cores."""

DATA_WAIT_EVERY = 1.0
"""Seconds between two data-wait figures sent with progress reports, at least (the periodic
keep-alive carries them too)."""


@dataclass
class SessionState:
    """What the callers' side of a session and its thread share, guarded by `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    outbox: Outbox = field(default_factory=Outbox)
    finishes: FinishQueue = field(default_factory=FinishQueue)
    fence: LeaseFence = field(default_factory=LeaseFence)
    session_id: str = ""  # the master's ID of the session ("" until a Welcome)
    generation: int = 0  # sessions found lost so far: tasks of an older one are not ours
    closing: bool = False
    said_goodbye: bool = False
    streams: list[SessionStream] = field(default_factory=list)  # not over: joined at close

    def send(self, kind: str, msg: object, answered: bool) -> None:
        """Send without awaiting (lock held)."""
        self.outbox.send(kind, msg, answered, time.monotonic())

    def flush_finishes(self) -> None:
        """The queued finishes go now, alone (lock held)."""
        if len(self.finishes):
            msg = pb.NextTask(finished=self.finishes.take())
            self.outbox.send("next", msg, True, time.monotonic())


@dataclass(frozen=True)
class Trainer:
    """Who the trainer is, said in every Hello, and what its keep-alives carry."""

    name: str
    report_every: int
    report_interval: float
    progress: Callable[[], list[Position]]
    world_size: int = 0
    rank: int = 0
    data_wait: Callable[[], pb.DataWait | None] | None = None


class SessionThread:
    """The thread that keeps a session's stream open and alive, and the readers of its
    streams. `on_unclaimed`, `on_lost` and `on_alive` are called without the state's lock."""

    def __init__(
        self,
        link: MasterLink,
        state: SessionState,
        trainer: Trainer,
        on_unclaimed: Callable[[Task], None],
        on_lost: Callable[[], None] | None,
        on_alive: Callable[[], None] | None,
    ) -> None:
        self._link = link
        self._state = state
        self._trainer = trainer
        self._on_unclaimed = on_unclaimed
        self._on_lost = on_lost
        self._on_alive = on_alive
        self.keep_alive_seconds = trainer.report_interval
        self.token = CancelToken()
        self.wake = threading.Event()
        self.report_due = False
        self.reported = 0.0  # when progress was last sent (time.monotonic())
        self._waits_at = 0.0  # when data-wait figures may go with a report again
        self._ping: Reply | None = None
        self.thread = threading.Thread(
            target=self._main, name=f"chunkmaster-session-{trainer.name}", daemon=True
        )
        self.thread.start()

    def backoff(self, attempt: int) -> float:
        return backoff_delay(attempt, self._link.backoff_base, self._link.backoff_max)

    # ---- connecting --------------------------------------------------------------------------

    def _main(self) -> None:
        while not self.token.cancelled:
            try:
                stream = self._connect()
            except Cancelled:
                return
            except (TransportError, UnauthenticatedError) as exc:
                # retry_timeout or startup_timeout ran out, or no retry mends a wrong token or
                # certificate: the waiters get the error; the next try after a pause (a master
                # never reached fails the next one at once)
                self._fail_pending(exc)
                self._unreachable(exc)
                if isinstance(exc, UnauthenticatedError):
                    log.error("Session: %s", exc)
                try:
                    self.token.sleep(self._link.backoff_max)
                except Cancelled:
                    return
                continue
            self._serve(stream)
            with self._state.lock:
                if self._state.outbox.stream is stream:
                    self._state.outbox.stream = None
            if self._state.said_goodbye:
                return

    def _connect(self) -> SessionStream:
        waits = WaitLog(log, "Session")
        while True:
            try:
                return self._link.call("Session", self._open, self.token)
            except MasterError as exc:
                act = meaning(exc).reach
                if act is Act.STOP:
                    raise
                if act is Act.RENEW:
                    if self._renew():
                        self._end_goodbye()
                        raise Cancelled() from None
                    continue
                waits.wait(type(exc), f"the master refused Hello: {exc}; retrying")
                self.token.sleep(self.backoff(waits.attempts - 1))

    def _end_goodbye(self) -> None:
        """The session is over without a Goodbye's ack: release whoever waits for it."""
        with self._state.lock:
            self._state.outbox.end_goodbye()
            self._state.said_goodbye = True

    def _hello(self, stream: SessionStream) -> pb.SessionRequest:
        """The Hello that opens `stream` (lock held)."""
        st, t = self._state, self._trainer
        stream.generation = st.generation
        if st.closing and not st.session_id:
            st.said_goodbye = True
            raise Cancelled()
        stream.hello_seq = st.outbox.next_seq()
        hello = pb.Hello(
            session_id=st.session_id,
            name=t.name,
            host=socket.gethostname(),
            pid=os.getpid(),
            report_every=t.report_every,
            world_size=t.world_size,
            rank=t.rank,
        )
        return pb.SessionRequest(seq=stream.hello_seq, hello=hello)

    def _open(self, conn: MasterConnection) -> SessionStream:
        """Open a stream and say Hello; once welcomed, send everything pending again."""
        stream = SessionStream(conn.addr)
        with self._state.lock:
            hello = self._hello(stream)
            resuming = self._state.session_id
        hello_sent = time.monotonic()
        stream.send(hello)
        stream.call = conn.open_session(stream.requests())
        reader = threading.Thread(
            target=self._read,
            args=(stream,),
            name=f"chunkmaster-session-read-{self._trainer.name}",
            daemon=True,
        )
        stream.reader = reader
        with self._state.lock:
            self._state.streams = [s for s in self._state.streams if not s.let_go()] + [stream]
        reader.start()
        timeout = self._link.rpc_timeout
        try:
            welcome = self.token.run(Bounded(stream.hello, timeout)).welcome
        except TimeoutError:
            stream.close()
            no_welcome = grpc.RpcError(f"no Welcome within {timeout}s")
            raise TransportError(conn.addr, no_welcome) from None
        except BaseException:
            stream.close()
            raise
        with self._state.lock:
            self._state.session_id = welcome.session_id
            if welcome.keep_alive_seconds > 0:
                self.keep_alive_seconds = welcome.keep_alive_seconds
            self._state.fence.welcomed(welcome.ttl_seconds)
            resent = self._state.outbox.resend(stream, time.monotonic())
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

    # ---- keeping the stream alive ----------------------------------------------------------

    def _serve(self, stream: SessionStream) -> None:
        """Keep-alives with progress, and finishes nothing else carried, until the stream
        breaks or the session closes."""
        st = self._state
        period = min(self.keep_alive_seconds, self._trainer.report_interval)
        next_keep_alive = time.monotonic() + period
        while not stream.broken.is_set() and not self.token.cancelled:
            with st.lock:
                flush_at = st.finishes.flush_at
            now = time.monotonic()
            timeout = next_keep_alive - now
            if flush_at is not None:
                timeout = min(timeout, flush_at - now)
            if self.report_due:
                timeout = min(timeout, self.reported + REPORT_GAP - now)
            if timeout > 0:
                self.wake.wait(timeout)
            self.wake.clear()
            if stream.broken.is_set() or self.token.cancelled:
                return
            now = time.monotonic()
            with st.lock:
                if st.finishes.due(now):
                    st.flush_finishes()
                if not st.closing:
                    self._maybe_ping(now)
            due = self.report_due and now - self.reported >= REPORT_GAP
            if due or now >= next_keep_alive:
                self._keep_alive(now, periodic=now >= next_keep_alive)
                next_keep_alive = now + period

    def _maybe_ping(self, now: float) -> None:
        """Ask for an answer (an empty NextTask) when the lease fence wants one (lock held)."""
        ping = self._ping
        if (ping is None or ping.done) and self._state.fence.ping(now):
            self._ping = self._state.outbox.send("next", pb.NextTask(), True, now)

    def _keep_alive(self, now: float, periodic: bool) -> None:
        """Send progress (and now and then the data-wait figures) in a keep-alive."""
        self.report_due = False
        progress = [position_to_pb(p) for p in self._trainer.progress()]
        wait = None
        data_wait = self._trainer.data_wait
        if data_wait is not None and (periodic or now >= self._waits_at):
            wait = data_wait()
            self._waits_at = now + DATA_WAIT_EVERY
        with self._state.lock:
            if not self._state.closing:
                # A finish waits no longer than a progress report: a finished task is gone
                # from the positions, and a trainer that dies before it was sent would have it
                # delivered again from its last reported position (unless refused "not now":
                # then it waits for its backoff).
                if self._state.finishes.may_go(now):
                    self._state.flush_finishes()
                keep_alive = pb.KeepAlive(progress=progress, data_wait=wait)
                self._state.send("keep_alive", keep_alive, False)
        self.reported = now

    # ---- the reader thread of one stream ----------------------------------------------------

    def _read(self, stream: SessionStream) -> None:
        why: BaseException | None = None
        try:
            for resp in stream.call:
                self._on_response(stream, resp)
        except grpc.RpcError as exc:
            why = exc
        except Exception as exc:  # a bug here must not leave the session silent
            log.exception("session %s: reading the stream failed", self._state.session_id)
            why = exc
        finally:
            self._broken(stream, why)

    def _broken(self, stream: SessionStream, why: BaseException | None) -> None:
        """`stream` ended (`why`: the error that ended it); what is queued goes again on the
        next stream (it is pending)."""
        stream.broken.set()
        rpc_error = why if isinstance(why, grpc.RpcError) else None
        refused: Exception | None = None if rpc_error is None else error_from_rpc(rpc_error)
        if not isinstance(refused, UnauthenticatedError):
            refused = TransportError(stream.addr, rpc_error or grpc.RpcError("the stream ended"))
        stream.hello.fail(refused)
        with self._state.lock:
            if self._state.outbox.stream is stream:
                self._state.outbox.stream = None
            closing = self._state.closing
        quiet = closing or stream.expired or not stream.welcomed or self.token.cancelled
        if why is not None and not quiet:
            log.warning(
                "session %s: stream broken (%s); reconnecting",
                self._state.session_id,
                TransportError(stream.addr, rpc_error) if rpc_error is not None else why,
            )
        self.wake.set()
        stream.end()  # gRPC's sending thread leaves requests(); close() joins it

    def _on_response(self, stream: SessionStream, resp: pb.SessionResponse) -> None:
        if resp.seq == stream.hello_seq and not stream.hello.done:
            stream.hello.resolve(resp)
            return
        if stream.expired:
            return  # the old session's: what it answers now is no longer this trainer's
        kind = resp.WhichOneof("body")
        refused = session_error(resp.error) if kind == "error" else None
        if isinstance(refused, SessionExpiredError):
            self._expired(stream)
            return
        with self._state.lock:
            entry = self._state.outbox.answered(resp.seq)
            if entry is not None and entry.reply.kind == "goodbye" and refused is None:
                self._state.said_goodbye = True
            if entry is not None and entry.finished:
                self._finishes_answered(entry, refused)
        if entry is None:
            if refused is not None:
                log.warning("session %s: master: %s", self._state.session_id, refused)
            return
        if refused is not None and entry.reply.kind == "next":
            self.wake.set()  # the finishes may go again once their backoff is over
        self._heard(entry.sent_at)  # answered under the session: its lease was renewed
        entry.reply.generation = stream.generation
        if entry.reply.resolve(resp):
            return
        if kind in ("task", "tasks"):  # its request was given up on: for whoever can use it
            for t in resp.tasks.tasks if kind == "tasks" else [resp.task]:
                self._on_unclaimed(task_from_pb(t))
        elif refused is not None and entry.reply.kind in ("failed", "next"):
            log.warning(
                "session %s: %s report: %s", self._state.session_id, entry.reply.kind, refused
            )

    def _finishes_answered(self, entry: Pending, refused: MasterError | None) -> None:
        """What the master's answer to a message carrying finishes means for them (lock held)."""
        st, finished = self._state, entry.finished
        verdict = st.finishes.judge(finished, refused, entry.request.next.want_task)
        tasks = ", ".join(str(p.task_id) for p in finished)
        if verdict is Verdict.AGAIN:
            now = time.monotonic()
            if st.finishes.again(finished, now, self.backoff(st.finishes.retries)):
                log.warning(
                    "session %s: the master did not take the finish of task(s) %s (%s); "
                    "sending them again with backoff",
                    st.session_id,
                    tasks,
                    refused,
                )
        elif verdict is Verdict.ALONE:
            # One of them is on a task no longer this session's (its dispatch timed out and
            # went to another trainer), which refused them all and changed nothing.
            for one in finished:
                st.send("next", pb.NextTask(finished=[one]), True)
        elif verdict is Verdict.REFUSED:
            log.warning(
                "session %s: the master refused the finish of task(s) %s: %s",
                st.session_id,
                tasks,
                refused,
            )

    # ---- the session's fate --------------------------------------------------------------

    def _expired(self, stream: SessionStream) -> None:
        """The master no longer knows this session: open a new one on a new stream."""
        with self._state.lock:
            if stream.expired:
                return
            stream.expired = True
        if self._renew():  # the session is over anyway: that is what Goodbye asked for
            self._end_goodbye()
        stream.close()

    def _renew(self) -> bool:
        """The session ended on the master: the next Hello opens a new one (outbox.renew),
        and the client is told. Whether the session is closing (then nothing is told)."""
        st = self._state
        with st.lock:
            old, closing = st.session_id, st.closing
            st.session_id = ""
            st.generation += 1
            st.finishes.clear()
            st.outbox.renew()
        if not closing:
            log.warning(
                "session %s ended while this trainer was away (its tasks went to other "
                "trainers); opening a new session",
                old,
            )
            if self._on_lost is not None:
                self._on_lost()
        return closing

    def _fail_pending(self, exc: BaseException) -> None:
        """Give every waiter `exc` (the master cannot be reached, or refuses this trainer);
        the finishes they carried stay queued for the next stream."""
        with self._state.lock:
            pending = self._state.outbox.take_all()
            now = time.monotonic()
            for p in pending:
                if p.finished:
                    self._state.finishes.requeue(p.finished, now)
        for p in pending:
            p.reply.fail(exc)

    def _unreachable(self, exc: Exception) -> None:
        """The master stayed out of reach (no lock held): a trainer fenced waits no more."""
        if self._state.fence.unreachable(exc) and self._on_alive is not None:
            self._on_alive()

    def _heard(self, sent_at: float) -> None:
        """The master answered a message sent at `sent_at` (no lock held): the lease held then."""
        if self._state.fence.heard(sent_at, time.monotonic()) and self._on_alive is not None:
            self._on_alive()
