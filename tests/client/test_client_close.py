"""Client.close() ends everything the client started, against a real master process: every
thread (the session's, its stream readers, the fetchers, the reporter, and gRPC's own threads
for its calls) is gone when close() returns, and no gRPC call object is left for the garbage
collector. A call object collected while the interpreter finalizes waits in its `__del__` for
the call's lock, which a gRPC thread frozen by the finalization may hold: the trainer process
then never exits (measured: twice in 180 short `chunkmaster read` runs). Closed mid-pass, in a long
poll, between keep-alives, with the master SIGKILLed or frozen (SIGSTOP): close() still returns
within its bound (docs/client.md, "What each call waits for"). And `chunkmaster read` closes
its client on SIGTERM: the session's Goodbye hands its tasks back at once."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.closing import CLOSE_DEADLINE, assert_all_ended, close_within, track_calls
from helpers.datasets import numbered_records, write_records
from helpers.master_process import MasterProcess
from helpers.trainers import wait_until_holding

from chunkmaster.client import Client, Connection, Reading, Session
from chunkmaster.client.connection import MasterConnection


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[Any]]:
    """Weak references to the gRPC calls the test's client starts."""
    return track_calls(monkeypatch)


def _dataset(tmp_path: Path, n: int = 400) -> str:
    return numbered_records(tmp_path / "d.rio", n)


def _master(tmp_path: Path, *args: str) -> MasterProcess:
    return MasterProcess(
        ["--store", str(tmp_path / "state.db"), "--chunk-per-task", "4", *args],
        log_path=tmp_path / "master.log",
    ).start()


def _read_cmd(m: MasterProcess, *args: str) -> list[str]:
    """A `chunkmaster read` process's command line, reading from master `m`."""
    return [sys.executable, "-m", "chunkmaster", "read", "--addr", str(m.addr), *args]


def _read(client: Client, p: int, n: int) -> None:
    client.start_get_records(p)
    for _ in range(n):
        client.next_record(timeout=60)


Scenario = Callable[[Client, MasterProcess], None]


def _mid_pass(client: Client, m: MasterProcess) -> None:
    _read(client, 0, 10)  # tasks held, the next ones prefetched


def _master_killed(client: Client, m: MasterProcess) -> None:
    _read(client, 0, 10)
    m.kill()  # the session's thread and the fetcher retry a master that is gone


@pytest.mark.parametrize("session", [True, False], ids=["session", "unary"])
@pytest.mark.parametrize("scenario", [_mid_pass, _master_killed], ids=["mid-pass", "killed"])
def test_close_ends_every_thread_and_call(
    tmp_path: Path, calls: list[weakref.ref[Any]], session: bool, scenario: Scenario
) -> None:
    path = _dataset(tmp_path)
    m = _master(tmp_path)
    try:
        before = set(threading.enumerate())
        client = Client(m.addr, session=session, connection=Connection(rpc_timeout=5))
        client.set_dataset([path])
        scenario(client, m)
        close_within(client)
        assert_all_ended(before, calls)
    finally:
        m.kill()


def test_close_with_the_master_frozen_returns_and_ends_everything(
    tmp_path: Path, calls: list[weakref.ref[Any]]
) -> None:
    """A master that accepts and never answers (SIGSTOP): the Goodbye gets no ack within
    flush_timeout, and the rest of close() does not wait on the master."""
    path = _dataset(tmp_path)
    m = _master(tmp_path)
    assert m.proc is not None
    try:
        before = set(threading.enumerate())
        client = Client(m.addr, connection=Connection(rpc_timeout=3))
        client.set_dataset([path])
        _read(client, 0, 10)
        os.kill(m.proc.pid, signal.SIGSTOP)
        close_within(client, flush_timeout=1.0)
        assert_all_ended(before, calls)
    finally:
        os.kill(m.proc.pid, signal.SIGCONT)
        m.kill()


def test_close_between_keep_alives_ends_everything(
    tmp_path: Path, calls: list[weakref.ref[Any]]
) -> None:
    """Keep-alives with progress every few milliseconds: close() comes while the session's
    thread is sending them."""
    path = _dataset(tmp_path)
    m = _master(tmp_path)
    try:
        before = set(threading.enumerate())
        client = Client(m.addr, session=Session(report_every=1, report_interval=0.01))
        client.set_dataset([path])
        _read(client, 0, 50)
        close_within(client)
        assert_all_ended(before, calls)
    finally:
        m.kill()


class _Said(logging.Handler):
    """Sets `event` once a log record's message contains `text`."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


@pytest.mark.parametrize("session", [True, False], ids=["session", "unary"])
@pytest.mark.parametrize("shuffle", [0, 100], ids=["plain", "shuffle-buffer"])
def test_close_in_a_long_poll_ends_everything(
    tmp_path: Path, calls: list[weakref.ref[Any]], session: bool, shuffle: int
) -> None:
    """Another trainer holds every task: the fetcher waits in a long poll (and with a shuffle
    buffer, records() waits filling it) when close() comes from another thread."""
    path = str(write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(8)]))
    m = _master(tmp_path, "--chunk-per-task", "8")  # one task
    other = subprocess.Popen(
        _read_cmd(m, "--dataset", path, "--passes=1", "--step-time=600", "--prefetch-tasks=0"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    said = _Said("no task free")
    logging.getLogger("chunkmaster.client").addHandler(said)
    prior = logging.getLogger("chunkmaster.client").level
    logging.getLogger("chunkmaster.client").setLevel(logging.INFO)
    try:
        assert m.addr is not None
        wait_until_holding(m.addr, other.pid, 1)
        before = set(threading.enumerate())
        client = Client(
            m.addr,
            session=session,
            reading=Reading(shuffle_buffer=shuffle),
            connection=Connection(poll_wait=3),  # said after the first poll; closed in the next
        )
        reader_done = threading.Event()

        def read() -> None:
            try:
                for _ in client.records(0):
                    pass
            except Exception:
                pass
            reader_done.set()

        reader = threading.Thread(target=read, name="test-reader")
        reader.start()
        assert said.event.wait(CLOSE_DEADLINE), "the fetcher never waited for a task"
        close_within(client)
        reader.join(CLOSE_DEADLINE)
        assert reader_done.is_set(), "records() did not end when the client closed"
        before.add(reader)
        assert_all_ended(before, calls)
    finally:
        logging.getLogger("chunkmaster.client").removeHandler(said)
        logging.getLogger("chunkmaster.client").setLevel(prior)
        other.kill()
        other.wait(10)
        m.kill()


def test_read_closes_its_client_on_sigterm_handing_its_tasks_back(tmp_path: Path) -> None:
    """SIGTERM to `chunkmaster read`: its client closes (the Goodbye hands the held tasks back
    at once, the session ends on the master), and it exits 143 (128 + SIGTERM)."""
    path = _dataset(tmp_path)
    m = _master(tmp_path, "--trainer-ttl", "600")  # a lease that never runs out in the test
    assert m.addr is not None
    trainer = subprocess.Popen(
        _read_cmd(m, "--dataset", path, "--passes=1", "--step-time=600", "--log-level=info"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until_holding(m.addr, trainer.pid, 1)
        trainer.send_signal(signal.SIGTERM)
        _, err = trainer.communicate(timeout=CLOSE_DEADLINE)
        assert trainer.returncode == 143, err
        assert "closed;" in err and "handed back" in err, err
        with MasterConnection(m.addr) as c:
            st = c.status()
        assert not st["pending_tasks"], st
    finally:
        trainer.kill()
        trainer.wait(10)
        m.kill()
