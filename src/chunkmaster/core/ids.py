"""The three kinds of ID the master's state counts in, each its own type.

- A *task* (`TaskId`) is a task of the dataset: a run of chunks of its files (in a mixture,
  numbered over all the sources' tasks).
- A *unit* (`UnitId`) is a place in a pass's queue, 0 to the pass's units: the task of the
  same number, or in a mixture the task the pass's plan put there.
- A *piece* (`PieceId`) is a record range of a unit (equal steps), numbered after the units.

The queues, dispatches, reports and commits name units and pieces (a trainer's `task_id`).
"""

from __future__ import annotations

from typing import NewType

TaskId = NewType("TaskId", int)
UnitId = NewType("UnitId", int)
PieceId = NewType("PieceId", int)
