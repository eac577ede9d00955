"""Shared fixtures: puts tests/ on the path for `helpers`, and the real etcd server fixture."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from helpers.etcd_server import etcd_server  # noqa: E402, F401
