"""Seeded shuffles at the process level: `chunkmaster master --shuffle-seed` and `chunkmaster
read`. One trainer reads several passes; its task lines give, per pass, the order the master
handed the tasks out in and the digest of each task's records (one record a chunk, so a task's
digest says which chunks it covers). A run with the same seed must see the same, through a
SIGKILL of the master (SQLite store) and through a failover on etcd; another seed, and every
next pass, must not. Every pass still delivers every record exactly once. The job's shuffle
window (`--shuffle-window`) is the job's like the seed: shown, saved, and another refused.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.datasets import numbered_records
from helpers.etcd_server import EtcdServer
from helpers.master_process import MasterProcess
from helpers.status_view import status_view
from helpers.trainers import Trainer, sum_lines

from chunkmaster.client.connection import MasterConnection
from chunkmaster.digest import Digest, file_digest

RECORDS = 120  # one record a chunk
PASSES = 3
Pass = list[tuple[int, str]]  # (task, digest of its records) in the order they completed


def master_args(seed: int | None, *extra: str) -> list[str]:
    args = ["--chunk-per-task", "3", "--task-timeout-dur", "10s", *extra]
    return args if seed is None else [*args, "--shuffle-seed", str(seed)]


def read_passes(trainer: Trainer) -> dict[int, Pass]:
    assert trainer.drain(120) == 0, trainer.log()
    return {
        p: [(int(x["task"]), str(x["digest"])) for x in trainer.tasks.get(p, [])]
        for p in range(PASSES)
    }


def check_exactly_once(trainer: Trainer, expected: Digest) -> None:
    for p in range(PASSES):
        assert sum_lines(trainer.tasks[p]) == expected, f"pass {p}"
        passed = trainer.passes[p]
        assert Digest(int(passed["digest"], 16), int(passed["records"])) == expected


def one_run(tmp_path: Path, data: str, seed: int | None, name: str) -> dict[int, Pass]:
    m = MasterProcess(master_args(seed, "--store", ":memory:")).start()
    try:
        t = Trainer(
            name, ["--addr", str(m.addr), "--dataset", data, "--passes", str(PASSES)], tmp_path
        )
        passes = read_passes(t)
        check_exactly_once(t, file_digest(data))
        with MasterConnection(m.addr) as conn:
            assert status_view(conn.status()).shuffle_seed == seed
        return passes
    finally:
        m.kill()


@pytest.fixture
def data(tmp_path: Path) -> str:
    return numbered_records(tmp_path / "data.rio", RECORDS)


def test_same_seed_same_passes_other_seed_and_every_next_pass_differ(
    tmp_path: Path, data: str
) -> None:
    plain = one_run(tmp_path, data, None, "plain")
    assert [t for t, _ in plain[0]] == list(range(RECORDS // 3))  # today's order, unchanged
    a = one_run(tmp_path, data, 7, "a")
    b = one_run(tmp_path, data, 7, "b")
    other = one_run(tmp_path, data, 8, "other")
    assert a == b
    for p in range(PASSES):
        assert a[p] != other[p]
        assert a[p] != plain[p]
        assert dict(a[p]) != dict(plain[p])  # the tasks cover other chunks, not only another order
    for p in range(1, PASSES):
        assert [t for t, _ in a[p]] != [t for t, _ in a[p - 1]], (
            f"pass {p} has pass {p - 1}'s order"
        )
        assert dict(a[p]) != dict(a[p - 1]), f"pass {p} has pass {p - 1}'s tasks"


def without(seq: Pass, tasks: set[int]) -> Pass:
    return [x for x in seq if x[0] not in tasks]


def timed_out(addr: str) -> set[int]:
    """Tasks whose GetTask answer died with a master: they come back by their timeout, at the
    back of the queue, so they are the only ones allowed out of order."""
    with MasterConnection(addr) as conn:
        st = conn.status()
    return {int(f["id"]) for f in st["failed_tasks"]}


def check_same_as(reference: dict[int, Pass], got: dict[int, Pass], late: set[int]) -> None:
    for p in range(PASSES):
        assert sorted(got[p]) == sorted(reference[p]), f"pass {p}: other tasks"
        assert without(got[p], late) == without(reference[p], late), f"pass {p}: other order"


def test_same_order_through_a_sigkill_of_the_master(tmp_path: Path, data: str) -> None:
    reference = one_run(tmp_path, data, 11, "reference")
    m = MasterProcess(master_args(11, "--store", str(tmp_path / "job.db"))).start()
    try:
        args = ["--addr", str(m.addr), "--dataset", data, "--passes", str(PASSES)]
        t = Trainer("killed", [*args, "--step-time", "0.003"], tmp_path)
        while True:  # a few tasks into pass 1
            line = t.next_line()
            assert line is not None, t.log()
            if line["pass"] == 1 and len(t.tasks.get(1, [])) >= 3:
                break
        m.restart()  # SIGKILL, then the same port and the same store
        got = read_passes(t)
        check_same_as(reference, got, timed_out(str(m.addr)))
        check_exactly_once(t, file_digest(data))
    finally:
        m.kill()


def test_same_order_through_a_failover_on_etcd(
    etcd_server: EtcdServer, tmp_path: Path, data: str
) -> None:
    reference = one_run(tmp_path, data, 12, "reference")
    etcd = ["--endpoints", etcd_server.endpoint, "--host", "127.0.0.1", "--ttl", "2"]
    leader = MasterProcess(master_args(12, *etcd)).start()
    standby = MasterProcess(master_args(12, *etcd)).start(wait=False)
    try:
        assert standby.wait_log("waiting for the master lock"), standby.log()
        args = ["--endpoints", etcd_server.endpoint, "--dataset", data, "--passes", str(PASSES)]
        t = Trainer("failover", [*args, "--step-time", "0.003"], tmp_path)
        while True:  # a few tasks into pass 0
            line = t.next_line()
            assert line is not None, t.log()
            if len(t.tasks.get(0, [])) >= 5:
                break
        leader.kill()
        assert standby.wait_serving(60), standby.log()
        got = read_passes(t)
        check_same_as(reference, got, timed_out(str(standby.addr)))
        check_exactly_once(t, file_digest(data))
    finally:
        leader.kill()
        standby.kill()


def test_a_restart_with_another_seed_is_refused(tmp_path: Path, data: str) -> None:
    store = str(tmp_path / "job.db")
    m = MasterProcess(master_args(3, "--store", store)).start()
    try:
        t = Trainer("setter", ["--addr", str(m.addr), "--dataset", data, "--passes", "0"], tmp_path)
        assert t.drain() == 0, t.log()
    finally:
        m.kill()
    for flags, says in (([], "has none"), (["--shuffle-seed", "4"], "has 4")):
        cmd = [sys.executable, "-m", "chunkmaster", "master", "--store", store, "--port", "0"]
        out = subprocess.run(
            [*cmd, "--chunk-per-task", "3", *flags], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2, out.stderr
        assert "--shuffle-seed:" in out.stderr and "started with shuffle seed 3" in out.stderr
        assert says in out.stderr and "Start with --shuffle-seed 3" in out.stderr


def chunkmaster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chunkmaster", *args], capture_output=True, text=True, timeout=60
    )


def test_the_window_is_the_jobs_shown_saved_and_another_is_refused(
    tmp_path: Path, data: str
) -> None:
    """A job set with --shuffle-window 16 shows it in its status and its data checkpoint; a
    restart on the same store with another window (or none) exits 2 naming both, and so does
    one with a window and no seed; a restore onto a master with another window is refused."""
    store, ckpt = str(tmp_path / "job.db"), str(tmp_path / "job.ckpt")
    m = MasterProcess(master_args(3, "--store", store, "--shuffle-window", "16")).start()
    try:
        t = Trainer("setter", ["--addr", str(m.addr), "--dataset", data, "--passes", "0"], tmp_path)
        assert t.drain() == 0, t.log()
        with MasterConnection(m.addr) as conn:
            st = conn.status()
        assert (st["shuffle_seed"], st["shuffle_window"]) == (3, 16)
        shown = chunkmaster("status", "--addr", str(m.addr))
        assert "shuffle seed 3, shuffle window 16 records" in shown.stdout, shown
        saved = chunkmaster("checkpoint", "save", "--addr", str(m.addr), ckpt)
        assert saved.returncode == 0, saved.stderr
        assert (
            "shuffle  seed 3, window 16 records" in chunkmaster("checkpoint", "show", ckpt).stdout
        )
    finally:
        m.kill()
    base = ["master", "--port", "0", "--chunk-per-task", "3", "--shuffle-seed", "3"]
    for flags, says in (([], "has 0 (off)"), (["--shuffle-window", "32"], "has 32")):
        out = chunkmaster(*base, "--store", store, *flags)
        assert out.returncode == 2, out.stderr
        assert "--shuffle-window:" in out.stderr and "started with shuffle window 16" in out.stderr
        assert says in out.stderr and "Start with --shuffle-window 16" in out.stderr
    out = chunkmaster("master", "--port", "0", "--store", store, "--shuffle-window", "16")
    assert out.returncode == 2 and "--shuffle-window: needs --shuffle-seed" in out.stderr, out
    again = MasterProcess(master_args(3, "--store", store, "--shuffle-window", "16")).start()
    try:  # the same window: the job goes on
        with MasterConnection(again.addr) as conn:
            assert status_view(conn.status()).shuffle_window == 16
    finally:
        again.kill()
    fresh = ["--store", str(tmp_path / "fresh.db"), "--restore", ckpt]
    out = chunkmaster(*base, *fresh, "--shuffle-window", "8")
    assert out.returncode != 0, out.stderr
    assert "shuffle window 16 and this master has 8" in out.stderr, out.stderr


def test_a_windowed_job_reads_every_record_once_a_pass(tmp_path: Path, data: str) -> None:
    """Tasks handed out by a master with a window are read in its windows by a real trainer:
    every record once a pass, the same tasks as with the seed alone."""
    seeded = one_run(tmp_path, data, 7, "seeded")
    m = MasterProcess(master_args(7, "--store", ":memory:", "--shuffle-window", "2")).start()
    try:
        args = ["--addr", str(m.addr), "--dataset", data, "--passes", str(PASSES)]
        t = Trainer("windowed", args, tmp_path)
        assert read_passes(t) == seeded  # a task's digest does not depend on its order
        check_exactly_once(t, file_digest(data))
    finally:
        m.kill()
