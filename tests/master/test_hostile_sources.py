"""A dataset source that never answers must not hold the master: SetDataset callers give up at
their deadline, other calls are answered, and SIGTERM stops the master at once."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
from helpers.master_process import MasterProcess
from helpers.status_view import status_view

from chunkmaster.client import Client
from chunkmaster.client.connection import MasterConnection
from chunkmaster.master.daemon_threads import ItemTimeout, map_in_daemon_threads


def test_a_source_that_never_answers_neither_jams_nor_outlives_the_master(tmp_path: Path) -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never says a word
    accepted = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        conn, _ = silent.accept()
        held.append(conn)
        accepted.set()

    threading.Thread(target=accept, daemon=True).start()
    port = silent.getsockname()[1]
    root = f"ftp://127.0.0.1:{port}/"  # URLs are refused unless a data root names them
    master = MasterProcess(["--store", str(tmp_path / "state.db"), "--data-root", root]).start()
    try:
        with Client(master.addr) as c, pytest.raises(TimeoutError):
            c.set_dataset([f"ftp://127.0.0.1:{port}/train-*.rio"], timeout=1.0)
        assert accepted.wait(30), "the master never reached the source"
        with MasterConnection(master.addr) as conn:
            assert status_view(conn.status()).ready is False  # other calls are answered meanwhile
        # The indexing thread is still blocked on the silent source (its own timeout is 30 s):
        # a stop must not wait for it.
        assert master.terminate(timeout=20) == 0
    finally:
        master.kill()
        for conn in held:
            conn.close()
        silent.close()


def test_an_item_past_its_deadline_fails_at_once_naming_it() -> None:
    """A file whose index never comes (a hung file system) fails set_dataset by its deadline;
    its thread is abandoned, not waited for."""
    release = threading.Event()

    def index(name: str) -> str:
        if name == "hung":
            release.wait()
        return name.upper()

    assert map_in_daemon_threads(index, ["a", "b"], 4, item_timeout=30) == ["A", "B"]
    with pytest.raises(ItemTimeout) as err:
        map_in_daemon_threads(index, ["a", "hung", "c"], 2, item_timeout=0.2)
    assert err.value.item == "hung"
    release.set()
