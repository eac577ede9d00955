"""Trainer sessions: opened and resumed (one per trainer, its rank if it says one), kept alive
by a lease every message renews, ended by a Goodbye or by the lease running out
(docs/sessions.md). Leases are this process's (master/leases.py), not state: a recovering
master grants every session it finds a fresh one.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterable

from chunkmaster.core.errors import SessionExpiredError
from chunkmaster.core.events import EndSession, EqualSteps, OpenSession
from chunkmaster.core.model import TRAINER_LOST_REASON, Position
from chunkmaster.core.queues import fail_quarantines, lost_reason, reading_task
from chunkmaster.core.steps import StepsMode
from chunkmaster.logs import about
from chunkmaster.master.checks import check_hello, deny
from chunkmaster.master.leases import DataWait, LeaseKeeper
from chunkmaster.master.ledger import Ledger, LedgerSubscriber
from chunkmaster.master.owners import own_positions, resume_refused
from chunkmaster.master.reports import log_failure
from chunkmaster.master.settings import StepsSetting
from chunkmaster.master.status import StatusWarnings

log = logging.getLogger("chunkmaster.service")


class Sessions(LedgerSubscriber):
    def __init__(
        self,
        ledger: Ledger,
        trainer_ttl: float,
        warnings: StatusWarnings,
        equal_steps: StepsSetting = StepsSetting.AUTO,
    ) -> None:
        self._ledger = ledger
        self._warnings = warnings
        self._equal_steps = equal_steps
        self.leases = LeaseKeeper(trainer_ttl, self._lease_expired)
        ledger.subscribe(self)

    def state_rebuilt(self) -> None:
        """The leases of the sessions the rebuilt state holds."""
        self.leases.reset(self._ledger.state.sessions)

    async def open(
        self,
        session_id: str,
        name: str,
        host: str,
        pid: int,
        report_every: int,
        world_size: int = 0,
        rank: int = 0,
        identity: str | None = None,
    ) -> str:
        """Resume `session_id` with a fresh lease, or open a new session (empty id) for a
        trainer that may say its `rank` among `world_size` trainers (0: not said). Under
        mutual TLS (`identity`) a session belongs to the certificate that opened it: the
        binding is journaled, so no other certificate resumes it, before or after a restart."""
        check_hello(pid, report_every, world_size, rank)
        if session_id:
            # Refused before the lease is renewed: another certificate keeps no session alive.
            deny(resume_refused(self._ledger.state, session_id, identity))
            self.touch(session_id)
            return session_id
        sid = uuid.uuid4().hex
        # The lease from the moment the session is in the state: a trainer gone while the
        # write is in flight cancels this call, and its session must still end (a failed
        # write rebuilds the state, and the leases with it).
        opened = OpenSession(
            sid,
            name,
            host,
            pid,
            report_every,
            identity or "",
            world_size,
            rank if world_size else 0,
        )
        self._choose_steps(world_size)
        _, durable = self._ledger.submit(opened)
        self.leases.renew(sid)
        await durable
        log.info(
            "trainer %s (%s, pid %d%s) opened session %s",
            name,
            host,
            pid,
            f", rank {rank} of {world_size}" if world_size else "",
            sid,
            extra=about(trainer=name, session=sid),
        )
        self._warnings.check()
        return sid

    def _choose_steps(self, world_size: int) -> None:
        """Under `--equal-steps auto`, the first of a job's live trainers sets its mode: equal
        steps (drop) for a trainer that declares a world size, none for one that does not
        (journaled before its session, so a recovering master replays the same)."""
        if self._equal_steps is not StepsSetting.AUTO or self._ledger.state.sessions:
            return
        mode = StepsMode.DROP if world_size else StepsMode.OFF
        if self._ledger.state.steps.mode is mode:
            return
        self._ledger.submit(EqualSteps(mode.value))
        log.info(
            "equal steps %s for this job (--equal-steps auto): its first trainer %s",
            mode.value,
            f"declares a world of {world_size}" if world_size else "declares no world size",
        )

    def touch(self, session: str) -> None:
        """Renew a session's lease (every message does); raise if it has ended."""
        s = self._ledger.state.sessions.get(session)
        if s is None:
            raise SessionExpiredError()
        self.leases.renew(session, s.consumed)

    def data_wait(self, session: str, wait: DataWait) -> None:
        """Keep a trainer's latest figures of its training loop's wait for data (status and
        the metrics show them per trainer; nothing durable)."""
        lease = self.leases.get(session)
        values = (wait.p50, wait.p99, wait.share, wait.window)
        if lease is not None and all(math.isfinite(v) and v >= 0 for v in values):
            lease.data_wait = wait

    async def end(
        self, session: str, reason: str, positions: Iterable[Position] = (), *, charge: bool = False
    ) -> int:
        """End a session; its tasks go back to the front of Todo. How many it held. With
        `charge` (a lost trainer) the task it was reading counts a failure."""
        st = self._ledger.state
        s = st.sessions.get(session)
        if s is None:
            return 0
        ps = own_positions(st, session, positions)
        reading = reading_task(st, session) if charge else None
        quarantined = reading is not None and fail_quarantines(st, reading)
        held = await self._ledger.commit(EndSession(session, reason, ps, charge))
        assert isinstance(held, int)
        self.leases.drop(session)
        self._warnings.check()
        if reading is not None:
            log_failure(self._ledger.state, reading, lost_reason(s), quarantined=quarantined)
        log.log(
            logging.WARNING if reason == TRAINER_LOST_REASON else logging.INFO,
            "session %s of trainer %s (%s, pid %d) ended (%s); %s task(s) it held go back "
            "to the queue",
            session,
            s.name,
            s.host,
            s.pid,
            reason,
            held,
            extra=about(trainer=s.name, session=session, reason=reason),
        )
        return held

    def reset(self) -> None:
        """The sessions the state holds now, and only them, have leases (after a restore)."""
        self.leases.reset(self._ledger.state.sessions)

    async def _lease_expired(self, session: str) -> None:
        if not self._ledger.available:
            raise self._ledger.unavailable()  # the keeper retries shortly
        await self.end(session, TRAINER_LOST_REASON, charge=True)
