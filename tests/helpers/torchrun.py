"""examples/train_ddp.py under a real torchrun, its output kept in a log beside the test's files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"


def run_example(
    tmp_path: Path, name: str, launch: Sequence[str], args: Sequence[str]
) -> subprocess.CompletedProcess[str]:
    """`torchrun LAUNCH... examples/train_ddp.py ARGS...`; its output in `tmp_path/NAME.log`
    and in the result's stdout."""
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert exe is not None, "torchrun is installed with torch"
    log = tmp_path / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.run(
            [exe, *launch, str(EXAMPLE), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=600,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )
    proc.stdout = log.read_text()
    return proc
