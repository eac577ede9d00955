"""A real `chunkmaster master` process for end-to-end tests: start, SIGKILL, restart."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from chunkmaster.master.readiness import (
    MasterNotReady,
    read_ready_file,
    remove_ready_file,
    wait_ready,
)
from helpers.waits import wait_for

_names = itertools.count()


class MasterProcess:
    """Runs `python -m chunkmaster master ARGS --port PORT` and learns its address from the
    master's ready file (`--ready-file`). `preexec_fn` runs in the child before the master
    starts (e.g. to lower its open-file limit). `python` (default: this one, with this
    environment) and `env` run another installation of chunkmaster (an earlier release's
    virtualenv)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        port: int = 0,
        log_path: Path | None = None,
        preexec_fn: Callable[[], None] | None = None,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
    ) -> None:
        self.args = list(args)
        self.python = python
        self.env = env
        self.port = port
        self.log_path = log_path
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.ready_file = Path(tempfile.mkdtemp(prefix="master-")) / f"ready-{next(_names)}.json"
        self._addr: str | None = None
        self._lock = threading.Lock()

    def start(self, timeout: float = 30.0, *, wait: bool = True) -> MasterProcess:
        """Start; with wait=False return at once (a standby serves only once it leads)."""
        self._addr = None
        remove_ready_file(self.ready_file)
        cmd = [self.python, "-m", "chunkmaster", "master", *self.args, "--port", str(self.port)]
        cmd += ["--ready-file", str(self.ready_file)]
        env = dict(os.environ if self.env is None else self.env, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=self.preexec_fn,
        )
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        if wait:
            try:
                self._learn(wait_ready(self.ready_file, self.proc, timeout, self.log))
            except MasterNotReady as exc:
                self.kill()
                raise RuntimeError(f"master did not start serving: {exc}\n{self.log()}") from None
        return self

    @property
    def addr(self) -> str | None:
        """The address from the ready file; None until this run of the master serves."""
        if self._addr is None and self.proc is not None:
            info = read_ready_file(self.ready_file)
            if info is not None:
                self._learn(info)
        return self._addr

    def _learn(self, info: dict[str, object]) -> None:
        self._addr = str(info["addr"])
        self.port = int(self._addr.rsplit(":", 1)[1])

    def wait_serving(self, timeout: float) -> bool:
        """Wait for the ready file (a standby writes it only once it leads); False if the
        master exits first or `timeout` passes."""
        assert self.proc is not None
        try:
            self._learn(wait_ready(self.ready_file, self.proc, timeout, self.log))
        except MasterNotReady:
            return False
        return True

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            with self._lock:
                self.lines.append(line)
            if self.log_path is not None:
                with open(self.log_path, "a") as f:
                    f.write(line)

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


def wait_leader(candidates: Sequence[MasterProcess], timeout: float = 30.0) -> MasterProcess:
    """The candidate that writes its ready file first (only the lock holder does)."""
    up: list[MasterProcess] = []

    def took_over() -> bool:
        up[:] = [m for m in candidates if m.addr is not None and m.running]
        return bool(up)

    wait_for(
        took_over,
        "a standby to take over (write its ready file)",
        timeout,
        explain=lambda: ":\n" + "\n".join(m.log()[-2000:] for m in candidates),
    )
    return up[0]
