"""The finishes a trainer's session has yet to see applied: when they go out, and what the
master's answer to them means.

A finish rides on the next NextTask, or goes alone after FINISH_FLUSH. One the master answers
"not now" (answers.Act.RETRY) goes back to the front of the queue and out again after a
backoff; finishes refused together because one of them is on a task no longer this session's
(Act.SPLIT) go again one by one; any other answer settles them (applied, moot, or refused for
good). A plain object on times it is given; the session's lock guards it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from chunkmaster.client.answers import Act, meaning
from chunkmaster.core.errors import MasterError
from chunkmaster.rpc import master_pb2 as pb

FINISH_FLUSH = 0.1
"""Seconds a finish waits for a NextTask to ride on before it goes alone (want_task=false)."""

FINISH_FLUSH_ASKING = 0.02
"""... while a task request is in flight (the next one waits for its answer, and it may be a
long poll): the finishes of this while go together, in one message, not one each."""


class Verdict(enum.Enum):
    SETTLED = "applied, moot, or not this message's to report (a task request's error)"
    AGAIN = "not now: queued again, out after a backoff"
    ALONE = "refused together for one of them: each goes again alone"
    REFUSED = "refused for good: sending them again cannot change that"


class FinishQueue:
    """Finishes queued to go out, and the backoff of those the master could not take yet."""

    def __init__(self) -> None:
        self._queued: list[pb.TaskPosition] = []
        self.flush_at: float | None = None  # when the queued ones go alone at the latest
        self.retries = 0  # answers "not now" in a row (the backoff's attempt)
        self.retry_at: float | None = None  # no finish goes out before

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, pos: pb.TaskPosition, now: float, *, asking: bool, last: bool) -> bool:
        """Queue a finish. `asking`: a task request is in flight (maybe a long poll that
        nothing rides on); `last`: no other finish is coming soon. Whether it goes out
        sooner than the queue knew (the session's thread must be woken)."""
        self._queued.append(pos)
        if last and asking:
            return self.arm(now, 0.0)
        return self.arm(now, FINISH_FLUSH_ASKING if asking else FINISH_FLUSH)

    def arm(self, now: float, after: float | None = None) -> bool:
        """Send the queued finishes alone in `after` s (FINISH_FLUSH) at the latest, not before
        a retry's backoff is over. Whether that is sooner than the time set before."""
        at = now + (FINISH_FLUSH if after is None else after)
        if self.retry_at is not None:
            at = max(at, self.retry_at)
        if self.flush_at is None or at < self.flush_at:
            self.flush_at = at
            return True
        return False

    def take(self) -> list[pb.TaskPosition]:
        """The queued finishes, to go out now."""
        finished, self._queued = self._queued, []
        self.flush_at = None
        return finished

    def due(self, now: float) -> bool:
        """Whether the queued finishes must go alone now."""
        return self.flush_at is not None and now >= self.flush_at

    def may_go(self, now: float) -> bool:
        """Whether finishes may go now (no retry's backoff holds them back)."""
        return self.retry_at is None or now >= self.retry_at

    def requeue(self, finished: Sequence[pb.TaskPosition], now: float) -> None:
        """Finishes sent but never answered go again first, on the next stream."""
        self._queued[:0] = finished
        self.arm(now)

    def judge(
        self, finished: Sequence[pb.TaskPosition], refused: MasterError | None, want_task: bool
    ) -> Verdict:
        """What the master's answer to a message carrying `finished` means for them (`refused`:
        its error, if it refused the message)."""
        act = None if refused is None else meaning(refused).report
        if act is Act.RETRY:
            return Verdict.AGAIN
        if act is Act.SPLIT and len(finished) > 1:
            return Verdict.ALONE
        self.retries, self.retry_at = 0, None
        return Verdict.REFUSED if refused is not None and not want_task else Verdict.SETTLED

    def again(self, finished: Sequence[pb.TaskPosition], now: float, backoff: float) -> bool:
        """The master did not apply `finished` for now: they go first with the next message
        that carries finishes, or alone after `backoff` s. Whether this began a retry."""
        first = self.retries == 0
        self.retry_at = now + backoff
        self.retries += 1
        self._queued[:0] = finished
        self.flush_at = None
        self.arm(now)
        return first

    def clear(self) -> None:
        """The session ended on the master: its finishes are no longer this trainer's."""
        self._queued = []
        self.flush_at = None
        self.retries, self.retry_at = 0, None
