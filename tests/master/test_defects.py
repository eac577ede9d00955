"""What a data-dispatch master must get right under failure: a pass that ends however its last
task left, a wait bounded by the caller's, no half-applied write, failures kept visible,
save-model windows, stable task IDs, a dataset that cannot block the master, retried calls."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from helpers.aio import still_waiting, until
from helpers.clock import Clock
from helpers.datasets import numbered_records
from helpers.service import started_service
from helpers.sqlite_lock import next_write_held

from chunkmaster import (
    AllTaskFailedError,
    DatasetError,
    InMemStore,
    NoMoreAvailableError,
    PassAfterError,
    PassBeforeError,
    Service,
    SqliteStore,
    TaskMeta,
    UnavailableError,
)
from chunkmaster.core.errors import (
    DatasetMismatchError,
    NoDatasetError,
    NotReadyError,
    TrainerIdEmptyError,
)
from chunkmaster.store.base import StoreError

T = TypeVar("T")


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await coro_fn()

    return asyncio.run(main())


def records_file(path: Path, n: int) -> str:
    return numbered_records(path, n, b"r%d")


def test_pass_rolls_over_when_the_last_task_fails(tmp_path: Path) -> None:
    f = records_file(tmp_path / "a.rio", 2)

    async def main() -> None:
        async with started_service(
            InMemStore(), chunks_per_task=1, timeout_dur=60, failure_max=0, data=[f]
        ) as svc:
            a, b = await svc.get_task(0), await svc.get_task(0)
            await svc.task_finished(a.meta.id)
            assert await svc.task_failed(b.meta, "disk on fire")  # the last one leaves by failing
            assert svc.status_view().cur_pass == 1

    run(main)


def test_pass_rolls_over_when_every_task_fails_and_keep_policy_reports(tmp_path: Path) -> None:
    f = records_file(tmp_path / "a.rio", 2)

    async def main() -> None:
        async with started_service(
            InMemStore(),
            chunks_per_task=1,
            timeout_dur=60,
            failure_max=0,
            failed_policy="keep",
            data=[f],
        ) as svc:
            for _ in range(2):
                t = await svc.get_task(0)
                await svc.task_failed(t.meta, "unreadable")
            st = svc.status()
            assert st["cur_pass"] == 1 and st["failed"] == 2 and st["todo"] == 0
            assert {t["id"] for t in st["failed_tasks"]} == {0, 1}
            with pytest.raises(AllTaskFailedError, match="^all task finished$"):
                await svc.get_task(1)

    run(main)


def test_a_master_restarted_with_retry_hands_out_the_tasks_keep_kept_out(tmp_path: Path) -> None:
    """Every task failed under `--failed-policy keep`, so the job had nothing to hand out; the
    same store under a master started with `retry` goes on with a new pass of them."""
    f = records_file(tmp_path / "a.rio", 2)
    db = str(tmp_path / "state.db")

    async def main() -> None:
        async with started_service(
            SqliteStore(db),
            chunks_per_task=1,
            timeout_dur=60,
            failure_max=0,
            failed_policy="keep",
            data=[f],
        ) as svc:
            for _ in range(2):
                t = await svc.get_task(0)
                await svc.task_failed(t.meta, "unreadable")
            with pytest.raises(AllTaskFailedError):
                await svc.get_task(1)
        async with started_service(
            SqliteStore(db), chunks_per_task=1, timeout_dur=60, failed_policy="retry"
        ) as svc:
            st = svc.status()
            assert (st["cur_pass"], st["todo"], st["failed"]) == (2, 2, 0), st
            got = {(await svc.get_task(2)).meta.id for _ in range(2)}
            assert got == {0, 1}

    run(main)


def test_a_waiting_trainer_gets_a_timed_out_task_in_the_same_pass(tmp_path: Path) -> None:
    f = records_file(tmp_path / "a.rio", 2)

    async def main() -> None:
        async with started_service(
            InMemStore(), chunks_per_task=1, timeout_dur=0.2, failure_max=3, data=[f]
        ) as svc:
            a = await svc.get_task(0, worker="A")
            b = await svc.get_task(0, worker="B")  # B will vanish
            await svc.task_finished(a.meta.id)
            # A asks again in pass 0: nothing in Todo, B's task pending. A waits, not "no more".
            again = await svc.get_task(0, wait=30.0, worker="A")
            assert again.meta.id == b.meta.id and again.meta.epoch == b.meta.epoch + 1
            assert again.pass_id == 0
            await svc.task_finished(again.meta.id)
            assert svc.status_view().cur_pass == 1

    run(main)


def test_no_more_available_only_after_the_callers_deadline(tmp_path: Path) -> None:
    f = records_file(tmp_path / "a.rio", 1)

    async def main() -> None:
        async with started_service(
            InMemStore(), chunks_per_task=1, timeout_dur=600, failure_max=3, data=[f]
        ) as svc:
            t = await svc.get_task(0)
            waiter = asyncio.create_task(svc.get_task(0, wait=30.0))
            assert await still_waiting([waiter])
            await svc.task_finished(t.meta.id)  # the pass ends: the waiter learns at once
            with pytest.raises(PassBeforeError):
                await waiter
            t1 = await svc.get_task(1)
            assert t1.meta.id == t.meta.id
            with pytest.raises(NoMoreAvailableError, match="^no more available task$"):
                await svc.get_task(1, wait=0.05)

    run(main)


def test_a_failed_write_leaves_no_half_applied_state(tmp_path: Path) -> None:
    """A real SQLite failure: another connection holds the write lock."""
    f = records_file(tmp_path / "a.rio", 3)
    db = tmp_path / "state.db"

    async def main() -> None:
        async with started_service(
            SqliteStore(db, busy_timeout=0.1), chunks_per_task=1, timeout_dur=60, data=[f]
        ) as svc:
            blocker = sqlite3.connect(db, isolation_level=None)
            blocker.execute("BEGIN EXCLUSIVE")
            with pytest.raises(UnavailableError, match="database is locked"):
                await svc.get_task(0)
            blocker.execute("ROLLBACK")
            blocker.close()
            # the repair loop rebuilds the state from the store: nothing pending, no orphan
            for _ in range(200):
                if svc.status_view().store.healthy:
                    break
                await asyncio.sleep(0.02)
            st = svc.status_view()
            assert st.store.healthy and st.todo == 3 and st.pending == 0
            t = await svc.get_task(0)
            assert t.meta.epoch == 1  # the failed dispatch never happened
            assert svc.status_view().pending_tasks[0].id == t.meta.id

    run(main)


def test_failures_and_reasons_stay_visible_and_retry_gets_a_fresh_count(tmp_path: Path) -> None:
    f = records_file(tmp_path / "a.rio", 2)

    async def main() -> None:
        async with started_service(
            InMemStore(), chunks_per_task=1, timeout_dur=60, failure_max=1, data=[f]
        ) as svc:
            good = await svc.get_task(0)
            await svc.task_finished(good.meta.id)
            for reason in ("bad chunk", "still bad"):
                t = await svc.get_task(0)
                await svc.task_failed(t.meta, reason)
            st = svc.status()
            assert st["cur_pass"] == 1  # rolled over with the failed task
            (ft,) = st["failed_tasks"]
            assert [r["reason"] for r in ft["reasons"]] == ["bad chunk", "still bad"]
            assert ft["total_failures"] == 2 and ft["failures"] == 0  # fresh count for pass 1
            order = [(await svc.get_task(1)).meta.id for _ in range(2)]
            assert order == [good.meta.id, ft["id"]]  # done first, then the retried failure

    run(main)


def test_save_model_windows_belong_to_their_approval() -> None:
    clock = Clock()

    async def main() -> None:
        async with started_service(InMemStore(), clock=clock) as svc:
            with pytest.raises(TrainerIdEmptyError, match="^trainer id is empty$"):
                await svc.request_save_model("", 1.0)
            assert await svc.request_save_model("A", 1.0)
            assert not await svc.request_save_model("B", 1.0)
            clock.now += 0.5
            assert await svc.request_save_model("A", 10.0)  # renewed: A's window is now 10 s
            clock.now += 2.0  # the first window would have ended here
            assert not await svc.request_save_model("B", 1.0)
            clock.now += 9.0
            assert await svc.request_save_model("B", 1.0)  # A's window is over
            assert svc.status_view().save_model.trainer_id == "B"

    run(main)


def test_task_ids_are_small_sequential_and_stable_across_passes(tmp_path: Path) -> None:
    f = records_file(tmp_path / "a.rio", 7)

    async def main() -> None:
        async with started_service(
            InMemStore(), chunks_per_task=2, timeout_dur=60, data=[f]
        ) as svc:
            per_pass = []
            for p in range(2):
                tasks = [await svc.get_task(p) for _ in range(4)]
                per_pass.append({t.meta.id: t.chunks for t in tasks})
                for t in tasks:
                    await svc.task_finished(t.meta.id)
            assert sorted(per_pass[0]) == [0, 1, 2, 3]
            assert per_pass[0] == per_pass[1]

    run(main)


def test_set_dataset_does_not_block_other_calls(tmp_path: Path) -> None:
    """A FIFO as a dataset file is refused, never opened in a way that blocks (recordio checks
    that a path is a regular file first); while the index loads, every other call answers."""
    fifo = tmp_path / "slow.rio"
    os.mkfifo(fifo)

    async def main() -> None:
        async with started_service(InMemStore(), timeout_dur=60) as svc:
            loading = asyncio.create_task(svc.set_dataset([str(fifo)]))
            await asyncio.wait([loading], timeout=0.1)  # it runs (and a FIFO is refused at once)
            assert await svc.request_save_model("A", 1.0)
            assert svc.status_view().ready is False
            with pytest.raises(NotReadyError):
                await svc.get_task(0, wait=0.0)
            with pytest.raises(DatasetError, match="is a FIFO, not a regular file"):
                await loading

    run(main)


def test_duplicates_removed_and_the_dataset_spec_persists(tmp_path: Path) -> None:
    a = records_file(tmp_path / "a.rio", 2)
    records_file(tmp_path / "b.rio", 3)
    db = tmp_path / "state.db"
    globs = [str(tmp_path / "*.rio"), a]

    async def first() -> None:
        async with started_service(SqliteStore(db), chunks_per_task=1, timeout_dur=60) as svc:
            with pytest.raises(NoDatasetError, match="^no dataset specified$"):
                await svc.set_dataset([])
            with pytest.raises(DatasetError, match="^no valid dataset specified"):
                await svc.set_dataset([str(tmp_path / "nothing-*.rio")])
            await svc.set_dataset(globs)
            st = svc.status_view()
            assert st.dataset.files == 2 and st.num_tasks == 5
            with pytest.raises(DatasetMismatchError, match="differs from the master's"):
                await svc.set_dataset([a])  # the first dataset wins: another one is refused
            await svc.set_dataset([str(tmp_path / "b.rio"), a, a])  # its files: a no-op

    async def second() -> None:
        async with started_service(SqliteStore(db), chunks_per_task=1, timeout_dur=60) as svc:
            st = svc.status()
            assert st["ready"] and st["dataset"]["globs"] == globs and st["num_tasks"] == 5
            with pytest.raises(NoDatasetError):  # checked even after initialisation
                await svc.set_dataset([])

    run(first)
    run(second)


def test_finish_from_an_older_dispatch_still_pending_completes_it(tmp_path: Path) -> None:
    f = records_file(tmp_path / "a.rio", 2)

    async def main() -> None:
        async with started_service(
            InMemStore(), chunks_per_task=1, timeout_dur=60, failure_max=5, data=[f]
        ) as svc:
            t = await svc.get_task(0)
            await svc.task_failed(t.meta, "flaky")
            other = await svc.get_task(0)
            again = await svc.get_task(0)
            assert again.meta.id == t.meta.id and again.meta.epoch == 2
            assert await svc.task_finished(t.meta.id, epoch=1, pass_id=0)  # the older dispatch
            assert not await svc.task_finished(t.meta.id, epoch=2)  # already done: harmless
            assert not await svc.task_failed(TaskMeta(t.meta.id, 2), "late")
            assert not await svc.task_finished(12345)
            await svc.task_finished(other.meta.id)
            assert svc.status_view().cur_pass == 1

    run(main)


def test_two_masters_never_share_one_embedded_store(tmp_path: Path) -> None:
    db = tmp_path / "state.db"

    async def main() -> None:
        first = Service(SqliteStore(db))
        await first.start()
        with pytest.raises(StoreError, match="in use by another master"):
            await Service(SqliteStore(db)).start()
        await first.close()

    run(main)


def test_a_retried_get_task_gets_the_same_task_not_a_stranded_one(tmp_path: Path) -> None:
    """The answer to a GetTask can be lost (the master crashed after journaling the dispatch,
    or the caller's deadline passed). Its retry, with the same request ID, must get the same
    task back, also after recovery, instead of leaving it pending until its timeout."""
    f = records_file(tmp_path / "a.rio", 3)
    db = tmp_path / "state.db"

    async def first() -> tuple[int, int]:
        async with started_service(
            SqliteStore(db), chunks_per_task=1, timeout_dur=600, data=[f]
        ) as svc:
            t = await svc.get_task(0, worker="w", request_id="req-1")  # "lost" answer
            again = await svc.get_task(0, worker="w", request_id="req-1")
            assert (again.meta, again.chunks) == (t.meta, t.chunks)
            assert svc.status_view().pending == 1
        return t.meta.id, t.meta.epoch

    async def after_restart(expected: tuple[int, int]) -> None:
        async with started_service(SqliteStore(db), chunks_per_task=1, timeout_dur=600) as svc:
            t = await svc.get_task(0, worker="w", request_id="req-1")
            assert (t.meta.id, t.meta.epoch) == expected
            await svc.task_finished(t.meta.id)
            other = await svc.get_task(0, worker="w", request_id="req-1")  # answered: a new one
            assert other.meta.id != t.meta.id

    held = run(first)
    run(lambda: after_restart(held))


def test_a_retried_get_task_is_answered_only_once_its_dispatch_is_durable(
    tmp_path: Path,
) -> None:
    """A retry that comes while the first request's dispatch is still being written must not
    be answered before it: a master that crashed then would not know the trainer holds the
    task, and would hand it to another as well (its records read twice)."""
    f = records_file(tmp_path / "a.rio", 3)
    db = tmp_path / "state.db"

    async def main() -> None:
        async with started_service(
            SqliteStore(db, busy_timeout=60.0), chunks_per_task=1, timeout_dur=600, data=[f]
        ) as svc:
            with next_write_held(db):
                first = asyncio.create_task(svc.get_task(0, worker="w", request_id="req-1"))
                await until(lambda: svc.status_view().pending == 1, "the dispatch to be applied")
                retry = asyncio.create_task(svc.get_task(0, worker="w", request_id="req-1"))
                assert await still_waiting([first, retry]), (
                    "the retry was answered before its dispatch was durable"
                )
            t, again = await first, await retry
            assert (again.meta, again.chunks) == (t.meta, t.chunks)

    run(main)


def test_a_repeated_finish_is_answered_only_once_the_first_is_durable(tmp_path: Path) -> None:
    """A finish sent again (its first answer lost) while the first one's write is under way
    applies nothing, and must not be answered before that write is durable: the trainer takes
    the answer for the finish being kept, and a master that crashed then would hand the task
    out again (its records read twice)."""
    f = records_file(tmp_path / "a.rio", 3)
    db = tmp_path / "state.db"

    async def main() -> None:
        async with started_service(
            SqliteStore(db, busy_timeout=60.0), chunks_per_task=1, timeout_dur=600, data=[f]
        ) as svc:
            t = await svc.get_task(0, worker="w")
            with next_write_held(db):
                first = asyncio.create_task(svc.task_finished(t.meta.id, epoch=t.meta.epoch))
                await until(lambda: svc.status_view().pending == 0, "the finish to be applied")
                again = asyncio.create_task(svc.task_finished(t.meta.id, epoch=t.meta.epoch))
                assert await still_waiting([first, again]), (
                    "the repeat was answered before the finish was durable"
                )
            assert await first is True and await again is False

    run(main)


def test_a_get_task_cancelled_mid_commit_still_times_out_its_task(tmp_path: Path) -> None:
    """The caller goes away while its dispatch is being made durable: the task must still get
    its timer, or it would stay pending for ever and the pass would never end."""
    f = records_file(tmp_path / "a.rio", 1)

    async def main() -> None:
        store = SqliteStore(tmp_path / "state.db", busy_timeout=60.0)
        async with started_service(
            store, chunks_per_task=1, timeout_dur=0.2, failure_max=5, data=[f]
        ) as svc:
            with next_write_held(tmp_path / "state.db"):
                call = asyncio.create_task(svc.get_task(0))
                await until(lambda: svc.status_view().pending == 1, "the dispatch to be applied")
                assert not call.done()
                call.cancel()
            again = await svc.get_task(0, wait=30.0)  # comes back by timeout
            assert again.meta.epoch == 2

    run(main)


def test_a_trainer_ahead_of_the_master_waits_for_the_rollover(tmp_path: Path) -> None:
    f = records_file(tmp_path / "a.rio", 1)

    async def main() -> None:
        async with started_service(
            InMemStore(), chunks_per_task=1, timeout_dur=60, data=[f]
        ) as svc:
            t = await svc.get_task(0)
            with pytest.raises(PassAfterError, match="^pass number larger than master$"):
                await svc.get_task(1)
            ahead = asyncio.create_task(svc.get_task(1, wait=30.0))
            assert await still_waiting([ahead])
            await svc.task_finished(t.meta.id)
            assert (await ahead).pass_id == 1

    run(main)


def test_concurrent_get_tasks_race_for_the_last_task_cleanly(tmp_path: Path) -> None:
    f = records_file(tmp_path / "a.rio", 2)

    async def main() -> None:
        async with started_service(
            InMemStore(), chunks_per_task=1, timeout_dur=60, data=[f]
        ) as svc:
            results = await asyncio.gather(
                *(svc.get_task(0, worker=f"w{i}") for i in range(10)), return_exceptions=True
            )
            got = [r for r in results if not isinstance(r, BaseException)]
            assert sorted(t.meta.id for t in got) == [0, 1]
            assert all(isinstance(r, NoMoreAvailableError) for r in results if r not in got)

    run(main)


def test_time_without_a_master_does_not_count_against_task_deadlines(tmp_path: Path) -> None:
    """A master that was down longer than the task timeout: on recovery every pending task has
    a full timeout again (journaled, so a later recovery agrees), instead of expiring at once
    under the trainer that is still reading it."""
    clock = Clock()
    db = tmp_path / "state.db"
    data = numbered_records(tmp_path / "d.rio", 4, b"%03d")

    async def first() -> int:
        async with started_service(
            SqliteStore(db), chunks_per_task=1, timeout_dur=60, clock=clock, data=[data]
        ) as svc:
            task = await svc.get_task(0)
        return task.meta.id

    async def after_downtime() -> dict[str, object]:
        svc = Service(SqliteStore(db), chunks_per_task=1, timeout_dur=60, clock=clock)
        await svc.start()
        try:
            return svc.status()
        finally:
            await svc.close()

    held = run(first)
    clock.now += 3600.0  # the master was down an hour: far past the 60 s deadline
    st = run(after_downtime)
    assert st["pending"] == 1 and st["failed"] == 0
    (pending,) = st["pending_tasks"]  # type: ignore[misc]
    assert pending["id"] == held and pending["expires_in"] == pytest.approx(60.0)
    clock.now += 30.0
    st = run(after_downtime)  # a second recovery gives a full timeout again, never less
    (pending,) = st["pending_tasks"]  # type: ignore[misc]
    assert pending["expires_in"] == pytest.approx(60.0)


def test_sources_added_stop_at_the_limit_a_trainers_mixture_is_held_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mixture has MAX_SOURCES sources at most: a trainer naming more is refused, so an add
    past it would leave a job no trainer could name again (set_dataset refused). The add is
    refused, naming the limit, and nothing is added."""
    from chunkmaster.master import job_dataset
    from chunkmaster.master.job_dataset import SourceSpec

    monkeypatch.setattr(job_dataset, "MAX_SOURCES", 3)
    files = {n: records_file(tmp_path / f"{n}.rio", 2) for n in "abcd"}
    spec = {n: SourceSpec(n, (f,)) for n, f in files.items()}

    async def main() -> None:
        async with started_service(InMemStore(), chunks_per_task=1, timeout_dur=600) as svc:
            await svc.set_dataset([], [spec["a"], spec["b"]])
            await svc.set_weights([], add=[spec["c"]])  # three: the limit
            with pytest.raises(DatasetError, match="4 sources.*over 3"):
                await svc.set_weights([], add=[spec["d"]])
            assert [s["name"] for s in svc.status()["mixture"]["sources"]] == ["a", "b", "c"]
            await svc.set_dataset([], [spec["a"], spec["b"], spec["c"]])  # trainers still may

    run(main)
