"""What each of the master's answers means to a trainer, in one table.

A trainer meets the master's errors in three places: asking for tasks (`Meaning.task`),
reporting what it did (finishes, failures, commits, the Goodbye: `Meaning.report`), and
reaching the master at all (a call's transport, the session's Hello: `Meaning.reach`). Every
fetch and retry loop of the client looks the answer up here instead of keeping its own list.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chunkmaster.client.connection import TransportError
from chunkmaster.client.errors import NeverConnectedError
from chunkmaster.core import errors


class Act(enum.Enum):
    RETRY = "the same again after a backoff: the master did not apply it, for now"
    RECONNECT = "drop the channel, back off, and call again (maybe elsewhere)"
    WAIT = "nothing for this trainer yet: ask again (a long poll), saying why meanwhile"
    POLL = "answered at once with nothing yet: ask again after a short, growing pause"
    END = "the pass is over"
    RENEW = "the session ended on the master: open a new one"
    SPLIT = "refused together for one of them: each goes again alone"
    STOP = "no retry mends it: the trainer is told (raised once its tasks are read, or logged)"
    RAISE = "not an answer this loop expects: raised as is"


@dataclass(frozen=True)
class Meaning:
    error: type[BaseException]
    task: Act
    report: Act
    reach: Act
    why: str = ""  # said while a trainer waits on this answer


TABLE = (
    Meaning(NeverConnectedError, Act.STOP, Act.STOP, Act.STOP),
    Meaning(TransportError, Act.RAISE, Act.STOP, Act.RECONNECT),
    Meaning(errors.UnavailableError, Act.RETRY, Act.RETRY, Act.RECONNECT),
    Meaning(errors.UnauthenticatedError, Act.RAISE, Act.STOP, Act.STOP),
    Meaning(errors.SessionExpiredError, Act.RAISE, Act.RENEW, Act.RENEW),
    Meaning(errors.PermissionDeniedError, Act.RAISE, Act.SPLIT, Act.RETRY),
    Meaning(errors.PassBeforeError, Act.END, Act.STOP, Act.RETRY),
    Meaning(
        errors.NoMoreAvailableError,
        Act.WAIT,
        Act.STOP,
        Act.RETRY,
        "no task free; waiting for the other trainers' tasks to finish or come back",
    ),
    Meaning(
        errors.NotReadyError,
        Act.WAIT,
        Act.RETRY,
        Act.RETRY,
        "the master has no dataset yet; waiting for a trainer's set_dataset",
    ),
    Meaning(
        errors.PassAfterError,
        Act.POLL,
        Act.STOP,
        Act.RETRY,
        "the master is still in an earlier pass; waiting for it to finish",
    ),
    Meaning(errors.AllTaskFailedError, Act.STOP, Act.STOP, Act.RETRY),
    Meaning(errors.JobStoppedError, Act.STOP, Act.STOP, Act.RETRY),
    Meaning(errors.RanksMissingError, Act.STOP, Act.STOP, Act.RETRY),
    Meaning(errors.WorldMismatchError, Act.STOP, Act.STOP, Act.RETRY),
)
"""First match wins (NeverConnectedError is a TransportError). Another master error is an
answer for the caller to raise, or at Hello a refusal to retry; anything else is a bug."""

OTHER_MASTER_ERROR = Meaning(Exception, Act.RAISE, Act.STOP, Act.RETRY)
NOT_AN_ANSWER = Meaning(BaseException, Act.RAISE, Act.RAISE, Act.RAISE)


def meaning(exc: BaseException) -> Meaning:
    """The row of `exc` in TABLE."""
    for row in TABLE:
        if isinstance(exc, row.error):
            return row
    return OTHER_MASTER_ERROR if isinstance(exc, errors.MasterError) else NOT_AN_ANSWER
