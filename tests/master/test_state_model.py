"""Model-based test: the core state machine against a deliberately naive reference model.

The reference keeps one label per task ("todo", "pending", "done", "failed") plus explicit
order lists, and re-derives everything by scanning; the real core uses deques, dicts and
arrays. Random events drive both; after every step they must agree.

Sessions too: a session that ends hands its tasks back first in line; one that was lost
(`EndSession(charge=True)`) counts a failure against the task it was reading, the first it
holds in dispatch order, which is quarantined like any failing task once over the limit.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from helpers.datasets import chunk_dataset
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from chunkmaster.core import errors
from chunkmaster.core.events import (
    ApproveSave,
    Dispatch,
    EndSession,
    Fail,
    Finish,
    OpenSession,
    SetDataset,
)
from chunkmaster.core.model import FailedPolicy
from chunkmaster.core.state import (
    Availability,
    MasterState,
    apply,
    check_get_task,
    save_allowed,
)


class Reference:
    def __init__(self, n: int, failure_max: int, policy: FailedPolicy) -> None:
        self.label = ["todo"] * n
        self.order = {"todo": list(range(n)), "done": [], "failed": []}
        self.epoch = [0] * n
        self.pending_epoch: dict[int, int] = {}
        self.pending_order: list[int] = []  # pending tasks in the order they were dispatched
        self.holder: dict[int, str] = {}  # pending task -> the session holding it ("": none)
        self.sessions: set[str] = set()
        self.failures = [0] * n
        self.cur_pass = 0
        self.failure_max = failure_max
        self.policy = policy
        self.saver: tuple[str, float] | None = None

    def move(self, t: int, to: str) -> None:
        if self.label[t] in self.order:
            self.order[self.label[t]].remove(t)
        self.label[t] = to
        if to in self.order:
            self.order[to].append(t)

    def count(self, queue: str) -> int:
        return self.label.count(queue)

    def leave_pending(self) -> None:
        if self.count("todo") == 0 and self.count("pending") == 0:
            self.cur_pass += 1
            done, failed = list(self.order["done"]), list(self.order["failed"])
            for t in done:
                self.move(t, "todo")
            if self.policy is FailedPolicy.RETRY:
                for t in failed:
                    self.failures[t] = 0
                    self.move(t, "todo")

    def dispatch(self, session: str = "") -> int:
        t = self.order["todo"][0]
        self.epoch[t] += 1
        self.pending_epoch[t] = self.epoch[t]
        self.pending_order.append(t)
        self.holder[t] = session
        self.move(t, "pending")
        return t

    def unpend(self, t: int) -> None:
        del self.pending_epoch[t]
        del self.holder[t]
        self.pending_order.remove(t)

    def end_session(self, sid: str, charge: bool) -> int:
        if sid not in self.sessions:
            return 0
        self.sessions.discard(sid)
        held = [t for t in self.pending_order if self.holder[t] == sid]
        over = None
        if charge and held:
            self.failures[held[0]] += 1
            if self.failures[held[0]] > self.failure_max:
                over = held[0]
        for t in reversed(held):
            self.unpend(t)
            if t == over:
                self.move(t, "failed")
                continue
            self.label[t] = "todo"  # back first in line
            self.order["todo"].insert(0, t)
        if over is not None:
            self.leave_pending()
        return len(held)

    def finish(self, t: int, epoch: int, pass_id: int) -> bool:
        if self.label[t] != "pending":
            return False
        if pass_id >= 0 and pass_id != self.cur_pass:
            return False
        if epoch > self.pending_epoch[t]:
            return False
        self.unpend(t)
        self.failures[t] = 0
        self.move(t, "done")
        self.leave_pending()
        return True

    def fail(self, t: int, epoch: int) -> bool:
        if self.label[t] != "pending" or self.pending_epoch[t] != epoch:
            return False
        self.unpend(t)
        self.failures[t] += 1
        self.move(t, "failed" if self.failures[t] > self.failure_max else "todo")
        self.leave_pending()
        return True


class StateMachineVsReference(RuleBasedStateMachine):
    @initialize(
        chunks=st.integers(1, 12),
        cpt=st.integers(-1, 4),
        failure_max=st.integers(0, 2),
        policy=st.sampled_from(list(FailedPolicy)),
    )
    def setup(self, chunks: int, cpt: int, failure_max: int, policy: FailedPolicy) -> None:
        ds = chunk_dataset([1] * chunks, cpt)
        self.state = MasterState(failure_max=failure_max, failed_policy=policy)
        apply(self.state, SetDataset(ds))
        self.ref = Reference(ds.num_tasks, failure_max, policy)
        self.max_epoch_seen = [0] * ds.num_tasks
        self.now = 0.0
        self.requests = 0

    @rule(sid=st.sampled_from(["a", "b", "c"]))
    def open_session(self, sid: str) -> None:
        apply(self.state, OpenSession(sid, f"trainer {sid}", "host", 7))
        self.ref.sessions.add(sid)

    @rule(sid=st.sampled_from(["a", "b", "c"]), charge=st.booleans())
    def end_session(self, sid: str, charge: bool) -> None:
        """A trainer says goodbye, or is lost: then the task it was reading is charged."""
        reason = "trainer lost" if charge else "returned"
        held = apply(self.state, EndSession(sid, reason, (), charge))
        assert held == self.ref.end_session(sid, charge)

    @rule(offset=st.integers(-2, 2), sid=st.sampled_from(["", "a", "b", "c"]))
    def get_task(self, offset: int, sid: str) -> None:
        if sid not in self.ref.sessions:
            sid = ""
        pass_id = self.ref.cur_pass + offset
        expected: type[Exception] | Availability
        if offset < 0:
            expected = errors.PassBeforeError
        elif offset > 0:
            expected = errors.PassAfterError
        elif self.ref.count("todo"):
            expected = Availability.DISPATCH
        elif self.ref.count("pending"):
            expected = Availability.WAIT
        else:
            expected = errors.AllTaskFailedError
        if isinstance(expected, Availability):
            assert check_get_task(self.state, pass_id) is expected
            if expected is Availability.DISPATCH:
                self.requests += 1
                task = apply(self.state, Dispatch(self.now + 10, "w", f"req-{self.requests}", sid))
                t = self.ref.dispatch(sid)
                assert task.meta.id == t and task.meta.epoch == self.ref.epoch[t]
                assert task.pass_id == self.ref.cur_pass
                assert task.failures == self.ref.failures[t]  # a trainer settles around it
        else:
            with pytest.raises(expected):
                check_get_task(self.state, pass_id)

    @precondition(lambda self: self.ref.count("pending") > 0)
    @rule(data=st.data(), stale=st.booleans(), wrong_pass=st.booleans())
    def finish_pending(self, data: st.DataObject, stale: bool, wrong_pass: bool) -> None:
        t = data.draw(st.sampled_from(sorted(self.ref.pending_epoch)))
        epoch = self.ref.pending_epoch[t] - (1 if stale else 0)
        pass_id = self.ref.cur_pass + (1 if wrong_pass else 0)
        assert apply(self.state, Finish(t, epoch, pass_id)) == self.ref.finish(t, epoch, pass_id)

    @rule(data=st.data(), epoch=st.integers(0, 5))
    def report_anything(self, data: st.DataObject, epoch: int) -> None:
        """Reports about any task, any epoch: harmless unless they match a pending dispatch."""
        t = data.draw(st.integers(0, len(self.ref.label) - 1))
        if data.draw(st.booleans()):
            assert apply(self.state, Fail(t, epoch, "r")) == self.ref.fail(t, epoch)
        else:
            assert apply(self.state, Finish(t, epoch, -1)) == self.ref.finish(t, epoch, -1)

    @precondition(lambda self: self.ref.count("pending") > 0)
    @rule(data=st.data(), reason=st.sampled_from(["timeout", "bad chunk"]))
    def fail_pending(self, data: st.DataObject, reason: str) -> None:
        t = data.draw(st.sampled_from(sorted(self.ref.pending_epoch)))
        epoch = self.ref.pending_epoch[t]
        assert apply(self.state, Fail(t, epoch, reason)) is self.ref.fail(t, epoch) is True
        assert self.state.failure_log[t][-1].reason == reason

    @rule(trainer=st.sampled_from(["a", "b"]), dur=st.floats(0, 5), advance=st.floats(0, 3))
    def save_model(self, trainer: str, dur: float, advance: float) -> None:
        self.now += advance
        s = self.ref.saver
        allowed = s is None or s[1] <= self.now or s[0] == trainer
        assert save_allowed(self.state, trainer, self.now) is allowed
        if allowed:
            apply(self.state, ApproveSave(trainer, self.now + dur))
            self.ref.saver = (trainer, self.now + dur)

    @invariant()
    def queues_agree(self) -> None:
        s, r = self.state, self.ref
        assert list(s.todo) == r.order["todo"]
        assert s.done == r.order["done"]
        assert s.failed == r.order["failed"]
        assert {t: p.epoch for t, p in s.pending.items()} == r.pending_epoch
        assert list(s.pending) == r.pending_order  # which task a lost session was reading
        assert {t: p.session for t, p in s.pending.items()} == r.holder
        assert set(s.sessions) == r.sessions
        assert s.cur_pass == r.cur_pass
        assert [s.num_failures.get(t, 0) for t in range(len(r.label))] == r.failures

    @invariant()
    def request_ids_index_exactly_the_pending_dispatches(self) -> None:
        s = self.state
        assert s.requests == {p.request: t for t, p in s.pending.items()}

    @invariant()
    def every_task_in_exactly_one_queue(self) -> None:
        s = self.state
        seen = list(s.todo) + list(s.pending) + s.done + s.failed
        assert sorted(seen) == list(range(s.num_tasks))

    @invariant()
    def epochs_only_grow(self) -> None:
        for t, e in enumerate(self.state.epochs):
            assert e >= self.max_epoch_seen[t]
            self.max_epoch_seen[t] = e

    @invariant()
    def a_pass_never_stalls(self) -> None:
        """Todo and Pending are never both empty while Done holds work (RETRY: or Failed)."""
        s = self.state
        if not s.todo and not s.pending:
            assert not s.done
            if s.failed_policy is FailedPolicy.RETRY:
                assert not s.failed


TestStateMachine = StateMachineVsReference.TestCase
TestStateMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
