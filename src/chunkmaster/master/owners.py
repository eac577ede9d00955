"""Which authenticated identity holds each unary dispatch, so that under mutual TLS a trainer
cannot finish or fail a task handed to another trainer's certificate.

Held in the master process, like the session owners (`stream.SessionOwners`): after a restart
or a failover the binding is empty and any identity may report a task pending then. Without
mutual TLS there is no identity and nothing is checked (the token is shared by the whole job).
"""

from __future__ import annotations

from chunkmaster.core.errors import PermissionDeniedError
from chunkmaster.core.state import MasterState
from chunkmaster.master.stream import SessionOwners


class TaskOwners:
    def __init__(self) -> None:
        self._owner: dict[int, tuple[int, str]] = {}  # task -> (epoch, identity); O(tasks)

    def record(self, task_id: int, epoch: int, identity: str) -> None:
        self._owner[task_id] = (epoch, identity)

    def check(
        self,
        state: MasterState,
        sessions: SessionOwners,
        task_id: int,
        epoch: int,
        identity: str,
    ) -> None:
        """Refuse a report on a pending dispatch that went to another identity."""
        p = state.pending.get(task_id)
        if p is None or (epoch and epoch != p.epoch):
            return  # the state ignores it anyway, and says why
        if p.session:
            owner = sessions.owner(p.session)
        else:
            held = self._owner.get(task_id)
            owner = held[1] if held is not None and held[0] == p.epoch else None
        if owner is not None and owner != identity:
            raise PermissionDeniedError(
                f"permission denied: task {task_id} (epoch {p.epoch}) was handed to another "
                "trainer's certificate"
            )
