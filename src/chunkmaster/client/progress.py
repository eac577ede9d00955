"""How far the trainer has consumed each task it holds, read off the record iterators.

A run of records comes with an iterator (`Loaded.cut`, formats/base.py; for RecordIO the list
iterator over the run's record ends that drives its C-level record iterators):
`operator.length_hint` of it is how many records of the run are not taken yet. The position of
the task being read is therefore the run's first record (counted from the task's first record)
plus the records taken, known at any moment without any work per record. Only run boundaries
(the slow path) update anything here.

Everything here is guarded by the client's lock. Positions always count from the task's first
record, whatever the dispatch's start. Tasks are known by (pass, task ID): a task finished in one
pass and not yet committed stays owed to the next commit while the same task is read again in
the next pass.

Readers that are not the client's own runs (the DataLoader workers of `chunkmaster.torch`, which
read chunks in other processes) say how far the trainer got with `advance`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from chunkmaster.core.model import Position, Task

TaskKey = tuple[int, int]
"""(pass, task ID): a task of one pass."""


def key_of(task: Task) -> TaskKey:
    return (task.pass_id, task.meta.id)


@dataclass
class HeldTask:
    """A task this trainer holds: taken from the master, neither finished nor failed."""

    task: Task
    total: int
    done: int  # records [0, done) consumed, not counting the run being read
    reported: int  # the position last sent to the master
    committed: int  # the position last committed (the dispatch's start before any commit)

    def at(self, records: int) -> Position:
        meta = self.task.meta
        return Position(meta.id, meta.epoch, self.task.pass_id, records)


@dataclass
class _Run:
    held: HeldTask
    first: int  # the run's first record, counted from the task's first record
    length: int
    ends: Iterator[Any]  # the list iterator whose length_hint says what is left

    @property
    def taken(self) -> int:
        return self.length - operator.length_hint(self.ends)


class PositionTracker:
    """Positions of the held tasks, the tasks finished since the last commit, and when to
    report. `report_every` records between two progress reports (0: report only with the
    periodic keep-alive). With `keep_finished` False (no sessions) finished tasks are not kept.
    """

    def __init__(self, report_every: int, *, keep_finished: bool = True) -> None:
        self.report_every = report_every
        self._keep_finished = keep_finished
        self._held: dict[TaskKey, HeldTask] = {}
        self._finished: dict[TaskKey, Position] = {}  # finished since the last commit, at their end
        #: Consumed past their last commit, no longer held: handed back (the master takes
        #: their commit up to there) or lost with the session (it refuses it). The next commit's.
        self._owed: list[Position] = []
        self._run: _Run | None = None
        self._consumed = 0  # records taken in runs that are over
        self._reported_at = 0  # `consumed` when progress was last sent
        #: With a shuffle buffer: (task id, epoch) -> the index of its oldest record still
        #: buffered, or None. A position never goes beyond it (the trainer has not seen it).
        self.clip: Callable[[int, int], int | None] | None = None

    # ---- the trainer's side -----------------------------------------------------------------

    def add(self, task: Task) -> None:
        """A task was handed to this trainer; nothing of it before `task.start` is read here."""
        self._held[key_of(task)] = HeldTask(task, task.num_records, task.start, -1, -1)

    def run_started(self, task: Task, first: int, length: int, ends: Iterator[Any]) -> bool:
        """The trainer takes records [first, first + length) of `task` through `ends`.

        True when `report_every` records were consumed since the last report: send one now.
        """
        self._close_run()
        held = self._held.get(key_of(task))
        if held is None:  # not tracked (adopted late); track it from here
            self.add(task)
            held = self._held[key_of(task)]
        held.done = first
        self._run = _Run(held, first, length, ends)
        return 0 < self.report_every <= self._consumed - self._reported_at

    def stop_reading(self) -> None:
        """The run being read is dropped (the pass was abandoned): its position stays put."""
        self._close_run()

    def finished(self, task: Task) -> None:
        """The trainer takes the task's last record (its run is handed out whole)."""
        run = self._run
        if run is not None and key_of(run.held.task) == key_of(task):
            self._consumed += run.length
            self._run = None
        held = self._forget(task)
        if held is not None and self._keep_finished:
            self._finished[key_of(task)] = held.at(held.total)

    def dropped(self, task: Task) -> None:
        """The task failed here (a chunk could not be read): it is no longer this trainer's."""
        self._forget(task)

    def held_ids(self) -> list[int]:
        """The IDs of the tasks held here (read, being read or waiting for a reader)."""
        return [held.task.meta.id for held in self._held.values()]

    def lose_held(self) -> None:
        """The session ended on the master: every held task went to other trainers. They are
        no longer tracked; where they were consumed to (since their last commit) stays for
        the next commit, which the master refuses: the model holds records of them that are
        delivered again."""
        self._close_run()
        self._owed += [
            held.at(pos)
            for held in self._held.values()
            if (pos := self.position(held)) > max(held.committed, held.task.start)
        ]
        self._held.clear()

    def _forget(self, task: Task) -> HeldTask | None:
        run = self._run
        if run is not None and key_of(run.held.task) == key_of(task):
            self._close_run()
        held = self._held.get(key_of(task))
        if held is not None and held.task.meta.epoch == task.meta.epoch:
            return self._held.pop(key_of(task))
        return None

    def holds(self, task: Task) -> bool:
        """Whether `task` (this dispatch of it) is held here."""
        held = self._held.get(key_of(task))
        return held is not None and held.task.meta.epoch == task.meta.epoch

    def advance(self, task: Task, records: int) -> bool:
        """The trainer has taken records [0, records) of a held task (a reader outside the
        client's runs says so). True when `report_every` records were taken since the last
        report: send one now."""
        held = self._held.get(key_of(task))
        if held is None or held.task.meta.epoch != task.meta.epoch:
            return False
        if records > held.done:
            self._consumed += records - held.done
            held.done = records
        return 0 < self.report_every <= self._consumed - self._reported_at

    def _close_run(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            taken = run.taken
            run.held.done = run.first + taken
            self._consumed += taken

    # ---- positions (any thread, lock held) --------------------------------------------------

    def position(self, held: HeldTask) -> int:
        run = self._run
        pos = run.first + run.taken if run is not None and run.held is held else held.done
        if self.clip is not None:
            meta = held.task.meta
            oldest = self.clip(meta.id, meta.epoch)
            if oldest is not None and oldest < pos:
                return oldest
        return pos

    @property
    def consumed(self) -> int:
        """Records taken by the trainer so far (through the client's runs)."""
        run = self._run
        return self._consumed + (run.taken if run is not None else 0)

    def report(self) -> list[Position]:
        """Positions of held tasks that moved since the last report (marked as reported)."""
        out = []
        for held in self._held.values():
            pos = self.position(held)
            if pos != held.reported and pos > held.task.start:
                held.reported = pos
                out.append(held.at(pos))
        self._reported_at = self.consumed
        return out

    def release(self, pass_id: int) -> list[Position]:
        """Forget the held tasks of `pass_id` (handed back): their exact positions. Those
        consumed past their last commit stay owed to the next commit (the trainer took those
        records, whichever way its loop ended)."""
        if self._run is not None and self._run.held.task.pass_id == pass_id:
            self._close_run()
        out = []
        for key in [k for k in self._held if k[0] == pass_id]:
            held = self._held[key]
            pos = self.position(held)
            del self._held[key]
            out.append(held.at(pos))
            if pos > max(held.committed, held.task.start):
                self._owed.append(held.at(pos))
        return out

    def held_positions(self) -> list[Position]:
        """Every held task at its exact position (a Goodbye hands them back there)."""
        return [held.at(self.position(held)) for held in self._held.values()]

    def to_commit(self) -> list[Position]:
        """Every task consumed since the last commit: held ones at their exact position,
        finished ones at their end."""
        out = list(self._finished.values())
        if self.clip is not None:  # finished at the source, but records still buffered: later
            clip = self.clip
            out = [p for p in out if clip(p.task_id, p.epoch) is None]
        out += self._owed
        for held in self._held.values():
            pos = self.position(held)
            if pos > max(held.committed, held.task.start):
                out.append(held.at(pos))
        return out

    def committed(self, positions: list[Position]) -> None:
        """These positions were committed (or refused: they are not sent again)."""
        for pos in positions:
            if pos in self._owed:
                self._owed.remove(pos)
                continue
            key = (pos.pass_id, pos.task_id)
            fin = self._finished.get(key)
            if fin is not None and fin == pos:
                del self._finished[key]
                continue
            held = self._held.get(key)
            if held is not None and held.task.meta.epoch == pos.epoch:
                held.committed = max(held.committed, pos.records)

    @property
    def held(self) -> dict[TaskKey, HeldTask]:
        return self._held
