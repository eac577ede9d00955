"""Handing out tasks, and waiting for one (a wait bounded by the caller's).

A request asks the core what would happen (`check_get_task`: dispatch, wait, or an error);
a dispatch is journaled with its deadline and its timer armed before any yield. With nothing
to hand out yet (no dataset, every task pending, a pass not begun, a rank missing) the request
waits for any change of the state, up to its wait (master/checks.py: one limit for every
path), and then answers what is true then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence

from chunkmaster.core.errors import (
    MasterError,
    NoMoreAvailableError,
    NotReadyError,
    PassAfterError,
    PermissionDeniedError,
    RanksMissingError,
    SessionExpiredError,
    WorldMismatchError,
)
from chunkmaster.core.events import Dispatch
from chunkmaster.core.master_state import MasterState
from chunkmaster.core.model import Task
from chunkmaster.core.queues import Availability, check_get_task
from chunkmaster.core.steps import contested, missing_ranks, unlike, world, world_size
from chunkmaster.master.checks import check_pass, wait_seconds
from chunkmaster.master.leases import LeaseKeeper
from chunkmaster.master.ledger import Ledger, LedgerSubscriber
from chunkmaster.master.timeouts import TaskTimeouts

log = logging.getLogger("chunkmaster.service")

CONTEST_TICK = 0.5
"""Seconds between looks at a contested declaration's rivals (their leases are not state:
hearing from them changes nothing a waiting request would be woken by)."""


class Dispatcher(LedgerSubscriber):
    def __init__(
        self,
        ledger: Ledger,
        timeouts: TaskTimeouts,
        rank_wait: float,
        leases: LeaseKeeper,
        *,
        one_kind: bool = False,
    ) -> None:
        self._ledger = ledger
        #: `--equal-steps auto`: a job's trainers are all ranked or all not (`steps.unlike`)
        self._one_kind = one_kind
        self._timeouts = timeouts
        self.rank_wait = rank_wait
        self._leases = leases
        #: (pass, time.monotonic()) since when the pass waits for ranks missing from its world
        self._ranks_waiting: tuple[int, float] | None = None
        self._changed = asyncio.Event()
        ledger.subscribe(self)

    def state_changed(self) -> None:
        """Wake the requests that wait for a change."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self, until: float) -> bool:
        """Wait for any state change until the monotonic time `until`; False on timeout."""
        remaining = until - time.monotonic()
        if remaining <= 0:
            return False
        try:
            await asyncio.wait_for(self._changed.wait(), remaining)
        except TimeoutError:
            return False
        return True

    async def get_tasks(
        self,
        pass_id: int,
        count: int,
        *,
        wait: float = 0.0,
        time_left: float | None = None,
        worker: str = "",
        request_id: str = "",
        session: str = "",
        owner: str = "",
    ) -> list[Task]:
        """Up to `count` tasks of `pass_id`: the first waiting up to `wait` seconds (and
        `time_left`, a caller's deadline) for one, the others only if free at once. One round
        trip and one durable write for them all. The i-th task's request ID is
        `request_id#i`, so a retry whose answer was lost gets the same tasks back."""
        check_pass(pass_id)
        until = time.monotonic() + wait_seconds(wait, time_left)
        task, durable = await self._take(pass_id, until, worker, request_id, session, owner)
        tasks, writes = [task], [durable]
        while len(tasks) < count:
            rid = f"{request_id}#{len(tasks)}" if request_id else ""
            st = self._ledger.state
            if rid and (held := _repeated(st, rid, session, owner)) is not None:
                tasks.append(st.task(held))
                continue
            if not self._ledger.available:
                break
            try:
                if check_get_task(st, pass_id, session) is not Availability.DISPATCH:
                    break
            except MasterError:  # the pass is over or cannot go on: the first ones stand
                break
            more, written = self._submit(worker, rid, session, owner)
            writes.append(written)
            if more is None:
                break
            tasks.append(more)
        for written in writes:
            await written
        return tasks

    async def _take(
        self, pass_id: int, until: float, worker: str, request_id: str, session: str, owner: str
    ) -> tuple[Task, Awaitable[None]]:
        """One task, waiting until the monotonic time `until`; its dispatch's durability is
        left to the caller to await."""
        while True:
            if not self._ledger.available:
                raise self._ledger.unavailable()
            st = self._ledger.state
            if request_id and (held := _repeated(st, request_id, session, owner)) is not None:
                # Its dispatch may still be on its way to the store (the retry came while the
                # first request waited for it): answered, like the first, once it is durable.
                return st.task(held), self._ledger.written()
            if self._one_kind and session and self._contest(st, session, unlike(st, session)):
                await self._await_rivals(until)  # a `read` killed before a torchrun job, say
                continue
            try:
                avail = check_get_task(st, pass_id, session)
            except PassAfterError:
                if not await self._wait_change(until):
                    raise
                continue
            if avail is Availability.DISPATCH:
                if session and session not in st.sessions:
                    raise SessionExpiredError()
                task, durable = self._submit(worker, request_id, session, owner)
                if task is not None:
                    return task, durable
                await durable
                continue  # equal steps: nothing for this trainer in this pass; ask again
            if avail is Availability.WAIT:
                if st.steps.on and self._contest(st, session, contested(st, session)):
                    await self._await_rivals(until)
                    continue
                self._check_ranks()
            if not await self._wait_change(until):
                if avail is Availability.NOT_READY:
                    raise NotReadyError()
                raise NoMoreAvailableError()

    def _check_ranks(self) -> None:
        """Equal steps in a declared world share a pass among its ranks only once every rank
        has a session: after `rank_wait` seconds without some, refuse naming them."""
        st = self._ledger.state
        missing = missing_ranks(st) if st.steps.on and not st.steps.fixed else []
        if not missing:
            self._ranks_waiting = None
            return
        now = time.monotonic()
        if self._ranks_waiting is None or self._ranks_waiting[0] != st.cur_pass:
            self._ranks_waiting = (st.cur_pass, now)
            log.info(
                "pass %d waits for rank(s) %s to open a session before sharing its records "
                "(equal steps); at most %.0fs",
                st.cur_pass,
                _ranks_text(missing),
                self.rank_wait,
            )
            return
        waited = now - self._ranks_waiting[1]
        if waited >= self.rank_wait:
            size = world_size(st)
            raise RanksMissingError(
                f"pass {st.cur_pass} cannot start: rank(s) {_ranks_text(missing)} of world size "
                f"{size} have no trainer after {waited:.0f}s (--rank-wait {self.rank_wait:g}s); "
                "start them, or check each trainer's WORLD_SIZE and RANK"
            )

    async def _await_rivals(self, until: float) -> None:
        """A contested trainer's rivals may be dead, their leases running out: wait a tick (or
        a change) before looking again; NoMoreAvailableError once the request's wait is over."""
        tick = min(until, time.monotonic() + CONTEST_TICK)
        if not await self._wait_change(tick) and time.monotonic() >= until:
            raise NoMoreAvailableError()

    def _contest(self, st: MasterState, session: str, rivals: list[str]) -> bool:
        """Whether `session`'s declaration contradicts the live `rivals` (`steps.contested`:
        the live world; `steps.unlike`: trainers of the other kind), to wait on while they
        may be dead (a rank restarted after a crash, its old session's lease still running);
        refused naming both once a rival is heard from after `session` opened: that one is
        alive, and the live world is never given up for a trainer outside it."""
        mine = self._leases.get(session)
        if not rivals or mine is None:
            return False
        alive = [
            sid
            for sid in rivals
            if (lease := self._leases.get(sid)) is not None and lease.heard > mine.since
        ]
        if not alive:
            return True
        s = st.sessions[session]
        size, ranks = world(st)
        declared = (
            f"this trainer declares rank {s.rank} of world {s.world_size}"
            if s.world_size
            else "this trainer declares no world size"
        )
        if bool(s.world_size) != bool(st.sessions[rivals[0]].world_size):
            kind = "declare no world size" if s.world_size else f"declare a world of {size}"
            why = (
                f"the job's live trainers {kind} ({_who(st, rivals[0])}"
                f"{f' and {len(rivals) - 1} more' if len(rivals) > 1 else ''}): under "
                "--equal-steps auto a job's trainers are all ranked (equal steps) or all not "
                "(dynamic dispatch)"
            )
        elif s.world_size != size:
            shown = [_who(st, sid) for sid in rivals[:4]]
            more = f" and {len(rivals) - 4} more" if len(rivals) > 4 else ""
            why = (
                f"the job's live world is {size} (ranks {_ranks_text(sorted(ranks))} open: "
                f"{'; '.join(shown)}{more}), which it is not part of"
            )
        else:
            why = (
                f"rank {s.rank} is held by the live session {_who(st, alive[0])}, heard from "
                "after this one opened: two trainers say the same RANK"
            )
        message = (
            f"{declared}; {why}. Check each trainer's WORLD_SIZE and RANK (a restarted rank "
            "takes over once its old session ends: Goodbye, or its lease after --trainer-ttl)"
        )
        log.warning("session %s refused: %s", session, message)
        raise WorldMismatchError(message)

    def _submit(
        self, worker: str, request_id: str, session: str = "", owner: str = ""
    ) -> tuple[Task | None, Awaitable[None]]:
        """Dispatch the head of Todo (None: equal steps leave nothing for this trainer).
        Applied and its timer armed before any yield: a caller that goes away while the
        dispatch is made durable must not leave the task pending without a timer (it would
        never come back); a failed write resets the timers anyway."""
        deadline = self._timeouts.from_now()
        task, durable = self._ledger.submit(Dispatch(deadline, worker, request_id, session, owner))
        if task is None:
            return None, durable
        assert isinstance(task, Task)
        self._timeouts.arm(deadline, task.meta.id, task.meta.epoch)
        return task, durable


def _repeated(st: MasterState, request_id: str, session: str, owner: str) -> int | None:
    """The task a repeated request got, if any: only its own requester gets it again."""
    held = st.requests.get(request_id)
    if held is None:
        return None
    p = st.pending[held]
    if p.session != session or (p.owner != owner and not session):
        raise PermissionDeniedError(
            f"permission denied: request {request_id} was made by another trainer"
        )
    return held


def _who(st: MasterState, session: str) -> str:
    s = st.sessions[session]
    return f"{session} of trainer {s.name} ({s.host}, pid {s.pid})"


def _ranks_text(ranks: Sequence[int], most: int = 16) -> str:
    shown = ", ".join(map(str, ranks[:most]))
    return shown + (f" and {len(ranks) - most} more" if len(ranks) > most else "")
