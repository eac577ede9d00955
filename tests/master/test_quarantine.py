"""Poison tasks and the error budget, on the pure state: quarantine counts, the stop, a new
budget deciding again, the keep policy, and the journal/snapshot bytes of all of it."""

from __future__ import annotations

from fractions import Fraction

import pytest

from chunkmaster.core.codec import decode_event, decode_snapshot, encode_event, encode_snapshot
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.errors import JobStoppedError
from chunkmaster.core.events import (
    Configure,
    Dispatch,
    Fail,
    Finish,
    Progress,
    SetDataset,
    SetErrorBudget,
)
from chunkmaster.core.model import FailedPolicy, Position
from chunkmaster.core.quarantine import ErrorBudget, describe
from chunkmaster.core.state import MasterState, apply, check_get_task
from chunkmaster.master.config import ConfigError, MasterConfig


def dataset() -> Dataset:
    """4 tasks of 2 chunks (10 records each): tasks 0-1 in a.rio, 2-3 in b.rio."""
    offsets = [0, 100, 200, 300]
    return Dataset.build(
        ["/d/*.rio"], ["/d/a.rio", "/d/b.rio"], [(offsets, [5] * 4), (offsets, [5] * 4)], 2
    )


def state(budget: str = "unlimited", failure_max: int = 0, policy: str = "retry") -> MasterState:
    s = MasterState()
    apply(s, SetDataset(dataset()))
    apply(s, Configure(failure_max, FailedPolicy(policy)))
    apply(s, SetErrorBudget(ErrorBudget.parse(budget)))
    return s


def fail_next(s: MasterState, reason: str = "ChecksumError in /d/b.rio") -> int:
    task = apply(s, Dispatch(100.0))
    assert task is not None and not isinstance(task, (bool, int))
    apply(s, Fail(task.meta.id, task.meta.epoch, reason))
    return task.meta.id


def finish_next(s: MasterState) -> None:
    task = apply(s, Dispatch(100.0))
    assert task is not None and not isinstance(task, (bool, int))
    apply(s, Finish(task.meta.id, task.meta.epoch))


@pytest.mark.parametrize(
    ("text", "records", "percent", "shown"),
    [
        ("unlimited", None, None, "unlimited"),
        ("0", 0, None, "0"),
        ("12", 12, None, "12"),
        ("0.1%", None, Fraction(1, 10), "0.1%"),
        ("5%", None, Fraction(5), "5%"),
    ],
)
def test_budget_texts(text: str, records: int | None, percent: Fraction | None, shown: str) -> None:
    b = ErrorBudget.parse(text)
    assert (b.records, b.percent, str(b)) == (records, percent, shown)
    assert ErrorBudget.parse(str(b)) == b


@pytest.mark.parametrize("text", ["-1", "1.5", "abc", "101%", "%", "10 %x"])
def test_bad_budget_texts_name_the_flag(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        MasterConfig.from_text({"max_failed_records": text})
    assert info.value.fields == ("max_failed_records",)


def test_percent_limits_round_down_exactly() -> None:
    assert ErrorBudget.parse("0.29%").limit(10_000) == 29  # no float rounding to 28
    assert ErrorBudget.parse("10%").limit(45) == 4
    assert ErrorBudget.parse("10%").limit(None) is None


def test_unlimited_quarantines_counts_and_goes_on() -> None:
    s = state()
    bad = fail_next(s)
    assert s.failed == [bad] and s.stopped is None
    assert s.pass_ledger().quarantined == 10
    q = describe(s, bad)
    assert q.files == ("/d/a.rio",) and [c.offset for c in q.chunks] == [0, 100]
    assert (
        q.records == 10 and "ChecksumError" in q.describe() and "offset(s) 0, 100" in q.describe()
    )
    for _ in range(3):
        finish_next(s)
    assert s.cur_pass == 1  # the pass ended without the quarantined task


def test_only_the_records_not_delivered_count() -> None:
    s = state()
    task = apply(s, Dispatch(100.0))
    assert task is not None and not isinstance(task, (bool, int))
    apply(s, Progress((Position(task.meta.id, task.meta.epoch, 0, 7),)))
    apply(s, Fail(task.meta.id, task.meta.epoch, "bad chunk"))
    assert s.pass_ledger().quarantined == 3


def test_over_budget_the_job_stops_naming_tasks_files_and_reasons() -> None:
    s = state("15", failure_max=1)
    assert [fail_next(s, "first try") for _ in range(4)] == [0, 1, 2, 3]
    assert s.failed == [] and s.pass_ledger().quarantined == 0  # within failure_max: retried
    assert fail_next(s, "checksum of /d/a.rio") == 0  # its second failure: quarantined
    assert s.failed == [0] and s.stopped is None  # 10 records of 15
    assert fail_next(s, "cannot read /d/b.rio") == 1  # 20 > 15
    stop = s.stopped
    assert stop is not None and (stop.pass_id, stop.records, stop.limit) == (0, 20, 15)
    assert stop.tasks == (0, 1)
    assert "/d/a.rio" in stop.message and "cannot read /d/b.rio" in stop.message
    assert "task 0" in stop.message and "task 1" in stop.message
    with pytest.raises(JobStoppedError) as info:
        check_get_task(s, 0)
    assert str(info.value) == stop.message
    with pytest.raises(JobStoppedError):
        check_get_task(s, 5)  # whatever pass a trainer asks for


def test_a_new_budget_decides_again() -> None:
    s = state("0")
    fail_next(s)
    assert s.stopped is not None
    apply(s, SetErrorBudget(ErrorBudget.parse("5")))
    assert s.stopped is not None  # 10 records lost: still over
    apply(s, SetErrorBudget(ErrorBudget.parse("50%")))  # 40 of 80 records
    assert s.stopped is None
    check_get_task(s, 0)
    apply(s, SetErrorBudget(ErrorBudget.parse("9")))  # lowered under what this pass lost
    assert s.stopped is not None and s.stopped.limit == 9


def test_keep_policy_counts_the_kept_out_tasks_in_every_pass() -> None:
    s = state("10", policy="keep")
    fail_next(s)
    for _ in range(3):
        finish_next(s)
    assert s.cur_pass == 1 and s.failed == [0]
    assert s.pass_ledger(0).quarantined == 10 and s.pass_ledger(1).quarantined == 10
    assert s.stopped is None  # 10 is within 10
    fail_next(s)  # another task in pass 1: 20 > 10
    assert s.stopped is not None and s.stopped.pass_id == 1 and s.stopped.tasks == (0, 1)


def test_retry_policy_starts_each_pass_afresh() -> None:
    s = state("10", policy="retry")
    fail_next(s)
    for _ in range(3):
        finish_next(s)
    assert s.cur_pass == 1 and s.failed == [] and s.pass_ledger(1).quarantined == 0


def test_journal_and_snapshot_keep_the_budget_and_the_stop() -> None:
    for ev in (
        SetErrorBudget(ErrorBudget()),
        SetErrorBudget(ErrorBudget.parse("7")),
        SetErrorBudget(ErrorBudget.parse("0.25%")),
    ):
        assert decode_event(encode_event(ev)) == ev
    s = state("0.25%", policy="keep")
    fail_next(s)
    assert s.stopped is not None
    back = decode_snapshot(encode_snapshot(s))
    assert back.error_budget == s.error_budget and back.stopped == s.stopped
    assert back.ledger == s.ledger
    with pytest.raises(JobStoppedError):
        check_get_task(back, 0)
    # Replaying the same events on a fresh state gives the same stop.
    again = state("0.25%", policy="keep")
    fail_next(again)
    assert again.stopped == s.stopped


def test_a_job_whose_every_task_was_kept_out_retries_them_when_restarted_with_retry() -> None:
    """Under `keep` a pass whose every task failed has nothing left to hand out; a master
    restarted with `--failed-policy retry` must hand them out again in a new pass, not serve
    "all tasks failed" for ever (the state-machine test found it stalled)."""
    s = state(policy="keep")
    for _ in range(4):
        fail_next(s)
    assert (s.cur_pass, len(s.failed), len(s.todo)) == (1, 4, 0)
    apply(s, Configure(0, FailedPolicy.RETRY))
    assert (s.cur_pass, sorted(s.todo), s.failed) == (2, [0, 1, 2, 3], [])
    task = apply(s, Dispatch(100.0))
    assert task is not None and not isinstance(task, (bool, int)) and task.pass_id == 2
