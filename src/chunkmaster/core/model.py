"""The values that travel between master and trainers, and those the state is made of."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a dataset file: where it is and how many records it holds.

    `offset` is where the chunk starts in the file's format (a byte offset, or a Parquet row
    group's number); `length` is the bytes it spans (0: not known), for ranged reads.
    `file_size` and `file_mtime_ns` are the file's size and modification time when the master
    indexed it (0: not known): a trainer checks them before it reads, so that a file written
    again after indexing is never read as the chunks the master counted (docs/formats.md).
    """

    path: str
    offset: int
    num_records: int
    length: int = 0
    file_size: int = 0
    file_mtime_ns: int = 0


@dataclass(frozen=True, slots=True)
class TaskMeta:
    """A task's identity and which dispatch of it this is (the epoch grows per dispatch)."""

    id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Task:
    """A dispatch of a task: its chunks, and `start`, the records of it already consumed
    (a task handed out again resumes there instead of at its first record). `end`, when not
    0, is where the dispatch stops: a piece of a task (equal steps, docs/equal-steps.md) is
    the records [start, end) of its chunks, counted from the task's first record."""

    meta: TaskMeta
    chunks: tuple[Chunk, ...]
    pass_id: int = 0
    start: int = 0
    end: int = 0
    format: str = "recordio"  # the dataset's file format (chunkmaster.formats)
    #: Failures counted against the task in this pass (read failures, timeouts, holders lost
    #: while reading it). A trainer makes sure the master has its earlier finishes before it
    #: reads such a task, and this one's before it reads on, so that if it dies meanwhile the
    #: master charges the right task (docs/failures.md).
    failures: int = 0
    source: str = ""  # a mixture's source the task is of ("": not a mixture)
    #: The job's record shuffle (core/record_order.py): the task's records read in windows of
    #: `shuffle_window` records (0: in file order), each in a permutation keyed by `order_key`,
    #: which the master derives from the job's seed, the pass and the task whose chunks this
    #: reads: the same for every dispatch and every piece of it.
    order_key: int = 0
    shuffle_window: int = 0
    #: Where the dispatch ends, counted from the task's first record: `end`, or the records
    #: of all its chunks (counted once here: a trainer asks for it at every batch).
    num_records: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        total = self.end or sum(c.num_records for c in self.chunks)
        object.__setattr__(self, "num_records", total)


@dataclass(frozen=True, slots=True)
class Position:
    """Records [0, records) of a task's dispatch `epoch` in pass `pass_id` are consumed
    (counted from the task's first record, whatever the dispatch's start)."""

    task_id: int
    epoch: int
    pass_id: int
    records: int


@dataclass(frozen=True, slots=True)
class Failure:
    """One failure of one dispatch: kept so that no failure is silent."""

    pass_id: int
    epoch: int
    reason: str


@dataclass(slots=True)
class RecordCounts:
    """Record counts of a pass: what was handed out, consumed, committed, and handed out
    again (by why: a record handed out again was maybe read twice, at most up to where its
    previous holder got beyond its last report)."""

    dispatched: int = 0
    consumed: int = 0
    committed: int = 0
    redispatched: dict[str, int] = field(default_factory=dict)
    quarantined: int = 0  # records not delivered: their task went over failure_max
    dropped: int = 0  # equal steps: records not handed out in the pass
    padded: int = 0  # equal steps: records handed out again to even the trainers up
    #: The records the last restore of a data checkpoint found committed in the pass (the
    #: checkpoint's commits: the pass went on from there, and `consumed` counts beyond them).
    restored: int = 0
    #: Records delivered again because of restores that went back to this pass: at each, those
    #: the trainers had reached (consumed, or committed by the restore before) beyond the
    #: checkpoint's commits in this pass and the later ones, which are handed out again
    #: (core/restore.py).
    rolled_back: int = 0


@dataclass(slots=True)
class PassLedger(RecordCounts):
    """The record counts of one pass, and in a mixture the same counts of each source (by its
    index; a source that had nothing in the pass is absent): they add up to the pass's."""

    sources: dict[int, RecordCounts] = field(default_factory=dict)


class FailedPolicy(enum.StrEnum):
    """What a pass rollover does with tasks that failed more than failure_max times."""

    RETRY = "retry"  # back into the next pass with a fresh failure count
    KEEP = "keep"  # kept out of every later pass, and reported in status


TIMEOUT_REASON = "timeout"
TRAINER_LOST_REASON = "trainer lost"
RETURNED_REASON = "returned"  # the trainer closed its session and handed the task back
