"""The `chunkmaster` command run as a user runs it: a process of this Python, its output kept."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


def cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m chunkmaster ARGS...` (with `env` in place of this process's environment)."""
    return subprocess.run(
        [sys.executable, "-m", "chunkmaster", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else dict(env),
    )
