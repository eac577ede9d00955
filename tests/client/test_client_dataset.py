"""Client.set_dataset against a real master process: its deadline, and errors on bad input."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from chunkmaster.client import Client, EndOfPass
from chunkmaster.core.errors import MasterError


def test_set_dataset_gives_up_at_its_deadline_while_the_master_stalls(
    master_process: Any, rio: Any
) -> None:
    """A master that accepts the call but does not answer (stopped with SIGSTOP): the call
    gives up at its deadline, and works once the master runs again."""
    m = master_process()
    path = rio("good.rio", [b"a", b"b", b"c"])
    with Client(m.addr) as c:
        c.status()  # connected before the master stalls
        assert m.proc is not None
        os.kill(m.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(TimeoutError, match="did not answer within 0.5s"):
                c.set_dataset([path], timeout=0.5)
        finally:
            os.kill(m.proc.pid, signal.SIGCONT)
        c.set_dataset([path], timeout=60)
        assert sorted(c.records(0)) == [b"a", b"b", b"c"]
        c.start_get_records(1)
        assert sorted(c.next_record(timeout=60) for _ in range(3)) == [b"a", b"b", b"c"]
        with pytest.raises(EndOfPass):
            c.next_record(timeout=60)


def test_set_dataset_on_a_fifo_is_refused_at_once(master_process: Any, tmp_path: Path) -> None:
    """A named pipe is refused by type before it is opened: the master never blocks on it."""
    fifo = tmp_path / "slow.rio"
    os.mkfifo(fifo)
    m = master_process()
    with Client(m.addr) as c, pytest.raises(MasterError, match="is a FIFO, not a regular file"):
        c.set_dataset([str(fifo)], timeout=60)


def test_set_dataset_gives_up_at_its_deadline_when_no_master_answers(tmp_path: Path) -> None:
    """Nothing listens at the address: retries stop at the deadline, not at retry_timeout."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with Client(f"127.0.0.1:{port}") as c, pytest.raises(TimeoutError):
            c.set_dataset([str(tmp_path / "*.rio")], timeout=0.5)
