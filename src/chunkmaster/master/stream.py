"""One trainer's session stream: its messages in, the master's answers out.

The messages of one stream are handled in the order they arrive: each one's events are applied
(and journaled) before the next message is read, so a finish is never overtaken by the request
or the commit behind it. What takes time (waiting for a task, for a write to be durable) runs
in a task of its own that answers when done, so a long poll never holds up the keep-alives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from chunkmaster.core.errors import (
    InvalidArgumentError,
    MasterError,
    SessionExpiredError,
)
from chunkmaster.core.model import RETURNED_REASON, Position, TaskMeta
from chunkmaster.master.checks import batch_size
from chunkmaster.master.leases import DataWait
from chunkmaster.master.ledger import started
from chunkmaster.master.service import Service
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc.wire import MAX_BATCH, status_code_of, task_to_pb

log = logging.getLogger("chunkmaster.stream")

MAX_OUTSTANDING = 256
"""Messages of one stream the master holds at once, waiting for their answer or for it to be
sent: a trainer has a few; a stream that sends more without reading its answers is refused
(InvalidArgumentError) and ended, so it cannot make the master hold an unbounded number."""


class Malformed:
    """Request bytes that do not parse (the server's deserializer yields this instead)."""

    def __init__(self, message: str) -> None:
        self.message = message


def error_response(seq: int, exc: MasterError) -> pb.SessionResponse:
    return pb.SessionResponse(
        seq=seq,
        error=pb.SessionError(
            code=status_code_of(exc).value[0], error=type(exc).__name__, message=str(exc)
        ),
    )


def _positions(msgs: Any) -> list[Position]:
    return [Position(m.task_id, m.epoch, m.pass_id, m.records) for m in msgs]


class SessionConversation:
    """The master's side of one Session stream. `identity`: the authenticated peer (mutual
    TLS), which a session opened here belongs to and which alone may resume it. Every report
    on the stream is on the session's own tasks only (master/owners.py)."""

    def __init__(self, service: Service, peer: str, identity: str | None = None) -> None:
        self.service = service
        self.peer = peer
        self.identity = identity
        self.session = ""  # set by a successful Hello
        self.name = peer
        self._out: asyncio.Queue[pb.SessionResponse | None] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ended = False

    async def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[pb.SessionResponse]:
        reader = asyncio.create_task(self._read(requests), name=f"session-read-{self.peer}")
        try:
            while True:
                resp = await self._out.get()
                if resp is None:
                    return
                yield resp
        finally:
            reader.cancel()
            for t in list(self._tasks):
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(self, requests: AsyncIterator[Any]) -> None:
        try:
            async for req in requests:
                if isinstance(req, Malformed):
                    self._out.put_nowait(error_response(0, InvalidArgumentError(req.message)))
                    break
                if len(self._tasks) + self._out.qsize() >= MAX_OUTSTANDING:
                    too_many = InvalidArgumentError(
                        f"invalid argument: {MAX_OUTSTANDING} messages of this stream wait for "
                        "their answers already; the stream ends (read the answers before "
                        "sending more)"
                    )
                    self._out.put_nowait(error_response(req.seq, too_many))
                    for t in self._tasks:  # nobody reads their answers
                        t.cancel()
                    break
                await self._handle(req)
                if self._ended:
                    break
            if self._tasks:  # the trainer stopped sending: answer what it is waiting for
                await asyncio.wait(list(self._tasks))
        finally:
            self._out.put_nowait(None)

    async def _handle(self, req: Any) -> None:
        seq = req.seq
        kind = req.WhichOneof("body")
        try:
            if kind == "hello":
                await self._hello(req.hello, seq)
                return
            if not self.session:
                raise InvalidArgumentError("invalid argument: a session starts with Hello")
            sessions, reports = self.service.sessions, self.service.reports
            sessions.touch(self.session)
            if kind == "next":
                self._next(req.next, seq)
            elif kind == "keep_alive":
                # Not answered, but for positions on tasks the session does not hold. A bare
                # one (the commonest message of all) has renewed the lease above: that is all.
                ka = req.keep_alive
                if ka.progress:
                    reports.progress(self.session, _positions(ka.progress))
                if ka.HasField("data_wait"):
                    w = ka.data_wait
                    sessions.data_wait(
                        self.session,
                        DataWait(
                            w.p50_seconds, w.p99_seconds, w.share, w.batches, w.window_seconds
                        ),
                    )
            elif kind == "failed":
                meta = TaskMeta(req.failed.meta.id, req.failed.meta.epoch)
                failure = reports.fail(meta, req.failed.reason, session=self.session)
                self._answer(seq, failure)
            elif kind == "returned":
                positions = _positions(req.returned.positions)
                self._answer(seq, reports.returned(self.session, positions))
            elif kind == "commit":
                positions = _positions(req.commit.positions)
                commit = self.service.checkpoints.commit(positions, self.session, self.identity)
                self._answer(seq, commit)
            elif kind == "goodbye":
                held = await sessions.end(
                    self.session, RETURNED_REASON, _positions(req.goodbye.progress)
                )
                self._out.put_nowait(pb.SessionResponse(seq=seq, ack=pb.Ack(applied=held)))
                self._ended = True
            else:
                raise InvalidArgumentError("invalid argument: an empty session message")
        except MasterError as exc:
            self._out.put_nowait(error_response(seq, exc))

    async def _hello(self, hello: Any, seq: int) -> None:
        sid = await self.service.open_session(
            hello.session_id,
            hello.name,
            hello.host,
            hello.pid,
            hello.report_every,
            hello.world_size,
            hello.rank,
            self.identity,
        )
        self.session = sid
        self.name = hello.name or self.peer
        ttl = self.service.leases.ttl
        self._out.put_nowait(
            pb.SessionResponse(
                seq=seq,
                welcome=pb.Welcome(session_id=sid, ttl_seconds=ttl, keep_alive_seconds=ttl / 3),
            )
        )

    def _next(self, msg: Any, seq: int) -> None:
        finished = self.service.reports.finish_positions(self.session, _positions(msg.finished))
        if not msg.want_task:
            self._answer(seq, finished)
            return
        session = self.session

        # The finishes are applied already; their write and the dispatch's share one group
        # commit, and the task is answered once both are durable.
        fin = started(finished)

        async def next_task() -> pb.SessionResponse:
            try:
                tasks = await self.service.get_tasks(
                    msg.pass_id,
                    batch_size(msg.max_tasks, MAX_BATCH),
                    wait=msg.wait_seconds,
                    worker=self.name,
                    request_id=msg.request_id,
                    session=session,
                )
            except MasterError:
                await fin  # finishes that were not made durable: that is the answer
                raise
            await fin
            if msg.max_tasks <= 1:
                return pb.SessionResponse(seq=seq, task=task_to_pb(tasks[0]))
            batch = pb.TaskBatch(tasks=[task_to_pb(t) for t in tasks])
            return pb.SessionResponse(seq=seq, tasks=batch)

        self._spawn(seq, next_task)

    def _answer(self, seq: int, applied: Awaitable[int]) -> None:
        async def ack() -> pb.SessionResponse:
            return pb.SessionResponse(seq=seq, ack=pb.Ack(applied=await applied))

        self._spawn(seq, ack)

    def _spawn(self, seq: int, make: Callable[[], Awaitable[pb.SessionResponse]]) -> None:
        async def run() -> None:
            try:
                resp = await make()
            except MasterError as exc:
                resp = error_response(seq, exc)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("session %s: message %d failed", self.session, seq)
                resp = error_response(seq, MasterError("internal error (see the master's log)"))
            self._out.put_nowait(resp)

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


__all__ = ["Malformed", "SessionConversation", "SessionExpiredError"]
