"""kill -9 of a real master process on the embedded store, and the CLI around it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess
from helpers.status_view import status_view

from chunkmaster import PassBeforeError
from chunkmaster.client.connection import MasterConnection


def dataset(path: Path, n: int) -> str:
    return numbered_records(path, n, b"%03d")


def test_kill_9_mid_pass_loses_nothing_acknowledged(tmp_path: Path) -> None:
    data = dataset(tmp_path / "d.rio", 30)
    db = tmp_path / "state.db"
    master = MasterProcess(
        ["--store", str(db), "--task-timeout-dur", "1s", "--chunk-per-task", "1"]
    ).start()
    try:
        with MasterConnection(master.addr) as c:
            c.set_dataset([data])
            taken = [c.get_task(0) for _ in range(10)]
            finished = {t.meta.id for t in taken[:7]}
            for t in taken[:7]:
                assert c.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=0)
        master.kill()
        master.restart()
        with MasterConnection(master.addr) as c:
            st = status_view(c.status())
            assert (st.cur_pass, st.done, st.pending, st.todo) == (0, 7, 3, 20)
            handed = []
            while True:
                try:
                    t = c.get_task(0, wait=30.0)
                except PassBeforeError:
                    break
                handed.append(t)
                c.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=0)
            ids = [t.meta.id for t in handed]
            assert not finished & set(ids)  # acknowledged finishes stay done
            assert sorted(ids) == sorted(set(range(30)) - finished)  # the 3 pending come back
            again = {t.meta.id: t.meta.epoch for t in handed}
            for t in taken[7:]:
                assert again[t.meta.id] > t.meta.epoch  # epochs keep growing across the crash
            assert status_view(c.status()).cur_pass == 1
    finally:
        master.kill()


def test_sigterm_stops_gracefully_and_status_cli(tmp_path: Path) -> None:
    data = dataset(tmp_path / "d.rio", 3)
    master = MasterProcess(["--store", str(tmp_path / "s.db"), "--task-timout-dur", "5m"]).start()
    try:
        assert "embedded SQLite store at" in master.log()
        with MasterConnection(master.addr) as c:
            c.set_dataset([data])
        out = subprocess.run(
            [sys.executable, "-m", "chunkmaster", "status", "--addr", master.addr, "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        st = json.loads(out)
        assert {k: st[k] for k in ("cur_pass", "todo", "pending", "done", "failed")} == {
            "cur_pass": 0,
            "todo": 3,  # no --chunk-per-task: the master's choice for 3 chunks, a task each
            "pending": 0,
            "done": 0,
            "failed": 0,
        }
        assert st["timeout_dur"] == 300.0
        human = subprocess.run(
            [sys.executable, "-m", "chunkmaster", "status", "--addr", master.addr],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "pass     0: todo 3, pending 0, done 0, failed 0" in human
        assert master.terminate() == 0
        assert "stopped" in master.log()
    finally:
        master.kill()


def test_environment_variables_and_bad_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASK_TIMOUT_DUR", "90s")  # the original's (misspelt) variable
    monkeypatch.setenv("CHUNKMASTER_TASK_TIMEOUT_MAX", "7")
    env_master = MasterProcess(["--store", ":memory:"])
    try:
        env_master.start()
        with MasterConnection(env_master.addr) as c:
            st = c.status()
        assert st["timeout_dur"] == 90.0 and st["failure_max"] == 7
    finally:
        env_master.kill()
    bad = subprocess.run(
        [sys.executable, "-m", "chunkmaster", "master", "--task-timeout-dur", "soon"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "--task-timeout-dur" in bad.stderr and "soon" in bad.stderr
    for args, message in [
        (["--etcd-cert", "c.pem"], "--etcd-cert and --etcd-key: "),
        (["--etcd-user", "bob"], "--etcd-user and CHUNKMASTER_ETCD_PASSWORD: "),
        (["--endpoints", "http://127.0.0.1:1", "--store", "x.db"], "--store and --endpoints: "),
    ]:
        refused = subprocess.run(
            [sys.executable, "-m", "chunkmaster", "master", *args], capture_output=True, text=True
        )
        assert refused.returncode == 2 and message in refused.stderr
    unreachable = subprocess.run(
        [sys.executable, "-m", "chunkmaster", "status", "--addr", "127.0.0.1:1", "--timeout", "1"],
        capture_output=True,
        text=True,
    )
    assert unreachable.returncode == 1 and "127.0.0.1:1" in unreachable.stderr


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("20m", 1200.0), ("1.5s", 1.5), ("1h2m3s", 3723.0), ("300ms", 0.3), ("45", 45.0), ("0", 0.0)],
)
def test_go_durations(text: str, seconds: float) -> None:
    from chunkmaster.cli.common import parse_duration

    assert parse_duration(text) == pytest.approx(seconds)


def test_bad_go_duration() -> None:
    from chunkmaster.cli.common import parse_duration

    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration("20 minutes")


def test_t6_external_ip_is_a_non_loopback_ipv4_or_a_clear_error() -> None:
    import ipaddress

    from chunkmaster.master.runner import external_ip

    try:
        ip = ipaddress.IPv4Address(external_ip())
    except OSError as exc:  # a sandbox without a network
        assert "are you connected to the network?" in str(exc)
    else:
        assert not ip.is_loopback
