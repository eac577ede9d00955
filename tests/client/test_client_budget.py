"""The error budget as a trainer's Client sees it, with a session and with the unary calls: a
chunk with a bad checksum within the budget is an ordinary end of pass without its records;
over the budget next_record() and records() raise JobStoppedError naming the file."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.datasets import checksum_broken
from helpers.inproc import InProcessMaster

from chunkmaster.client import Client, EndOfPass, TaskReadError
from chunkmaster.core.errors import JobStoppedError
from chunkmaster.core.quarantine import ErrorBudget


@contextlib.contextmanager
def _reading(budget: int, session: bool) -> Iterator[tuple[InProcessMaster, Client]]:
    """A master that quarantines up to `budget` records (a failed task is never retried),
    and a client of it."""
    master = InProcessMaster(
        chunks_per_task=1, timeout_dur=30.0, failure_max=0, error_budget=ErrorBudget(budget)
    )
    with master as m, Client(m.addr, session=session) as c:
        yield m, c


def _read_pass(c: Client) -> tuple[list[bytes], list[TaskReadError], BaseException]:
    got: list[bytes] = []
    errors: list[TaskReadError] = []
    c.start_get_records(0)
    while True:
        try:
            got.append(c.next_record(timeout=30))
        except TaskReadError as exc:
            errors.append(exc)
        except (EndOfPass, JobStoppedError) as exc:
            return got, errors, exc


@pytest.mark.parametrize("session", [True, False])
def test_within_budget_the_pass_ends_without_the_bad_chunk(tmp_path: Path, session: bool) -> None:
    path, records, bad, _ = checksum_broken(tmp_path / "bad.rio")
    with _reading(10, session) as (m, c):
        c.set_dataset([path])
        got, errors, end = _read_pass(c)
        assert isinstance(end, EndOfPass) and len(errors) == 1
        assert Counter(got) == Counter(r for r in records if r not in bad)
        st = m.status_view()
        assert st.job_stopped is None
        assert {e.pass_id: e.quarantined for e in st.ledger}[0] == len(bad)


@pytest.mark.parametrize("session", [True, False])
def test_over_budget_next_record_and_records_raise_job_stopped(
    tmp_path: Path, session: bool
) -> None:
    path, _, _, bad_offset = checksum_broken(tmp_path / "bad.rio")
    with _reading(0, session) as (_, c):
        c.set_dataset([path])
        _, errors, end = _read_pass(c)
        assert len(errors) == 1
        assert isinstance(end, JobStoppedError)
        assert path in str(end) and f"offset(s) {bad_offset}" in str(end)
        assert "ChecksumError" in str(end)
        with pytest.raises(JobStoppedError) as info:
            for _ in c.records(0):
                pass
        assert str(info.value) == str(end)
        with pytest.raises(JobStoppedError):
            for _ in c.records(1):  # any pass: the job stopped
                pass
