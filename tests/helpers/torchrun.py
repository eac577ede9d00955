"""Scripts (examples/train_ddp.py, the loop of docs/torch.md) under a real torchrun, their output
kept in a log beside the test's files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"


def run_torchrun(
    log: Path,
    launch: Sequence[str],
    script: Path,
    args: Sequence[str] = (),
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """`torchrun LAUNCH... SCRIPT ARGS...` in `cwd`, with `env` added to this process's
    environment; its output in `log` and in the result's stdout."""
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert exe is not None, "torchrun is installed with torch"
    with open(log, "w") as out:
        proc = subprocess.run(
            [exe, *launch, str(script), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})),
        )
    proc.stdout = log.read_text()
    return proc


def run_example(
    tmp_path: Path, name: str, launch: Sequence[str], args: Sequence[str]
) -> subprocess.CompletedProcess[str]:
    """`torchrun LAUNCH... examples/train_ddp.py ARGS...`; its output in `tmp_path/NAME.log`
    and in the result's stdout."""
    return run_torchrun(tmp_path / f"{name}.log", launch, EXAMPLE, args)
