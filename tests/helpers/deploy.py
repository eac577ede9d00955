"""For the deployment tests: the repository's root, and installing what a cluster test needs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def ensure(script: str) -> None:
    """Run scripts/<script> (it installs Debian packages when missing); skip, naming its
    output, when it cannot."""
    proc = subprocess.run(
        ["sh", str(REPO / "scripts" / script)], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        pytest.skip(f"scripts/{script} failed: {(proc.stderr or proc.stdout).strip()[-800:]}")
