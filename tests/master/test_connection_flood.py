"""A flood of connections and of refused calls against a real master process (issue 19,
"connection exhaustion"): the master keeps its connections below its open-file limit, keeps
serving the sessions it has, logs a bounded number of lines, and serves new clients once the
flood is over.

The master runs with a low open-file limit, soft and hard (so it cannot raise it), set by the
test before it starts; the flood is plain TCP connections that never say a word.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess
from helpers.raw_session import RawSession
from helpers.status_view import status_view
from helpers.waits import wait_for

from chunkmaster.client.connection import ChannelSecurity, MasterConnection
from chunkmaster.core.errors import UnauthenticatedError
from chunkmaster.master.readiness import read_ready_file
from chunkmaster.rpc import master_pb2 as pb

OPEN_FILES = 256  # the master's limit, soft and hard


def low_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def closed_by_peer(s: socket.socket) -> bool:
    """Whether the master closed this connection (what it sent first is read and dropped)."""
    try:
        while s.recv(65536):
            pass
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


@contextlib.contextmanager
def flood(host: str, port: int, n: int) -> Iterator[list[socket.socket]]:
    """n TCP connections that never send a byte (kept open until the block ends)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect((host, port))
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def lines_until(master: MasterProcess, marker: str, start: int) -> list[str]:
    """The master's log lines from line `start` up to the first holding `marker` (logged after
    everything the test counts, so every line before it has been read)."""
    assert master.wait_log(marker), master.log()
    lines = master.log().splitlines()
    end = next(i for i, ln in enumerate(lines) if marker in ln)
    return lines[start:end]


def next_task(session: RawSession, finished: list[pb.TaskPosition]) -> pb.Task:
    session.send(next=pb.NextTask(finished=finished, want_task=True, wait_seconds=5))
    resp = session.recv()
    assert not isinstance(resp, Exception) and resp is not None, resp
    assert resp.WhichOneof("body") == "task", resp
    return resp.task


def test_a_connection_flood_leaves_sessions_served_and_the_log_short(tmp_path: Path) -> None:
    data = numbered_records(tmp_path / "d.rio", 200)
    master = MasterProcess(
        ["--store", str(tmp_path / "s.db"), "--chunk-per-task", "1"], preexec_fn=low_open_files
    ).start()
    session: RawSession | None = None
    try:
        assert master.addr is not None and master.proc is not None
        pid = master.proc.pid
        host, port = master.addr.rsplit(":", 1)
        with MasterConnection(master.addr) as c:
            c.set_dataset([data])
        session = RawSession(master.addr)
        assert session.hello().WhichOneof("body") == "welcome"
        task = next_task(session, [])
        lines_before = len(master.log().splitlines())
        fds_before = open_fds(pid)
        with flood(host, int(port), 2 * OPEN_FILES) as socks:
            most = 0

            def flood_taken() -> bool:
                """Every flood connection was accepted (held open or closed at once), or the
                master ran out of descriptors."""
                nonlocal most
                fds = open_fds(pid)
                most = max(most, fds)
                closed = sum(closed_by_peer(s) for s in socks)
                return fds >= OPEN_FILES - 8 or closed + fds - fds_before >= len(socks)

            wait_for(flood_taken, "the master to take the flood")
            # The session it serves goes on: finishes and tasks, one after the other.
            for _ in range(20):
                done = pb.TaskPosition(
                    task_id=task.meta.id, epoch=task.meta.epoch, pass_id=0, records=1
                )
                task = next_task(session, [done])
                most = max(most, open_fds(pid))
            assert most < OPEN_FILES - 8, f"{most} descriptors open of {OPEN_FILES}"

        # Once the flood is over, new clients are served.
        def served() -> bool:
            try:
                with MasterConnection(master.addr, timeout=2) as c:
                    return status_view(c.status()).ready is True
            except Exception:
                return False

        wait_for(served, "a new client to be served")
        fresh = RawSession(master.addr)
        try:
            assert fresh.hello(name="after-the-flood").WhichOneof("body") == "welcome"
            assert next_task(fresh, []).meta.id >= 0
        finally:
            fresh.close()
        added = lines_until(master, "trainer after-the-flood", lines_before)
        assert len(added) <= 5, "\n".join(added[:50])
        assert "accepting at most" in master.log()
    finally:
        if session is not None:
            session.close()
        master.kill()


def test_the_metrics_port_holds_a_few_connections_at_once(tmp_path: Path) -> None:
    """Connections to the metrics port beyond a few dozen are closed as soon as they are
    accepted; once they are gone, the port answers again."""
    master = MasterProcess(
        ["--store", ":memory:", "--metrics-port", "0"], preexec_fn=low_open_files
    ).start()
    try:
        assert master.proc is not None
        pid = master.proc.pid
        info = read_ready_file(master.ready_file)
        assert info is not None
        host, port = str(info["metrics_addr"]).rsplit(":", 1)
        fds_before = open_fds(pid)
        socks: list[socket.socket] = []
        held = 0
        try:
            for _ in range(200):  # one at a time: each accepted before the next comes
                s = socket.create_connection((host, int(port)), timeout=10)
                s.setblocking(False)
                socks.append(s)

                def accepted(s: socket.socket = s, held: int = held) -> bool:
                    return closed_by_peer(s) or open_fds(pid) > fds_before + held

                wait_for(accepted, "the master to accept a connection")
                if not closed_by_peer(s):
                    held += 1
            assert held <= 64, f"{held} silent connections held open"
        finally:
            for s in socks:
                s.close()
        with urllib.request.urlopen(f"http://{info['metrics_addr']}/metrics", timeout=10) as r:
            assert r.status == 200
    finally:
        master.kill()


def test_refused_calls_in_their_thousands_log_a_few_lines(tmp_path: Path) -> None:
    """Each call with a wrong token is refused; the log says so a bounded number of times."""
    token = tmp_path / "token"
    token.write_text("the-right-token\n")
    master = MasterProcess(["--store", ":memory:", "--token-file", str(token)]).start()
    try:
        assert master.addr is not None
        lines_before = len(master.log().splitlines())
        with MasterConnection(master.addr, security=ChannelSecurity(token="wrong")) as c:
            for _ in range(2000):
                with pytest.raises(UnauthenticatedError):
                    c.status()
        marker = RawSession(master.addr, ChannelSecurity(token="the-right-token"))
        try:
            assert marker.hello(name="after-the-refusals").WhichOneof("body") == "welcome"
        finally:
            marker.close()
        added = lines_until(master, "trainer after-the-refusals", lines_before)
        refused = [ln for ln in added if "wrong token" in ln]
        assert 1 <= len(refused) <= 30, f"{len(refused)} lines:\n" + "\n".join(added[:40])
    finally:
        master.kill()


def test_the_master_raises_its_open_file_limit_to_the_hard_one() -> None:
    """Services often start with a soft limit of 1024 under a far higher hard one."""

    def soft_below_hard() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, 4 * OPEN_FILES))

    master = MasterProcess(["--store", ":memory:"], preexec_fn=soft_below_hard).start()
    try:
        assert master.proc is not None
        limits = Path(f"/proc/{master.proc.pid}/limits").read_text()
        (line,) = [ln for ln in limits.splitlines() if ln.startswith("Max open files")]
        assert line.split()[3:5] == [str(4 * OPEN_FILES)] * 2, line
        assert f"(open-file limit {4 * OPEN_FILES})" in master.log()
    finally:
        master.kill()
