"""Fixtures for the etcd tests: a real etcd server per test (see tests/helpers/etcd_server.py)."""

import sys
from pathlib import Path

# `helpers` lives in tests/; make it importable even before a rootdir conftest puts tests/ first.
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from helpers.etcd_server import etcd_server  # noqa: E402, F401
