"""Getting started is bounded (Connection(startup_timeout)): a wrong address (nothing listening)
or a master with no dataset raises after the bound, naming the address, how long it waited and
what it was waiting for, where it waited for ever with one line logged (under torchrun, a
silent hang). The wait is logged all along. Against a closed port and a real master process;
for the Client (with a session and without) and the torch Loader with two DataLoader workers.
The bound is small here (2 s); the test's own timeout is generous."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.master_process import MasterProcess

from chunkmaster.client import Client, Connection
from chunkmaster.client.errors import StartupTimeoutError
from chunkmaster.client.link import DEFAULT_STARTUP_TIMEOUT, NeverConnectedError

BOUND = 2.0


@pytest.fixture
def closed_addr() -> str:
    """An address nothing listens on (a port bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture
def empty_master(tmp_path: Path) -> Iterator[str]:
    """A real master serving, with no dataset: no trainer set one."""
    m = MasterProcess(["--store", str(tmp_path / "state.db")]).start()
    assert m.addr is not None
    yield m.addr
    m.kill()


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_the_default_bound_is_a_few_minutes_and_none_waits_for_ever() -> None:
    assert Connection().startup_timeout == DEFAULT_STARTUP_TIMEOUT == 300.0
    assert Connection(startup_timeout=None).startup_timeout is None
    with pytest.raises(ValueError, match=r"startup_timeout=0.*None: wait for ever"):
        Connection(startup_timeout=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("session", [True, False], ids=["session", "unary"])
def test_a_client_at_a_closed_port_raises_naming_it(
    closed_addr: str, session: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="chunkmaster.client")
    with Client(closed_addr, session=session, connection=Connection(startup_timeout=BOUND)) as c:
        c.start_get_records(0)
        with pytest.raises(NeverConnectedError) as raised:
            c.next_record()
    text = str(raised.value)
    assert closed_addr in text and "connection refused" in text, text
    assert "in 2s" in text and "startup_timeout=2" in text, text
    assert len(_lines(caplog, f"never connected to {closed_addr}")) >= 2, caplog.text


@pytest.mark.timeout(60)
def test_a_plain_call_at_a_closed_port_raises_naming_it(closed_addr: str) -> None:
    conn = Connection(startup_timeout=BOUND)
    with (
        Client(closed_addr, session=False, connection=conn) as c,
        pytest.raises(NeverConnectedError, match=f"never connected to {closed_addr}"),
    ):
        c.status()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("session", [True, False], ids=["session", "unary"])
def test_a_client_of_a_master_with_no_dataset_raises_naming_it(
    empty_master: str, session: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="chunkmaster.client")
    with Client(empty_master, session=session, connection=Connection(startup_timeout=BOUND)) as c:
        c.start_get_records(0)
        with pytest.raises(StartupTimeoutError) as raised:
            c.next_record()
    text = str(raised.value)
    assert f"the master at {empty_master} has no dataset after 2s" in text, text
    assert "no trainer called set_dataset" in text and "startup_timeout=2" in text, text
    assert len(_lines(caplog, "the master has no dataset yet")) >= 2, caplog.text


@pytest.mark.timeout(120)
def test_a_loader_at_a_closed_port_raises_naming_it(
    closed_addr: str, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("torch")
    from chunkmaster.torch import Loader

    caplog.set_level(logging.INFO, logger="chunkmaster.client")
    conn = Connection(startup_timeout=BOUND)
    with (
        Loader(closed_addr, num_workers=2, connection=conn) as L,
        pytest.raises(NeverConnectedError, match=f"never connected to {closed_addr} in 2s"),
    ):
        next(iter(L))
    assert len(_lines(caplog, f"never connected to {closed_addr}")) >= 2, caplog.text


@pytest.mark.timeout(120)
def test_a_loader_of_a_master_with_no_dataset_raises_naming_it(
    empty_master: str, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("torch")
    from chunkmaster.torch import Loader

    caplog.set_level(logging.INFO, logger="chunkmaster.client")
    conn = Connection(startup_timeout=BOUND)
    with (
        Loader(empty_master, num_workers=2, connection=conn) as L,
        pytest.raises(StartupTimeoutError, match=f"the master at {empty_master} has no"),
    ):
        next(iter(L))
    assert len(_lines(caplog, "the master has no dataset yet")) >= 2, caplog.text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["closed port", "no dataset"])
def test_read_gives_up_getting_started_naming_the_address(
    where: str, request: pytest.FixtureRequest
) -> None:
    """`chunkmaster read --startup-timeout 2`: exits 1, one line naming the address and what
    it waited for, the wait logged meanwhile."""
    addr = request.getfixturevalue("closed_addr" if where == "closed port" else "empty_master")
    cmd = [sys.executable, "-m", "chunkmaster", "read", "--addr", addr, "--passes=1"]
    cmd += ["--startup-timeout", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    if where == "closed port":
        assert f"never connected to {addr} in 2s (connection refused)" in last, done.stderr
        assert done.stderr.count(f"never connected to {addr}") >= 3, done.stderr
    else:
        assert f"the master at {addr} has no dataset after 2s" in last, done.stderr
        assert done.stderr.count("the master has no dataset yet") >= 2, done.stderr


@pytest.mark.timeout(120)
def test_once_started_the_bound_bounds_nothing(tmp_path: Path) -> None:
    """Past the start-up bound, a started client still waits for the other trainers' tasks
    (its own timeout ends the wait, not the bound), and a master lost mid-run is
    retry_timeout's: it raises TransportError, not NeverConnectedError."""
    from helpers.datasets import write_records

    from chunkmaster.client import TransportError

    path = str(write_records(tmp_path / "d.rio", [b"%06d" % i for i in range(4)]))
    m = MasterProcess(
        ["--store", str(tmp_path / "state.db"), "--chunk-per-task", "100"],
    ).start()
    assert m.addr is not None
    conn = Connection(startup_timeout=3.0, retry_timeout=3.0)
    try:
        with Client(m.addr) as holder:
            holder.set_dataset([path])
            holder.start_get_records(0)
            holder.next_record(timeout=60)  # the pass's one task is the holder's
            with Client(m.addr, connection=conn) as waiter:  # started: the master has a dataset
                waiter.start_get_records(0)
                with pytest.raises(TimeoutError) as raised:
                    waiter.next_record(timeout=10)  # over 3 bounds, waiting for the holder's task
                assert not isinstance(raised.value, StartupTimeoutError), raised.value
                m.kill()
                with pytest.raises(TransportError) as lost:
                    waiter.status()
                assert not isinstance(lost.value, NeverConnectedError), lost.value
    finally:
        m.kill()
