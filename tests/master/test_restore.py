"""Data checkpoints at the process level: save from a running master, restore into a fresh one.

A trainer (a raw Session stream) commits part of a task and all of another; the checkpoint is
saved with `chunkmaster checkpoint save`; the master is SIGKILLed and a new one starts on an
empty store with --restore. It continues from exactly the committed position. Bad restores are
refused with a message that says what is wrong: a damaged file, a changed dataset, a store
that already holds a job.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import ten_record_chunks, write_records
from helpers.master_process import MasterProcess
from helpers.raw_session import RawSession, position
from helpers.status_view import master_status_view

from chunkmaster.client.connection import MasterConnection
from chunkmaster.rpc import master_pb2 as pb


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chunkmaster", *args], capture_output=True, text=True, timeout=120
    )


def master(store: Path, *extra: str) -> MasterProcess:
    return MasterProcess(["--store", str(store), "--chunk-per-task", "1", *extra]).start()


def take(s: RawSession, finished: list[Any] | None = None) -> Any:
    s.send(next=pb.NextTask(finished=finished or [], want_task=True, pass_id=0, wait_seconds=5))
    return s.recv().task


@pytest.fixture
def data(tmp_path: Path) -> str:
    return ten_record_chunks(tmp_path / "d.rio")


def save_a_checkpoint(tmp_path: Path, data: str) -> tuple[Path, Any, Any]:
    """A job where task a is committed whole and task b up to record 4; b is then read to 7."""
    m = master(tmp_path / "first.db")
    try:
        assert m.addr is not None
        with MasterConnection(m.addr, timeout=60) as c:
            c.set_dataset([data])
        s = RawSession(m.addr)
        s.hello(name="t")
        a = take(s)
        b = take(s, finished=[position(a, 10)])
        s.send(commit=pb.Commit(positions=[position(a, 10), position(b, 4)]))
        assert s.recv().ack.applied == 2
        s.send(keep_alive=pb.KeepAlive(progress=[position(b, 7)]))  # read on, not committed
        ckpt = tmp_path / "job.ckpt"
        out = cli("checkpoint", "save", "--addr", m.addr, str(ckpt))
        assert out.returncode == 0, out.stderr
        s.close()
        return ckpt, a, b
    finally:
        m.kill()  # the whole job crashes


def test_a_fresh_master_continues_from_the_committed_position(tmp_path: Path, data: str) -> None:
    ckpt, a, b = save_a_checkpoint(tmp_path, data)
    shown = cli("checkpoint", "show", str(ckpt))
    assert shown.returncode == 0 and "pass 0: 1 task committed whole, 1 in part" in shown.stdout
    m = master(tmp_path / "second.db", "--restore", str(ckpt))
    try:
        assert m.addr is not None
        st = master_status_view(m.addr)
        assert (st.cur_pass, st.done, st.todo) == (0, 1, 3)
        s = RawSession(m.addr)
        s.hello()
        got = {}
        for _ in range(3):
            t = take(s)
            got[t.meta.id] = t.start
        assert a.meta.id not in got  # committed whole: not delivered again
        assert got[b.meta.id] == 4  # from the commit, not from the uncommitted progress (7)
        assert sorted(v for k, v in got.items() if k != b.meta.id) == [0, 0]
        s.close()
        # Started again with the same flag, the master goes on: it is not restored twice.
        m.restart()
        assert m.addr is not None
        assert "already" in m.log()
        assert master_status_view(m.addr).pending == 3
    finally:
        m.kill()


def test_bad_restores_are_refused_with_the_reason(tmp_path: Path, data: str) -> None:
    ckpt, _, _ = save_a_checkpoint(tmp_path, data)

    def refused(store: Path, *args: str) -> str:
        cmd = ["master", "--store", str(store), "--port", "0", *args]
        out = cli(*cmd)
        assert out.returncode != 0
        return out.stderr

    # A store that holds a job is not replaced unless asked.
    err = refused(tmp_path / "first.db", "--restore", str(ckpt))
    assert "already holds a job" in err and "--restore-replace" in err
    m = master(tmp_path / "first.db", "--restore", str(ckpt), "--restore-replace")
    try:
        assert m.addr is not None
        assert master_status_view(m.addr).done == 1
    finally:
        m.kill()
    # A damaged file: a byte of its sections, a byte of its JSON header (refused before the
    # sections are read: nothing says how long they may be).
    damaged = tmp_path / "damaged.ckpt"
    blob = bytearray(ckpt.read_bytes())
    blob[-20] ^= 0xFF
    damaged.write_bytes(bytes(blob))
    assert "checksum" in refused(tmp_path / "x.db", "--restore", str(damaged))
    blob = bytearray(ckpt.read_bytes())
    blob[30] ^= 0xFF
    damaged.write_bytes(bytes(blob))
    err = refused(tmp_path / "x.db", "--restore", str(damaged))
    assert "invalid data checkpoint: header is not ASCII JSON" in err
    assert "not a chunkmaster data checkpoint" in refused(tmp_path / "y.db", "--restore", data)
    # The dataset changed since: a file grew by a chunk.
    write_records(Path(data), [b"%03d" % i for i in range(50)], max_chunk_size=30)
    err = refused(tmp_path / "z.db", "--restore", str(ckpt))
    assert "dataset changed" in err and data in err
