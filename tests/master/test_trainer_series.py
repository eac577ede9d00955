"""A trainer's metric series are labelled by what it declares (its name and rank), not by its
session: a rank restarted again and again continues one series, under a name of its own or
the client's default (HOST:PID:N, new with each process, as a torchrun rank's: labelled by its
host), and its series go when its session ends (closed or expired). Real master and trainer
processes, a real scrape."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess
from helpers.waits import wait_for
from prometheus_client.parser import text_string_to_metric_families

from chunkmaster.master.metrics.collector import trainer_label
from chunkmaster.master.readiness import read_ready_file
from chunkmaster.master.status import Trainer

TRAINER = str(Path(__file__).resolve().parents[1] / "helpers" / "metrics_trainer.py")
TTL = 30  # seconds a killed trainer's session outlives it
RESTARTS = 4


@pytest.fixture
def master() -> Iterator[MasterProcess]:
    # --equal-steps off: the ranks are labels here, not a world whose pass waits for them all
    args = ["--store", ":memory:", "--metrics-port", "0", "--trainer-ttl", f"{TTL}s"]
    m = MasterProcess([*args, "--equal-steps", "off", "--chunk-per-task", "1"]).start()
    try:
        yield m
    finally:
        m.kill()


def trainer_series(addr: str) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    """The label sets of each chunkmaster_trainer_* metric in a scrape of /metrics."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    series: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("chunkmaster_trainer_"):
            for s in family.samples:
                series.setdefault(s.name, set()).add(tuple(sorted(s.labels.items())))
    return series


def start(
    master: MasterProcess, out: Path, name: str | None, rank: int, *extra: str
) -> subprocess.Popen[bytes]:
    """A trainer of rank `rank` of 2, named `name` (None: the client's default name)."""
    cmd = [sys.executable, TRAINER, "--addr", str(master.addr), "--out", str(out)]
    cmd += ["--name", name] if name is not None else []
    cmd += ["--world-size", "2", "--rank", str(rank), "--passes", "1000"]
    return subprocess.Popen([*cmd, "--step-time", "0.05", *extra], stderr=subprocess.DEVNULL)


def records(out: Path) -> int:
    return out.read_text().count("r ") if out.exists() else 0


def test_a_restarted_rank_continues_its_series_and_they_go_with_its_session(
    master: MasterProcess, tmp_path: Path
) -> None:
    info = read_ready_file(master.ready_file)
    assert info is not None
    addr = str(info["metrics_addr"])
    data = numbered_records(tmp_path / "data.rio", 200)
    stop = tmp_path / "stop"
    w0 = start(master, tmp_path / "w0.out", "w0", 0, "--dataset", data, "--stop-file", str(stop))
    procs = [w0]
    try:
        # rank 1, with the default name: started, reads, SIGKILLed; RESTARTS times over
        for i in range(RESTARTS + 1):
            out = tmp_path / f"w1-{i}.out"
            w1 = start(master, out, None, 1, "--stop-file", str(stop))
            procs.append(w1)
            wait_for(lambda out=out: records(out) >= 2, f"w1's run {i} to read", 60)
            if i < RESTARTS:
                w1.send_signal(signal.SIGKILL)
                w1.wait(10)
        with urllib.request.urlopen(f"http://{addr}/status.json", timeout=10) as r:
            sessions = json.load(r)["trainers"]
        # the killed runs' sessions are still there (their TTL has not run out; on a slow
        # machine the first may have) ...
        host = socket.gethostname()
        rank1 = [t["name"] for t in sessions if t["rank"] == 1]
        # (at least the last killed run's and the live one's, however slowly they started)
        assert 2 <= len(set(rank1)) == len(rank1) <= RESTARTS + 1, sessions  # HOST:PID:0
        assert all(name.startswith(f"{host}:") for name in rank1)
        # ... and each trainer has one series, whatever its sessions
        want = {(("rank", "0"), ("trainer", "w0")), (("rank", "1"), ("trainer", host))}
        series = trainer_series(addr)
        assert series["chunkmaster_trainer_records_consumed"] == want, series
        assert "session" not in str(series)

        # the last run killed too: once its session expires, w1's series is gone, w0's stays
        w1.send_signal(signal.SIGKILL)
        w1.wait(10)
        wait_for(
            lambda: (
                trainer_series(addr).get("chunkmaster_trainer_records_consumed")
                == {(("rank", "0"), ("trainer", "w0"))}
            ),
            "w1's sessions to expire and its series to go",
            TTL * 3,
        )
        # w0 closes its session: no trainer series left
        stop.touch()
        assert w0.wait(60) == 0
        assert trainer_series(addr).get("chunkmaster_trainer_records_consumed", set()) == set()
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)


def trainer(name: str, rank: int | None, host: str = "gpu-1", pid: int = 4242) -> Trainer:
    return Trainer("sid", name, host, pid, 0, 0, None, None, None, rank, 2, None)


def test_the_trainer_label_is_the_name_or_a_ranked_default_names_host() -> None:
    assert trainer_label(trainer("gpu-1:4242:0", 3)) == "gpu-1"  # a torchrun rank's default
    assert trainer_label(trainer("gpu-1:4242:0", None)) == "gpu-1:4242:0"  # many a host
    assert trainer_label(trainer("rank3", 3)) == "rank3"
    assert trainer_label(trainer("gpu-1:999:0", 3)) == "gpu-1:999:0"  # not its own pid
    assert trainer_label(trainer("a.b:4242:0", 3, host="a.b")) == "a.b"
    assert trainer_label(trainer("axb:4242:0", 3, host="a.b")) == "axb:4242:0"
