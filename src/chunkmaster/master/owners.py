"""Who may report on a task: its holder only (docs/security.md, docs/sessions.md).

A session reports (finishes, failures, progress, commits) only on the tasks it holds or
finished, whatever TLS says. A trainer without a session reports only on tasks handed out by
unary GetTask, and under mutual TLS only on those handed to its own certificate; a task a
session holds is reported over that session's stream only. Under mutual TLS a session belongs
to the certificate that opened it.

Each check reads the state only: the identities are journaled with the sessions and the
dispatches (`OpenSession.owner`, `Dispatch.owner`), so they hold across restarts and
failovers. Each returns why a report is refused (PERMISSION_DENIED), or None.
"""

from __future__ import annotations

from collections.abc import Iterable

from chunkmaster.core.master_state import MasterState
from chunkmaster.core.model import Position
from chunkmaster.master.checks import check_position


def resume_refused(state: MasterState, session_id: str, identity: str | None) -> str | None:
    """A Hello resuming `session_id` from `identity` (None: no mutual TLS)."""
    s = state.sessions.get(session_id)
    if s is None or identity is None or not s.owner or s.owner == identity:
        return None
    return (
        f"permission denied: session {session_id} belongs to another trainer's certificate; "
        "open a new session"
    )


def session_report_refused(state: MasterState, session: str, task_id: int) -> str | None:
    """A finish, failure or progress report of `session` on `task_id`, whatever its epoch: a
    session reports only its own tasks."""
    p = state.pending.get(task_id)
    if p is None or p.session == session:
        return None  # not pending: the state ignores the report
    holder = "another trainer's session" if p.session else "a trainer without a session"
    return (
        f"permission denied: task {task_id} is held by {holder} (epoch {p.epoch}); a session "
        "reports only its own tasks"
    )


def unary_report_refused(state: MasterState, task_id: int, identity: str | None) -> str | None:
    """A TaskFinished or TaskFailed on `task_id` from `identity` (None: no mutual TLS), whatever
    its epoch: an older epoch completes a task too, so it is no way around the holder."""
    p = state.pending.get(task_id)
    if p is None:
        return None
    if p.session:
        return (
            f"permission denied: task {task_id} is held by a trainer session (epoch {p.epoch}); "
            "only that session reports it, over its stream"
        )
    if identity is not None and p.owner and p.owner != identity:
        return (
            f"permission denied: task {task_id} (epoch {p.epoch}) was handed to another "
            "trainer's certificate"
        )
    return None


def commit_position_refused(
    state: MasterState, pos: Position, session: str, identity: str | None
) -> str | None:
    """A commit position of `session` naming a dispatch another trainer holds now or (under
    mutual TLS) a task another certificate finished. A dispatch that is no longer its
    holder's is the state's to refuse (`commit_refused`: CheckpointRefusedError)."""
    back = state.returned.get((pos.task_id, pos.epoch))
    if back is not None:  # handed back: only by its holder, whoever read on
        if back[0] != session:
            return (
                f"permission denied: commit refused: task {pos.task_id} (epoch {pos.epoch}) "
                "was handed back by another trainer"
            )
        return None
    p = state.pending.get(pos.task_id)
    if pos.pass_id == state.cur_pass and p is not None:
        if p.epoch == pos.epoch and p.session != session:
            return (
                f"permission denied: commit refused: task {pos.task_id} (epoch {pos.epoch}) "
                "is held by another trainer"
            )
        return None
    fin = state.finishers.get(pos.pass_id)
    if identity is None or fin is None:
        return None
    if fin.finisher(pos.task_id) != identity:
        return (
            f"permission denied: commit refused: task {pos.task_id} of pass {pos.pass_id} was "
            "not finished by this trainer's certificate"
        )
    return None


def own_positions(
    state: MasterState, session: str, positions: Iterable[Position]
) -> tuple[Position, ...]:
    """The positions about dispatches `session` holds now; the others are stale (a task
    finished, taken back or handed out again since), and left out. Each is checked first."""
    own = []
    for pos in positions:
        check_position(pos)
        p = state.pending.get(pos.task_id)
        if p is not None and p.session == session and p.epoch == pos.epoch:
            own.append(pos)
    return tuple(own)
