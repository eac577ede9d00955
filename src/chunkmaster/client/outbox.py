"""The messages of a trainer's session that await the master's answer, across its streams.

A message that expects an answer stays here until answered and goes again as is (same seq,
same request_id) on the next stream: the master treats a repeat as the original. When the
master ended the session while the trainer was away, `renew` keeps what still means something
in a new session. A plain object: the session's lock guards it, and times are given.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from chunkmaster.client.stream import Reply, SessionStream
from chunkmaster.rpc import master_pb2 as pb


@dataclass
class Pending:
    request: pb.SessionRequest
    reply: Reply
    sent_at: float = 0.0  # time.monotonic() it last went out on a stream (0: not yet)

    @property
    def finished(self) -> Any:
        """The finishes this message carries (none but a NextTask's)."""
        return self.request.next.finished if self.reply.kind == "next" else ()


class Outbox:
    """Messages sent and owed an answer, numbered in one sequence, and the stream they go on
    (None while there is no stream welcomed)."""

    def __init__(self) -> None:
        self.seq = 0
        self.pending: dict[int, Pending] = {}
        self.stream: SessionStream | None = None

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def send(self, kind: str, msg: Any, answered: bool, now: float) -> Reply | None:
        """Send `msg` as a `kind` message on the stream (later, if none): with `answered`, it
        waits here for its answer (the Reply returned)."""
        req = pb.SessionRequest(seq=self.next_seq(), **{kind: msg})
        reply = None
        if answered:
            reply = Reply(kind)
            sent = 0.0 if self.stream is None else now
            self.pending[req.seq] = Pending(req, reply, sent)
        if self.stream is not None:
            self.stream.send(req)
        return reply

    def resend(self, stream: SessionStream, now: float) -> int:
        """A new stream was welcomed: everything pending goes again on it, in order."""
        for seq in sorted(self.pending):
            entry = self.pending[seq]
            entry.sent_at = now
            stream.send(entry.request)
        self.stream = stream
        return len(self.pending)

    def answered(self, seq: int) -> Pending | None:
        return self.pending.pop(seq, None)

    def asking(self) -> bool:
        """A task request is in flight (a long poll, maybe): nothing rides on one soon."""
        return any(
            p.reply.kind == "next" and p.request.next.want_task and not p.reply.cancelled
            for p in self.pending.values()
        )

    def carrying_finishes(self) -> list[Reply]:
        return [p.reply for p in self.pending.values() if p.finished]

    def take_all(self) -> list[Pending]:
        """Everything pending, no longer awaited here."""
        pending, self.pending = self.pending, {}
        return list(pending.values())

    def end_goodbye(self) -> None:
        """The session is over without a Goodbye's ack: release whoever waits for one."""
        for seq, p in list(self.pending.items()):
            if p.reply.kind == "goodbye":
                del self.pending[seq]
                p.reply.resolve(pb.SessionResponse(seq=seq, ack=pb.Ack(applied=0)))

    def renew(self) -> None:
        """The session ended on the master; what is pending goes to a new one. Failures and
        the finishes carried are dropped (those tasks went to others, whose reports they are
        now); task requests get fresh IDs (the old IDs belong to the old session's
        dispatches), and those given up on are dropped."""
        for seq, p in list(self.pending.items()):
            if p.reply.kind == "failed":
                del self.pending[seq]
                p.reply.cancel()
                continue
            if p.reply.kind != "next":
                continue
            want = p.request.next.want_task
            if want and p.reply.cancelled:
                del self.pending[seq]
                continue
            req = pb.SessionRequest()
            req.CopyFrom(p.request)
            del req.next.finished[:]
            if want:
                req.next.request_id = uuid.uuid4().hex
            self.pending[seq] = Pending(req, p.reply)
