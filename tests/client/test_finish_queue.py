"""The finish queue on its own: when finishes go out, and what an answer means for them."""

from __future__ import annotations

from chunkmaster.client import finishes
from chunkmaster.client.finishes import FinishQueue, Verdict
from chunkmaster.core.errors import (
    NotReadyError,
    PassOverError,
    PermissionDeniedError,
    UnavailableError,
)
from chunkmaster.rpc import master_pb2 as pb


def _pos(task: int) -> pb.TaskPosition:
    return pb.TaskPosition(task_id=task, epoch=0, pass_id=0, records=10)


def test_a_finish_goes_alone_after_the_flush_delay_unless_something_carries_it() -> None:
    q = FinishQueue()
    assert q.add(_pos(1), 100.0, asking=False, last=False)  # sooner than "never"
    assert q.flush_at == 100.0 + finishes.FINISH_FLUSH
    assert not q.add(_pos(2), 100.05, asking=False, last=False)  # rides with the first
    assert not q.due(100.05) and q.due(100.0 + finishes.FINISH_FLUSH)
    assert [p.task_id for p in q.take()] == [1, 2]
    assert len(q) == 0 and q.flush_at is None


def test_while_a_task_request_is_in_flight_the_last_finish_goes_at_once() -> None:
    q = FinishQueue()
    q.add(_pos(1), 10.0, asking=True, last=False)
    assert q.flush_at == 10.0 + finishes.FINISH_FLUSH_ASKING
    assert q.add(_pos(2), 10.001, asking=True, last=True)
    assert q.due(10.001)


def test_not_now_queues_them_again_first_after_a_backoff() -> None:
    q = FinishQueue()
    q.add(_pos(3), 0.0, asking=False, last=False)
    sent = [_pos(1), _pos(2)]
    assert q.judge(sent, UnavailableError("disk full"), want_task=False) is Verdict.AGAIN
    assert q.judge(sent, NotReadyError("later"), want_task=True) is Verdict.AGAIN
    assert q.again(sent, 1.0, backoff=0.5)  # the first retry
    assert [p.task_id for p in q.take()] == [1, 2, 3]
    assert not q.may_go(1.2) and q.may_go(1.5)
    q.add(_pos(4), 1.0, asking=False, last=False)
    assert q.flush_at == 1.5  # not before the backoff is over
    assert not q.again([_pos(4)], 1.6, backoff=1.0)  # still the same retry
    assert q.retries == 2
    assert q.judge(sent, None, want_task=False) is Verdict.SETTLED
    assert q.retries == 0 and q.may_go(0.0)


def test_refused_together_for_one_of_them_each_goes_alone() -> None:
    q = FinishQueue()
    refused = PermissionDeniedError("task 0 is another session's")
    assert q.judge([_pos(0), _pos(1)], refused, want_task=False) is Verdict.ALONE
    assert q.judge([_pos(1)], refused, want_task=False) is Verdict.REFUSED
    # a task request's error is its fetcher's to raise
    assert q.judge([_pos(1)], PassOverError("x"), want_task=True) is Verdict.SETTLED


def test_requeued_and_cleared() -> None:
    q = FinishQueue()
    q.requeue([_pos(5)], 2.0)
    assert len(q) == 1 and q.flush_at == 2.0 + finishes.FINISH_FLUSH
    q.clear()
    assert len(q) == 0 and q.flush_at is None and q.retry_at is None
