"""chunkmaster.torch.Loader as people train with it (issue 18): DataLoader workers, persistent or
not, in order or not, every start method, pinned memory, prefetching; commits that cover the
batches the training loop took and nothing else; a trainer SIGKILLed and restored from its
model + data checkpoint; unreadable chunks; the data wait each trainer reports.

Records are numbered, so every check is on exact counts per record and pass.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from helpers.datasets import write_records
from helpers.formats import write_parquet
from helpers.inproc import InProcessMaster
from helpers.status_view import master_status_view
from helpers.torch_parts import ids_of, record_id, slow_record_id
from helpers.waits import wait_for

from chunkmaster.cli.status_cmd import render
from chunkmaster.client import Reading, Session
from chunkmaster.client.connection import MasterConnection
from chunkmaster.master.metrics import StateCollector
from chunkmaster.recordio import load_index
from chunkmaster.store.sqlite import SqliteStore
from chunkmaster.torch import Loader

TRAINER = str(Path(__file__).resolve().parents[1] / "helpers" / "torch_trainer.py")


def uneven_dataset(tmp_path: Path, n: int = 600) -> str:
    """n numbered records in chunks of very different sizes: one task holds half the dataset,
    so DataLoader workers get very uneven shares (an in-order DataLoader must not hang)."""
    path = tmp_path / "uneven.rio"
    big = [b"%06d" % i for i in range(n // 2)]
    small = [b"%06d" % i for i in range(n // 2, n)]
    write_records(tmp_path / "a-big.rio", big, max_chunk_size=1 << 20)
    write_records(tmp_path / "b-small.rio", small, max_chunk_size=40)
    return str(path.parent / "*.rio")


def read_passes(loader: Loader, passes: int) -> list[tuple[Counter[int], int]]:
    out = []
    for _ in range(passes):
        seen: Counter[int] = Counter()
        batches = 0
        for batch in loader:
            seen.update(ids_of(batch))
            batches += 1
            loader.commit()
        out.append((seen, batches))
    return out


SETTINGS = [
    pytest.param(dict(num_workers=0), id="no-workers"),
    pytest.param(dict(num_workers=2), id="workers"),
    pytest.param(dict(num_workers=2, persistent_workers=True), id="persistent"),
    pytest.param(
        dict(num_workers=2, persistent_workers=True, in_order=False, prefetch_factor=4),
        id="persistent-out-of-order-prefetch4",
    ),
    pytest.param(dict(num_workers=2, pin_memory=True), id="pin-memory"),
    pytest.param(
        dict(num_workers=2, persistent_workers=True, multiprocessing_context="spawn"),
        id="spawn",
    ),
    pytest.param(dict(num_workers=2, multiprocessing_context="forkserver"), id="forkserver"),
    pytest.param(dict(num_workers=2, multiprocessing_context="fork"), id="fork"),
    pytest.param(
        dict(num_workers=2, persistent_workers=True, multiprocessing_context="fork"),
        id="fork-persistent",
    ),
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_every_record_once_per_pass_whatever_the_dataloader_settings(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    """Issue 18, 2 and 4: persistent workers read every later pass too (they yielded nothing
    after the first), and an in-order DataLoader whose workers get uneven shares never hangs.
    A rank gets ceil(records / batch_size) batches, however its workers shared them."""
    n = 600
    pattern = uneven_dataset(tmp_path, n)
    with (
        InProcessMaster(chunks_per_task=2) as m,
        Loader(m.addr, dataset=[pattern], transform=record_id, batch_size=16, **settings) as L,
    ):
        for p, (seen, batches) in enumerate(read_passes(L, 3)):
            assert seen == Counter(range(n)), f"pass {p}"
            assert batches == math.ceil(n / 16), f"pass {p}"
        assert m.status_view().cur_pass == 3


def test_a_commit_covers_the_batches_taken_not_what_the_workers_read_ahead(
    tmp_path: Path,
) -> None:
    """Workers read far ahead (two workers, eight batches of prefetch each); the training loop
    takes three batches and commits. The data checkpoint holds exactly those 12 records: a
    fresh master restored from it delivers every other record of the pass, once."""
    n = 400
    write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(n)], max_chunk_size=30)
    with (
        InProcessMaster(SqliteStore(str(tmp_path / "a.db")), chunks_per_task=1) as m,
        Loader(
            m.addr,
            dataset=[str(tmp_path / "d.rio")],
            transform=record_id,
            batch_size=4,
            num_workers=2,
            prefetch_factor=8,
        ) as loader,
    ):
        it = iter(loader)
        taken = [i for _ in range(3) for i in ids_of(next(it))]
        loader.commit()
        ledger = m.status()["ledger"][0]
        assert ledger["committed"] == 12 < ledger["dispatched"]
        state = loader.state_dict()
    with InProcessMaster(SqliteStore(str(tmp_path / "b.db")), chunks_per_task=1) as m:
        assert m.service is not None
        service = m.service
        m.call(lambda: service.restore(state["checkpoint"]))
        with Loader(m.addr, transform=record_id, batch_size=4, num_workers=2) as again:
            rest = [i for batch in again for i in ids_of(batch)]
    assert sorted(rest) == sorted(set(range(n)) - set(taken))


def test_load_state_dict_takes_the_running_job_back_once_per_restart(tmp_path: Path) -> None:
    """A job restarted from its checkpoint: every rank of the restart calls load_state_dict
    with the same key; the master goes back once, and the records after the checkpoint come
    again, each once (ranks told apart: the one that asks second repeats the restore, whether
    the first began reading or not; tests/loader/test_restore_keys.py has the rest)."""
    n = 120
    write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(n)], max_chunk_size=30)
    data = str(tmp_path / "d.rio")
    with InProcessMaster(chunks_per_task=1) as m:
        with Loader(m.addr, dataset=[data], transform=record_id, batch_size=10) as first:
            it = iter(first)
            before = [i for _ in range(3) for i in ids_of(next(it))]
            state = first.state_dict()
            after = [i for _ in range(2) for i in ids_of(next(it))]  # then the job "crashes"
        assert (len(before), len(after)) == (30, 20)
        got: list[int] = []

        def rank(r: int) -> None:  # each rank of the restart: load the state, then read
            with Loader(
                m.addr,
                transform=record_id,
                batch_size=10,
                restore_key="r1",
                session=Session(world_size=2, rank=r),
            ) as loader:
                loader.load_state_dict(state)
                got.extend(i for batch in loader for i in ids_of(batch))

        ranks = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in ranks:
            t.start()
        for t in ranks:
            t.join(120)
        assert m.status_view().cur_pass == 1
        assert sorted(got) == sorted(set(range(n)) - set(before))


def trainer(tmp_path: Path, name: str, *args: str) -> subprocess.Popen[str]:
    log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, TRAINER, "--out", str(tmp_path / f"{name}.json"), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(tmp_path: Path, name: str, proc: subprocess.Popen[str], timeout: float = 240) -> Any:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError((tmp_path / f"{name}.log").read_text()[-4000:]) from None
    assert code == 0, (tmp_path / f"{name}.log").read_text()[-4000:]
    return json.loads((tmp_path / f"{name}.json").read_text())


def test_a_trainer_killed_after_a_commit_resumes_from_its_checkpoint_exactly_once(
    tmp_path: Path, master_process: Any
) -> None:
    """A trainer process with persistent workers reading far ahead commits after every step
    and saves its model (per-record counts) with the loader's state every 3 steps; it
    SIGKILLs itself at step 8. Started again, it loads both: the master goes back to the
    checkpoint and every record is trained on exactly once in each of two passes (Parquet)."""
    n = 300
    write_parquet(tmp_path / "d.parquet", [{"id": i} for i in range(n)], row_group_size=20)
    m = master_process("--chunk-per-task", "1")
    args = ["--addr", m.addr, "--dataset", str(tmp_path / "d.parquet"), "--records", str(n)]
    args += ["--passes", "2", "--checkpoint", str(tmp_path / "ckpt.pt"), "--die-at-step", "8"]
    args += ["--prefetch-factor", "4"]
    first = trainer(tmp_path, "t", *args)
    assert first.wait(240) == -9, (tmp_path / "t.log").read_text()[-4000:]
    report = finish(tmp_path, "t", trainer(tmp_path, "t", *args))
    for p, counts in enumerate(report["counts"]):
        assert counts == [1] * n, f"pass {p}: {Counter(counts)}"


@pytest.mark.parametrize(
    ("kill_master", "flags"),
    [
        (False, ()),
        (True, ()),
        (True, ("--shuffle-seed", "3", "--shuffle-window", "50", "--chunk-per-task", "4")),
    ],
    ids=["", "master-killed", "master-killed-shuffled"],
)
def test_two_trainer_processes_read_every_record_once_per_pass(
    tmp_path: Path, master_process: Any, kill_master: bool, flags: tuple[str, ...]
) -> None:
    """Two trainer processes, each a Loader with two persistent workers, three passes; with
    the master SIGKILLed and started again in the middle of the first pass; and so with the
    job's record shuffle (windows of 50 records across the chunks of 4-chunk tasks)."""
    n = 500
    write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(n)], max_chunk_size=60)
    m = master_process(*(flags or ("--chunk-per-task", "1")))
    args = ["--addr", m.addr, "--dataset", str(tmp_path / "d.rio"), "--records", str(n)]
    args += ["--passes", "3", "--transform", "slow_record_id" if kill_master else "record_id"]
    procs = {name: trainer(tmp_path, name, *args, "--name", name) for name in ("a", "b")}
    if kill_master:
        assert m.wait_log(r"opened session", timeout=60)
        m.kill()
        m.restart()
    reports = [finish(tmp_path, name, proc) for name, proc in procs.items()]
    for p in range(3):
        total = [a + b for a, b in zip(*(r["counts"][p] for r in reports), strict=True)]
        assert total == [1] * n, f"pass {p}: {Counter(total)}"


def test_an_unreadable_chunk_is_reported_and_the_pass_goes_on(tmp_path: Path) -> None:
    """Issue 18, 7: a chunk that cannot be read no longer kills a DataLoader worker: the task
    is reported failed (the master quarantines it after --task-timeout-max failures) and the
    pass goes on with every other record."""
    n = 200
    path = tmp_path / "d.rio"
    write_records(path, [b"%06d" % i for i in range(n)], max_chunk_size=60)
    raw = bytearray(path.read_bytes())
    raw[load_index(str(path)).chunk_offsets[3] + 30] ^= 0xFF  # a payload byte: bad checksum
    path.write_bytes(bytes(raw))
    with (
        InProcessMaster(chunks_per_task=1, failure_max=1) as m,
        Loader(m.addr, dataset=[str(path)], transform=record_id, batch_size=8, num_workers=2) as L,
    ):
        seen = Counter(i for batch in L for i in ids_of(batch))
        st = m.status()
    (ledger,) = [led for led in st["ledger"] if led["pass"] == 0]
    lost = set(range(n)) - set(seen)
    assert len(lost) == ledger["quarantined"] == 10  # the damaged chunk's records
    (failures,) = st["failed_tasks"]
    assert failures["total_failures"] == 2
    assert seen == Counter(set(range(n)) - lost)  # everything else once
    assert L.read_errors == 2  # failed twice (the limit is 1), reported each time
    assert "offset 360" in L.read_error_reasons[0] and "ChecksumError" in L.read_error_reasons[0]


def test_each_trainer_reports_how_long_its_training_loop_waits_for_data(tmp_path: Path) -> None:
    """A loop whose reader is slower than its training step waits for nearly all its time:
    the master's status shows it for that trainer (p50, p99 and the share of wall time)."""
    write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(400)], max_chunk_size=60)
    with (
        InProcessMaster(chunks_per_task=1) as m,
        Loader(
            m.addr,
            dataset=[str(tmp_path / "d.rio")],
            transform=slow_record_id,
            batch_size=8,
            name="starving",
            session=Session(report_interval=0.2),
        ) as L,
    ):
        it = iter(L)
        for _ in range(20):
            next(it)
        wait = None
        for _ in range(200):  # keep-alives carry the figures, every report_interval
            (t,) = m.status()["trainers"]
            wait = t["data_wait"]
            if wait is not None and wait["batches"] >= 10:
                break
            next(it)
        assert wait is not None and t["name"] == "starving"
        assert wait["share"] > 0.5 and wait["p50_ms"] > 0 and wait["p99_ms"] >= wait["p50_ms"]
        assert m.service is not None
        metrics = {
            (metric.name, tuple(sorted(s.labels.items()))): s.value
            for metric in StateCollector(m.service).collect()
            for s in metric.samples
        }
        rank = "" if t["rank"] is None else str(t["rank"])  # by name and rank, not session
        labels = (("rank", rank), ("trainer", "starving"))
        assert metrics[("chunkmaster_trainer_data_wait_share", labels)] == wait["share"]
        p99 = ("chunkmaster_trainer_data_wait_seconds", (("quantile", "0.99"), *labels))
        assert metrics[p99] == wait["p99_ms"] / 1000
        assert f"({100 * wait['share']:.0f}%)" in render(m.status())


def test_a_loader_refuses_what_it_cannot_keep(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="drop_last"):
        Loader("127.0.0.1:1", drop_last=True)
    with pytest.raises(ValueError, match="needs a session"):
        Loader("127.0.0.1:1", session=False)
    with pytest.raises(ValueError, match="batch_size"):
        Loader("127.0.0.1:1", batch_size=0)
    for reading in (Reading(shuffle_buffer=500), Reading(shuffle_seed=3)):
        with pytest.raises(ValueError, match="--shuffle-window"):  # never silently ignored
            Loader("127.0.0.1:1", reading=reading)
    loader = Loader("127.0.0.1:1")
    with pytest.raises(ValueError, match="not a chunkmaster"):
        loader.load_state_dict({"model": 1})


def test_the_old_dataset_names_point_to_the_loader() -> None:
    import chunkmaster.torch

    with pytest.raises(ImportError, match="replaced by chunkmaster.torch.Loader"):
        chunkmaster.torch.MasterDataset  # noqa: B018


def status(addr: str) -> dict[str, Any]:
    with MasterConnection(addr) as c:
        return c.status()


def test_a_thawed_trainer_trains_on_none_of_the_tasks_it_lost_and_its_commit_is_refused(
    tmp_path: Path, master_process: Any
) -> None:
    """Issue 19, 4 with a Loader: a trainer process group (main process and workers, which
    have read ahead) is frozen past its lease; another trainer reads the whole pass. Thawed,
    the first trainer hands its training loop no batch of the tasks it lost (its workers had
    read them), and, since it committed every batch it trained on, nothing was delivered
    twice: the tasks went on from its commits."""
    n = 400
    write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(n)], max_chunk_size=60)
    m = master_process("--chunk-per-task", "2", "--trainer-ttl", "1")
    args = ["--addr", m.addr, "--dataset", str(tmp_path / "d.rio"), "--records", str(n)]
    args += ["--passes", "1", "--transform", "slow_record_id", "--prefetch-factor", "4"]
    a_log, b_log = tmp_path / "a.batches", tmp_path / "b.batches"
    freeze = ["--log", str(a_log), "--freeze-after-step", "3"]
    a = subprocess.Popen(
        [sys.executable, TRAINER, "--out", str(tmp_path / "a.json"), *args, *freeze],
        stdout=open(tmp_path / "a.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: stopped(a.pid), f"trainer {a.pid} to stop", 120)
        frozen = len(a_log.read_text().splitlines())
        assert frozen == 3
        wait_for(lambda: status(m.addr)["sessions"] == 0, "its session's lease to run out", 120)
        b = trainer(tmp_path, "b", *args, "--log", str(b_log), "--transform", "record_id")
        finish(tmp_path, "b", b)
        os.killpg(a.pid, signal.SIGCONT)
        assert a.wait(120) == 0
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGCONT)
            a.kill()
    log = (tmp_path / "a.log").read_text()
    assert "went to other trainers while this one was away: dropped unread" in log, log[-3000:]
    a_batches = [line.split()[1:] for line in a_log.read_text().splitlines()]
    before = {int(i) for batch in a_batches[:frozen] for i in batch}
    after = [int(i) for batch in a_batches[frozen:] for i in batch]
    by_b = [int(i) for line in b_log.read_text().splitlines() for i in line.split()[1:]]
    assert after == [], f"trained on {len(after)} records of lost tasks after the thaw"
    assert sorted(before | set(by_b)) == list(range(n))
    assert not set(by_b) & before  # committed: the new holder started past them


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_the_loader_takes_the_clients_options_grouped_and_warns_at_the_flat_ones(
    tmp_path: Path,
) -> None:
    """The rank's Client options, as the Client takes them; a flat one of before warns naming
    its replacement, at the line that made the Loader (not inside chunkmaster)."""
    path = str(write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(40)]))
    with pytest.warns(
        DeprecationWarning, match=r"Client\(report_every=\.\.\.\) is deprecated"
    ) as w:
        Loader("127.0.0.1:1", dataset=[path], report_every=5).close()
    assert w[0].filename == __file__
    with pytest.raises(ValueError, match="a Loader needs a session"):
        Loader("127.0.0.1:1", session=False)
    with (
        InProcessMaster(chunks_per_task=4) as m,
        Loader(
            m.addr,
            dataset=[path],
            transform=record_id,
            batch_size=None,
            name="grouped",
            session=Session(report_every=3),
        ) as L,
    ):
        assert sorted(int(r) for r in L) == list(range(40))
        assert [t["name"] for t in m.status()["trainers"]] == ["grouped"]


def test_a_dataset_at_every_default_keeps_two_trainers_of_four_workers_busy(
    tmp_path: Path, master_process: Any
) -> None:
    """Issue 29: 200 MB in 10 files written with the writer's defaults (one 20 MB chunk each)
    and a master with no flag: enough tasks that every DataLoader worker of two 4-worker
    trainers reads (at 10 chunks a task, the old default, it was one task: one worker read)."""
    n, per_file = 3200, 320
    for f in range(10):
        ids = range(f * per_file, (f + 1) * per_file)
        write_records(
            tmp_path / f"part-{f}.rio",
            [i.to_bytes(8, "big") + bytes(65528) for i in ids],
            max_chunk_size=32 << 20,
        )
    m = master_process()
    args = ["--addr", m.addr, "--dataset", str(tmp_path / "part-*.rio"), "--records", str(n)]
    args += ["--passes", "1", "--workers", "4", "--transform", "worker_and_head_id"]
    procs = {name: trainer(tmp_path, name, *args, "--name", name) for name in ("a", "b")}
    reports = {name: finish(tmp_path, name, proc) for name, proc in procs.items()}
    assert master_status_view(m.addr).num_tasks == 10
    for name, report in reports.items():
        assert report["workers"] == [0, 1, 2, 3], f"trainer {name}: workers that read"
    total = [a + b for a, b in zip(*(r["counts"][0] for r in reports.values()), strict=True)]
    assert total == [1] * n
