"""Trainers through a master failover on etcd: they follow the new leader by themselves.

The original's trainers never followed a new leader (D4/D5): the address key had no lease and a
repeated address was ignored. Here the leader is SIGKILLed mid-pass, a standby takes over after
the lease TTL, and the trainers (real `chunkmaster read` processes, or Client threads) find it
through etcd and finish the pass. No trainer dies and the task timeout is far longer than a
failover, so every pass must deliver every record exactly once: the trainers' per-pass digests
must add up to the dataset's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from helpers.datasets import numbered_records
from helpers.etcd_server import EtcdServer
from helpers.master_process import MasterProcess, wait_leader
from helpers.status_view import status_view
from helpers.waits import wait_for

from chunkmaster.client.client import Client
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.model import Task
from chunkmaster.digest import Digest, file_digest

TTL = 2
# Several failovers long (TTL + campaign + reconnect, about 2-4 s here): a task a trainer holds
# is reported finished before its deadline, so any duplicate in these tests is a bug. A task
# whose GetTask reply was lost in the crash (dispatch durable, reply never received) does come
# back, but only through this timeout, and nobody has read it: not a duplicate.
TASK_TIMEOUT = "10s"


def write_dataset(path: Path, n: int) -> Path:
    return Path(numbered_records(path, n))


def start_master(etcd: EtcdServer, log: Path, *, wait: bool, port: int = 0) -> MasterProcess:
    args = ["--endpoints", etcd.endpoint, "--host", "127.0.0.1", "--ttl", str(TTL)]
    args += ["--chunk-per-task", "4", "--task-timeout-dur", TASK_TIMEOUT]
    return MasterProcess(args, port=port, log_path=log).start(wait=wait)


class Reader:
    """A `chunkmaster read --json --task-lines` process whose stdout lines are collected."""

    def __init__(self, name: str, args: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.lines: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self.log_path = log_dir / f"{name}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "chunkmaster", "read", "--json", "--task-lines"]
        cmd += [*args, "--log-level", "info"]
        with open(self.log_path, "w") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env
            )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._cond:
                self.lines.append(json.loads(raw))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def passes(self) -> dict[int, Digest]:
        """Per-pass totals printed so far."""
        with self._cond:
            return {
                int(x["pass"]): Digest(int(x["digest"], 16), int(x["records"]))
                for x in self.lines
                if "task" not in x
            }

    def tasks_in(self, pass_id: int) -> int:
        with self._cond:
            return sum(1 for x in self.lines if "task" in x and x["pass"] == pass_id)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def test_trainers_follow_standbys_through_two_leader_sigkills(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    data = write_dataset(tmp_path / "data.rio", 360)
    expected = file_digest(str(data))
    masters = [start_master(etcd_server, tmp_path / "m0.log", wait=True)]
    masters += [start_master(etcd_server, tmp_path / f"m{i}.log", wait=False) for i in (1, 2)]
    readers: list[Reader] = []
    try:
        for m in masters[1:]:
            assert m.wait_log("waiting for the master lock"), m.log()
        common = ["--endpoints", etcd_server.endpoint, "--passes", "3", "--step-time", "0.02"]
        readers = [Reader(f"r{i}", [*common, "--dataset", str(data)], tmp_path) for i in range(3)]
        leader = masters[0]
        for pass_id in (0, 1):  # kill the leader mid-pass 0, then its successor mid-pass 1
            wait_for(
                lambda p=pass_id: any(r.tasks_in(p) for r in readers),
                f"a task done in pass {pass_id}",
            )
            assert all(pass_id not in r.passes() for r in readers)  # mid-pass
            leader.kill()
            leader = wait_leader([m for m in masters if m.running])
            with MasterConnection(leader.addr) as conn:
                st = conn.status()
            assert st["cur_pass"] == pass_id and st["done"] < st["num_tasks"]  # state kept
        for r in readers:
            assert r.proc.wait(120) == 0, r.log()
        for p in range(3):
            total = Digest()
            for r in readers:
                total.merge(r.passes()[p])
            assert total == expected, f"pass {p}: {total} != {expected}"
        with MasterConnection(leader.addr) as conn:
            st = conn.status()
        assert st["cur_pass"] == 3
        # only timeouts of tasks whose GetTask reply died with a leader: at most one in flight
        # per trainer per crash
        reasons = [r["reason"] for f in st["failed_tasks"] for r in f["reasons"]]
        assert set(reasons) <= {"timeout"} and len(reasons) <= 2 * len(readers), st
        # each trainer saw the master move (logged by the client), and none had to be restarted
        for r in readers:
            assert "reconnecting" in r.log() or "answers again" in r.log(), r.log()
    finally:
        for r in readers:
            if r.proc.poll() is None:
                r.proc.kill()
        for m in masters:
            m.kill()


def test_master_restarted_at_the_same_address_is_reconnected(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """D4: the Go client ignored a repeated address, so a master restarted in place (same pod,
    same port) was never reconnected. Client threads here must carry on by themselves."""
    data = write_dataset(tmp_path / "data.rio", 240)
    expected = file_digest(str(data))
    m = start_master(etcd_server, tmp_path / "m.log", wait=True)
    first_addr = m.addr
    passes = 2
    totals: list[dict[int, Digest]] = [{} for _ in range(2)]
    done_tasks: list[list[Task]] = [[] for _ in range(2)]
    errors: list[BaseException] = []
    progress = threading.Event()

    def train(i: int) -> None:
        def on_done(task: Task) -> None:
            done_tasks[i].append(task)
            progress.set()

        try:
            with Client(etcd_endpoints=[etcd_server.endpoint], on_task_done=on_done) as client:
                client.set_dataset([str(data)])
                for p in range(passes):
                    d = Digest()
                    for rec in client.records(p):
                        d.add(rec)
                        time.sleep(0.02)
                    totals[i][p] = d
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=train, args=(i,), daemon=True) for i in range(2)]
    try:
        for t in threads:
            t.start()
        assert progress.wait(30), "no task done before the kill"
        m.kill()
        m.start(timeout=30)  # same port; it leads once the old lease has expired
        assert m.addr == first_addr
        with MasterConnection(m.addr) as conn:
            assert status_view(conn.status()).cur_pass == 0  # killed mid-pass 0
        for t in threads:
            t.join(120)
            assert not t.is_alive(), "trainer stuck after the master came back"
        assert not errors, errors
        for p in range(passes):
            total = Digest()
            for i in range(2):
                total.merge(totals[i][p])
            assert total == expected, f"pass {p}"
        with MasterConnection(m.addr) as conn:
            assert status_view(conn.status()).cur_pass == passes
    finally:
        m.kill()
