"""A real, throwaway etcd server for tests (no mocks: fencing and watches need the real thing).

Each server gets random free client and peer ports on 127.0.0.1 and a mkdtemp data dir, and is
tuned for speed (10 ms heartbeat, 100 ms election) with a 10 MiB request limit. `restart()`
reuses the same ports and data dir, so it looks to clients like the same etcd coming back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

ETCD_BINARY = os.environ.get("ETCD_BINARY", shutil.which("etcd") or "/usr/bin/etcd")


def _free_ports(n: int) -> list[int]:
    """Bind n sockets at once so the ports are distinct, then release them for etcd."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class EtcdServer:
    """One single-member etcd cluster, started by the constructor's `start()`."""

    def __init__(
        self,
        *,
        quota_backend_bytes: int | None = None,
        max_request_bytes: int = 10 * 1024 * 1024,
        extra_args: list[str] | None = None,
        start: bool = True,
    ) -> None:
        self.client_port, self.peer_port = _free_ports(2)
        self.data_root = tempfile.mkdtemp(prefix="etcd-test-")  # mkdtemp gives 0700, as etcd wants
        self.data_dir = os.path.join(self.data_root, "data")
        self.log_path = os.path.join(self.data_root, "etcd.log")
        self.quota_backend_bytes = quota_backend_bytes
        self.max_request_bytes = max_request_bytes
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._paused = False
        self._started = False  # a restart keeps the ports clients know
        if start:
            self.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def _args(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            ETCD_BINARY,
            "--name", "test",
            "--data-dir", self.data_dir,
            "--listen-client-urls", self.endpoint,
            "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"test={peer}",
            "--initial-cluster-state", "new",
            "--heartbeat-interval", "10",
            "--election-timeout", "100",
            "--max-request-bytes", str(self.max_request_bytes),
            "--logger", "zap",
            "--log-level", "warn",
        ]  # fmt: skip
        if self.quota_backend_bytes is not None:
            args += ["--quota-backend-bytes", str(self.quota_backend_bytes)]
        return args + self.extra_args

    def start(self, timeout: float = 15.0) -> None:
        if self.running:
            return
        first, self._started = not self._started, True
        for attempt in range(3):
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - kept for the process' life
            self.proc = subprocess.Popen(self._args(), stdout=self._log, stderr=subprocess.STDOUT)
            self._paused = False
            try:
                self.wait_healthy(timeout)
                return
            except RuntimeError:
                # Another process may take a free port between _free_ports and etcd's bind;
                # a first start may pick others (a restart must keep its ports).
                if not first or attempt == 2 or "address already in use" not in self.log_text():
                    raise
                self.proc.wait()
                self._log.close()
                self.client_port, self.peer_port = _free_ports(2)
                shutil.rmtree(self.data_dir, ignore_errors=True)

    def wait_healthy(self, timeout: float = 15.0) -> None:
        """Poll /health (stdlib only) until etcd answers healthy; fail with the log otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                break
            with (
                contextlib.suppress(OSError, ValueError, urllib.error.URLError),
                urllib.request.urlopen(self.endpoint + "/health", timeout=1) as resp,
            ):
                if json.loads(resp.read()).get("health") == "true":
                    return
            time.sleep(0.02)
        raise RuntimeError(f"etcd did not become healthy; log:\n{self.log_text()}")

    def log_text(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal(self, sig: signal.Signals) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def _reap(self, timeout: float = 10.0) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        """Graceful stop (SIGTERM)."""
        if self._paused:
            self.resume()
        self._signal(signal.SIGTERM)
        self._reap()

    def kill(self) -> None:
        """Crash (SIGKILL): no chance to flush or say goodbye."""
        self._signal(signal.SIGKILL)
        self._paused = False
        self._reap()

    def pause(self) -> None:
        """Hang the server (SIGSTOP): connections stay open but nothing answers."""
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self._paused = False

    def restart(self, timeout: float = 15.0) -> None:
        """Kill if needed, then start again on the same ports and data dir."""
        if self.running:
            self.kill()
        self.start(timeout)

    def cleanup(self) -> None:
        if self.running:
            self.kill()
        shutil.rmtree(self.data_root, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


@pytest.fixture
def etcd_server() -> Iterator[EtcdServer]:
    """A fresh etcd per test; killed and its data dir removed afterwards."""
    if not os.path.exists(ETCD_BINARY):
        pytest.skip("etcd binary not installed")
    server = EtcdServer()
    try:
        yield server
    finally:
        server.cleanup()
