"""Save-model approval: one trainer at a time may save the model, for the window it asked for
(the original's RequestSaveModel; the window is journaled, so it holds across restarts)."""

from __future__ import annotations

from collections.abc import Callable

from chunkmaster.core.errors import TrainerIdEmptyError
from chunkmaster.core.events import ApproveSave
from chunkmaster.core.queues import save_allowed
from chunkmaster.master.checks import check_save
from chunkmaster.master.ledger import Ledger


class SaveApprovals:
    def __init__(self, ledger: Ledger, clock: Callable[[], float]) -> None:
        self._ledger = ledger
        self._clock = clock

    async def request(self, trainer_id: str, block_dur: float) -> bool:
        """Approve `trainer_id` for `block_dur` seconds if nobody else holds a window now."""
        if not trainer_id:
            raise TrainerIdEmptyError()
        check_save(block_dur)
        now = self._clock()
        if not save_allowed(self._ledger.state, trainer_id, now):
            return False
        await self._ledger.commit(ApproveSave(trainer_id, now + block_dur))
        return True
