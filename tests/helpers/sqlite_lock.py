"""Another connection holding SQLite's write lock: the store's next write waits for it, so a
test sees what the master does while a write is in flight."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def next_write_held(db: Path) -> Iterator[None]:
    """The store at `db` (opened with a busy timeout longer than the block) writes only after
    the block."""
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()
