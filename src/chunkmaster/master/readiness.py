"""The ready file: a machine-readable "this master serves, here" for scripts, tests and benches.

With `--ready-file PATH` the master writes, once it listens (and, on etcd, once it leads and has
published its address), a small JSON object: ``{"addr": "127.0.0.1:PORT", "pid": N, "store":
"sqlite"|"memory"|"etcd"}``, plus ``"metrics_addr": "HOST:PORT"`` with `--metrics-port`.
It is written to a temporary file and renamed, so a reader sees the whole object or nothing.
A stale file is removed at start-up, and the file again at a clean exit; after a crash it
stays, and its pid tells whose it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "MasterNotReady",
    "read_ready_file",
    "remove_ready_file",
    "wait_ready",
    "write_ready_file",
]

POLL_SECONDS = 0.01


class MasterNotReady(RuntimeError):
    """The master exited, or did not become ready in time; the message carries its log."""


def write_ready_file(
    path: str | Path, addr: str, store: str, *, metrics_addr: str | None = None
) -> None:
    """Atomically publish this process's readiness at `path`."""
    target = Path(path)
    info: dict[str, Any] = {"addr": addr, "pid": os.getpid(), "store": store}
    if metrics_addr is not None:
        info["metrics_addr"] = metrics_addr
    body = json.dumps(info)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(body + "\n")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_ready_file(path: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def read_ready_file(path: str | Path) -> dict[str, Any] | None:
    """The ready file's object, or None while there is none."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    info = json.loads(text)
    if not isinstance(info, dict) or not isinstance(info.get("addr"), str):
        raise ValueError(f"ready file {path} does not hold a master's address")
    return info


def wait_ready(
    path: str | Path,
    proc: subprocess.Popen[Any],
    timeout: float,
    log: Callable[[], str] | None = None,
) -> dict[str, Any]:
    """Wait for master `proc` to write its ready file; return its object.

    Raises MasterNotReady at once if the process exits first, or after `timeout` seconds,
    with the master's log: `log()` if given, else what is left on its stderr pipe.
    """
    end = time.monotonic() + timeout
    while True:
        info = read_ready_file(path)
        if info is not None:
            return info
        code = proc.poll()
        if code is not None:
            raise MasterNotReady(
                f"the master exited with code {code} before it was ready:\n{_log(proc, log)}"
            )
        if time.monotonic() >= end:
            raise MasterNotReady(f"the master was not ready after {timeout}s")
        time.sleep(POLL_SECONDS)


def _log(proc: subprocess.Popen[Any], log: Callable[[], str] | None) -> str:
    if log is not None:
        return log()
    if proc.stderr is not None:
        text = proc.stderr.read()
        return text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    return "(stderr not captured)"
