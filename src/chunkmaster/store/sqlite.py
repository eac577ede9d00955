"""The embedded store: a SQLite file in WAL mode, the default on a single machine.

Every `save` is one transaction, committed (and with synchronous=FULL, fsynced) before it
returns, so `kill -9` at any moment loses nothing acknowledged. One master per file: a
lock file next to the database keeps a second master from writing the same journal.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from chunkmaster.store.base import Recovered, StoreError

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (seq INTEGER PRIMARY KEY, entry BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS snapshot (
    id INTEGER PRIMARY KEY CHECK (id = 0), seq INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta (key, value) VALUES ('format', 'chunkmaster-journal-1');
"""


class SqliteStore:
    """Journal and snapshot in one SQLite database at `path`.

    `synchronous` is SQLite's setting: "full" (default) survives power loss as well as a
    killed process; "normal" survives a killed process and is faster.
    `busy_timeout` bounds how long a write waits for a lock held by someone else.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, synchronous: str = "full", busy_timeout: float = 5.0
    ) -> None:
        if synchronous not in ("full", "normal"):
            raise ValueError(f"synchronous must be 'full' or 'normal', not {synchronous!r}")
        self.path = Path(path).expanduser().resolve()
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._closed = False

    # All SQLite work happens on one thread: the connection is only ever used there.
    async def _run(self, fn: Callable[[], T]) -> T:
        if self._closed:
            raise StoreError(f"store {self.path} is shut down")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn)
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite store {self.path}: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._take_file_lock()
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous.upper()}")
            conn.executescript(_SCHEMA)
            os.chmod(self.path, 0o600)
            self._conn = conn
        return self._conn

    def _take_file_lock(self) -> None:
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreError(
                f"store {self.path} is in use by another master (pid {holder}); "
                "two masters must never share one journal"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    async def load(self) -> Recovered:
        def work() -> Recovered:
            conn = self._connect()
            row = conn.execute("SELECT seq, data FROM snapshot WHERE id = 0").fetchone()
            snap, snap_seq = (None, 0) if row is None else (bytes(row[1]), int(row[0]))
            entries = tuple(
                (int(s), bytes(e))
                for s, e in conn.execute(
                    "SELECT seq, entry FROM journal WHERE seq > ? ORDER BY seq", (snap_seq,)
                )
            )
            return Recovered(snap, snap_seq, entries)

        return await self._run(work)

    async def save(self, entries: Sequence[tuple[int, bytes]]) -> None:
        def work() -> None:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("INSERT INTO journal (seq, entry) VALUES (?, ?)", entries)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        await self._run(work)

    async def compact(self, snapshot: bytes, seq: int) -> None:
        def work() -> None:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "INSERT OR REPLACE INTO snapshot (id, seq, data) VALUES (0, ?, ?)",
                    (seq, snapshot),
                )
                conn.execute("DELETE FROM journal WHERE seq <= ?", (seq,))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        await self._run(work)

    async def shutdown(self) -> None:
        if self._closed:
            return

        def work() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

        try:
            await self._run(work)
        finally:
            self._closed = True
            self._executor.shutdown(wait=False)

    def describe(self) -> str:
        return f"embedded SQLite store at {self.path} (synchronous={self._synchronous})"
