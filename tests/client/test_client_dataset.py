"""Client.set_dataset against a real master process: its deadline, and errors on bad input."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from chunkmaster.client import Client, EndOfPass
from chunkmaster.core.errors import MasterError


def test_set_dataset_gives_up_at_its_deadline_while_the_master_indexes(
    master_process: Any, rio: Any, tmp_path: Path
) -> None:
    """The master's indexing blocks on a FIFO nobody writes to: the call must not wait for it."""
    fifo = tmp_path / "slow.rio"
    os.mkfifo(fifo)
    m = master_process()
    with Client(m.addr) as c:
        with pytest.raises(TimeoutError, match="did not answer within 0.5s"):
            c.set_dataset([str(fifo)], timeout=0.5)
        # Release the master's indexing: writers that close at once make the FIFO an empty
        # file for every open of it, until the master has answered.
        answered = threading.Event()
        releaser = threading.Thread(target=_release, args=(fifo, answered), daemon=True)
        releaser.start()
        try:
            with pytest.raises(MasterError, match="no valid dataset"):
                c.set_dataset([str(fifo)], timeout=60)
        finally:
            answered.set()
            releaser.join()
        path = rio("good.rio", [b"a", b"b", b"c"])
        c.set_dataset([path], timeout=60)
        assert sorted(c.records(0)) == [b"a", b"b", b"c"]
        c.start_get_records(1)
        assert sorted(c.next_record(timeout=60) for _ in range(3)) == [b"a", b"b", b"c"]
        with pytest.raises(EndOfPass):
            c.next_record(timeout=60)


def _release(fifo: Path, stop: threading.Event) -> None:
    while not stop.wait(0.01):
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # fails while nobody reads it
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            continue
        os.close(fd)


def test_set_dataset_gives_up_at_its_deadline_when_no_master_answers(tmp_path: Path) -> None:
    """Nothing listens at the address: retries stop at the deadline, not at retry_timeout."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with Client(f"127.0.0.1:{port}") as c, pytest.raises(TimeoutError):
            c.set_dataset([str(tmp_path / "*.rio")], timeout=0.5)
