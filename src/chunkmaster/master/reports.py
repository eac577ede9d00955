"""Trainers' reports on the tasks they hold: finishes, failures, progress, tasks handed back.

One path each, whichever way the report came (a unary call, a session message): its values
checked (master/checks.py), refused if it names a task another trainer holds
(master/owners.py), then applied as events before the call returns, so a report is never
overtaken by a later message of the same trainer; the awaitable each returns completes once
the events are durable.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

from chunkmaster.core.errors import FILE_CHANGED
from chunkmaster.core.events import Fail, Finish, Progress, ReturnTasks, StopJob
from chunkmaster.core.master_state import MasterState
from chunkmaster.core.model import FailedPolicy, Position, TaskMeta
from chunkmaster.core.quarantine import describe
from chunkmaster.core.queues import fail_ignored, fail_quarantines, finish_ignored
from chunkmaster.logs import about
from chunkmaster.master.checks import check_report, deny
from chunkmaster.master.ledger import Ledger, after, started
from chunkmaster.master.owners import own_positions, session_report_refused, unary_report_refused

log = logging.getLogger("chunkmaster.service")


class Reports:
    """`deadline()`: when a session that reports progress now may time out next (now plus
    the task timeout: master/timeouts.py)."""

    def __init__(self, ledger: Ledger, deadline: Callable[[], float]) -> None:
        self._ledger = ledger
        self._deadline = deadline

    def _refuse_foreign(
        self, task_ids: Iterable[int], session: str | None, identity: str | None
    ) -> None:
        """A session reports its own tasks only; a trainer without one only tasks handed out
        by unary GetTask (and under mutual TLS, to its certificate)."""
        st = self._ledger.state
        if session is None:
            deny(*(unary_report_refused(st, t, identity) for t in task_ids))
        else:
            deny(*(session_report_refused(st, session, t) for t in task_ids))

    def finish(
        self, finishes: Sequence[Finish], *, session: str | None = None, identity: str | None = None
    ) -> Awaitable[int]:
        """Finish each task, in order; awaitable: how many finishes applied (a report about a
        task no longer pending, or of another pass, applies nothing). All or none: one on a
        task another trainer holds refuses them all (PermissionDeniedError naming it)."""
        for f in finishes:
            check_report(f.task_id, f.epoch, f.pass_id)
        self._refuse_foreign((f.task_id for f in finishes), session, identity)
        applied = 0
        durable: Awaitable[None] | None = None
        for ev in finishes:
            why = finish_ignored(self._ledger.state, ev)
            if why is not None:
                log.info(
                    "finish of task %d (epoch %d) ignored: %s",
                    ev.task_id,
                    ev.epoch,
                    why,
                    extra=about(task=ev.task_id, epoch=ev.epoch),
                )
                continue
            _, durable = self._ledger.submit(ev)
            applied += 1
        return after(durable if durable is not None else self._ledger.written(), applied)

    def finish_positions(self, session: str, positions: Iterable[Position]) -> Awaitable[int]:
        """Finish each task of the session at its position, as `finish` does, in order."""
        return self.finish(
            [Finish(p.task_id, p.epoch, p.pass_id) for p in positions], session=session
        )

    def fail(
        self,
        meta: TaskMeta,
        reason: str,
        *,
        session: str | None = None,
        identity: str | None = None,
    ) -> Awaitable[int]:
        """A trainer could not process a dispatch; its reason stays visible in status."""
        check_report(meta.id, meta.epoch)
        self._refuse_foreign((meta.id,), session, identity)
        if reason.startswith(FILE_CHANGED):
            return self._file_changed(meta, reason)
        ev = Fail(meta.id, meta.epoch, reason or "failed (no reason given)")
        why = fail_ignored(self._ledger.state, ev)
        if why is not None:
            log.info("failure of task %d (epoch %d) ignored: %s", meta.id, meta.epoch, why)
            return after(self._ledger.written(), 0)
        quarantined = fail_quarantines(self._ledger.state, meta.id)
        _, durable = self._ledger.submit(ev)
        log_failure(self._ledger.state, meta.id, ev.reason, quarantined=quarantined)
        return after(durable, 1)

    def _file_changed(self, meta: TaskMeta, reason: str) -> Awaitable[int]:
        """A trainer found a dataset file changed since it was indexed: not the task's fault,
        so nothing is charged to it; the job stops (every task of the file is affected), and
        every trainer gets JobStoppedError naming the file and what to do."""
        message = f"job stopped: {reason}"
        if self._ledger.state.stopped is not None:  # stopped already: the first says why
            log.info("task %d: %s", meta.id, reason, extra=about(task=meta.id))
            return after(self._ledger.written(), 0)
        _, durable = self._ledger.submit(StopJob(message))
        log.error(
            "%s (found by the trainer reading task %d)",
            message,
            meta.id,
            extra=about(task=meta.id, reason=reason),
        )
        return after(durable, 1)

    def progress(self, session: str, positions: Iterable[Position]) -> int:
        """Record how far the session's trainer got; nobody waits for it to be durable. A
        position that moved is progress: the session's tasks are safe from timing out for
        another task timeout. How many positions moved; positions on tasks another trainer
        holds change nothing and raise PermissionDeniedError naming them, once the session's
        own are recorded."""
        ps = list(positions)
        own = own_positions(self._ledger.state, session, ps)
        applied = 0
        if own and self._ledger.available:
            result, durable = self._ledger.submit(Progress(own, self._deadline()), lazy=True)
            assert isinstance(result, int)
            applied = result
            started(durable)
        st = self._ledger.state
        deny(*(session_report_refused(st, session, pos.task_id) for pos in ps))
        return applied

    def returned(self, session: str, positions: Iterable[Position]) -> Awaitable[int]:
        """Hand the session's tasks named back at their positions; awaitable: how many."""
        ps = own_positions(self._ledger.state, session, positions)
        if not ps:
            return after(self._ledger.written(), 0)
        if not self._ledger.available:
            raise self._ledger.unavailable()
        back, durable = self._ledger.submit(ReturnTasks(session, ps))
        assert isinstance(back, int)
        return after(durable, back)


def log_failure(st: MasterState, task_id: int, reason: str, *, quarantined: bool) -> None:
    """One line for a failure just applied: the task goes round again, or is quarantined
    (and the job may have stopped). `quarantined` is asked before the failure is applied
    (core.queues.fail_quarantines): a quarantine that ends the pass leaves no trace of it in
    the failed queue under the retry policy."""
    n = st.failure_total.get(task_id, 0)
    extra = about(pass_id=st.cur_pass, task=task_id, reason=reason)
    if not quarantined:
        log.warning("task %d failed (%s); dispatching it again", task_id, reason, extra=extra)
        return
    q = describe(st, task_id)
    left_out = q.reasons[-1].pass_id if q.reasons else st.cur_pass
    retried = (
        "; it is handed out again in the next pass (--failed-policy retry)"
        if st.failed_policy is FailedPolicy.RETRY or st.mix is not None
        else ""
    )
    log.warning(
        "task %d failed %d times, over the limit of %d; quarantined: left out of pass %d%s: %s",
        task_id,
        n,
        st.failure_max,
        left_out,
        retried,
        q.describe(),
        extra=extra,
    )
    if st.stopped is not None and task_id in st.stopped.tasks:
        log.error("%s", st.stopped.message, extra=extra)
