"""A real `chunkmaster master` process for end-to-end tests: start, SIGKILL, restart."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

_SERVING = re.compile(r"serving on (\S+)")


class MasterProcess:
    """Runs `python -m chunkmaster master ARGS --port PORT` and learns its address from the log."""

    def __init__(self, args: Sequence[str], *, port: int = 0, log_path: Path | None = None) -> None:
        self.args = list(args)
        self.port = port
        self.addr: str | None = None
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._lock = threading.Lock()

    def start(self, timeout: float = 30.0, *, wait: bool = True) -> MasterProcess:
        """Start; with wait=False return at once (a standby serves only once it leads)."""
        self._ready.clear()
        self.addr = None
        cmd = [sys.executable, "-m", "chunkmaster", "master", *self.args, "--port", str(self.port)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        )
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        if wait and not self.wait_serving(timeout):
            self.kill()
            raise RuntimeError("master did not start serving:\n" + self.log())
        return self

    def wait_serving(self, timeout: float) -> bool:
        """Wait for the "serving on" line (a standby prints it only once it leads)."""
        return self._ready.wait(timeout)

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            with self._lock:
                self.lines.append(line)
            if self.log_path is not None:
                with open(self.log_path, "a") as f:
                    f.write(line)
            m = _SERVING.search(line)
            if m:
                self.addr = m.group(1)
                self.port = int(self.addr.rsplit(":", 1)[1])
                self._ready.set()

    def log(self) -> str:
        with self._lock:
            return "".join(self.lines)

    def wait_log(self, pattern: str, timeout: float = 30.0) -> bool:
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if rx.search(self.log()):
                return True
            if self.proc is not None and self.proc.poll() is not None:
                return bool(rx.search(self.log()))
            time.sleep(0.02)
        return False

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def restart(self, timeout: float = 30.0) -> MasterProcess:
        """Start again at the same port (the same address for the trainers)."""
        self.kill()
        return self.start(timeout)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
