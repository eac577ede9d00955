"""Request checks, in one place for every path a request comes by (unary calls, session
messages, tests calling the service): a value out of range is refused before it reaches the
state with INVALID_ARGUMENT naming it; a report on a task another trainer holds is refused
with PERMISSION_DENIED naming the task (the reasons come from master/owners.py).
"""

from __future__ import annotations

import math

from chunkmaster.core.errors import InvalidArgumentError, PermissionDeniedError
from chunkmaster.core.model import Position

MAX_INT = 2**63 - 1
MAX_WORLD = 1 << 20  # the most ranks a trainer may declare
MAX_WAIT = 300.0
"""The longest a request may wait for a task, in seconds, on every path: a trainer asks again
(a long poll), and a master that stops serving is not held up by a caller's wish."""
DEADLINE_MARGIN = 0.25
"""Seconds before a unary caller's own deadline that its wait ends: the answer must arrive
before the caller gives up on it."""
MAX_SAVE_BLOCK = 24 * 3600.0
"""The longest save-model window a trainer may ask for (a day): a longer one holds the lock
past any plausible save, across restarts."""


def check(ok: bool, problem: str) -> None:
    """Refuse a request value before it reaches the state: INVALID_ARGUMENT, nothing changes."""
    if not ok:
        raise InvalidArgumentError(f"invalid argument: {problem}")


def deny(*refusals: str | None) -> None:
    """Refuse a report if any of these reasons is given: PERMISSION_DENIED, nothing changes."""
    problems = [why for why in refusals if why is not None]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise PermissionDeniedError("; ".join(problems[:3]) + more)


def wait_seconds(wait: float, time_left: float | None = None) -> float:
    """The wait a request for a task gets: what it asked, from 0 to MAX_WAIT, and for a caller
    with a deadline (`time_left` seconds) ending just before it."""
    check(math.isfinite(wait), f"wait {wait} is not a finite number of seconds")
    wait = min(max(0.0, wait), MAX_WAIT)
    if time_left is not None:
        wait = min(wait, max(0.0, time_left - DEADLINE_MARGIN))
    return wait


def batch_size(max_tasks: int, most: int) -> int:
    """The tasks one request gets at most: what it asked, from 1 to `most`."""
    return max(1, min(max_tasks, most))


def check_pass(pass_id: int) -> None:
    check(0 <= pass_id <= MAX_INT, f"pass_id {pass_id} is out of range")


def check_report(task_id: int, epoch: int, pass_id: int = -1) -> None:
    """A finish or failure report: a task, its dispatch's epoch, its pass (-1: any pass)."""
    check(0 <= task_id <= MAX_INT, f"task_id {task_id} is out of range")
    check(0 <= epoch <= MAX_INT, f"epoch {epoch} is out of range")
    check(-1 <= pass_id <= MAX_INT, f"pass_id {pass_id} is neither a pass nor -1 (any pass)")


def check_position(pos: Position) -> None:
    check_report(pos.task_id, pos.epoch)
    check_pass(pos.pass_id)
    check(0 <= pos.records <= MAX_INT, f"records {pos.records} is out of range")


def check_hello(pid: int, report_every: int, world_size: int, rank: int) -> None:
    check(0 <= pid <= MAX_INT, f"pid {pid} is out of range")
    check(0 <= report_every <= MAX_INT, f"report_every {report_every} is out of range")
    check(0 <= world_size <= MAX_WORLD, f"world size {world_size} is out of range")
    check(
        world_size == 0 or 0 <= rank < world_size,
        f"rank {rank} is not in 0..{world_size - 1} (world size {world_size})",
    )


def check_save(block_dur: float) -> None:
    check(
        math.isfinite(block_dur) and 0 <= block_dur <= MAX_SAVE_BLOCK,
        f"block_dur {block_dur} is not a number of seconds from 0 to {MAX_SAVE_BLOCK:.0f}",
    )
