"""The embedded store: a SQLite file in WAL mode, the default on a single machine.

Every `save` is one transaction, committed (and with synchronous=FULL, fsynced) before it
returns, so `kill -9` at any moment loses nothing acknowledged.

Before anything is written, the store's files are checked (`damage.py`): a damaged store must
never pass for an empty or an older one; a witness beside the database (`witness.py`) says
which store it is and how far it got. Any failure raises StoreDamagedError naming the file,
what is wrong and the ways out (`on_damage`); nothing is ever deleted.

The store's directory must be the master's own (`directory.unsafe_directory`), and one master
holds a store at a time, however its path is spelled (`directory.FileLock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from chunkmaster.store.base import (
    Recovered,
    StoreDamagedError,
    StoreError,
    StoreUnsafeError,
)
from chunkmaster.store.damage import (
    APPLICATION_ID,
    FORMAT_VERSION,
    Damage,
    Found,
    Inspection,
    move_aside,
    refusal,
)
from chunkmaster.store.directory import FileLock, folder_problem, unsafe_directory
from chunkmaster.store.witness import Witness, WitnessRecord

T = TypeVar("T")

log = logging.getLogger("chunkmaster.store")

ON_DAMAGE = ("refuse", "move-aside", "accept-older")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS journal (seq INTEGER PRIMARY KEY, entry BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS snapshot ("
    " id INTEGER PRIMARY KEY CHECK (id = 0), seq INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


class SqliteStore:
    """Journal and snapshot in one SQLite database at `path`.

    `synchronous` is SQLite's setting: "full" (default) survives power loss as well as a
    killed process; "normal" survives a killed process and is faster (its witness is then
    written only at a clean shutdown, as only then is the database known to be on disk).
    `busy_timeout` bounds how long a write waits for a lock held by someone else.
    `job`, when given, must match the job the store was created for (it is recorded then).
    `on_damage` is what to do with a damaged store: "refuse" (raise StoreDamagedError),
    "move-aside" (rename its files to `<name>.damaged-<UTC time>*` and start empty) or
    "accept-older" (start from what a sound but older database holds, e.g. a backup put
    back on purpose). A sound store is opened as it is whatever `on_damage` says.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "full",
        busy_timeout: float = 5.0,
        job: str | None = None,
        on_damage: str = "refuse",
    ) -> None:
        if synchronous not in ("full", "normal"):
            raise ValueError(f"synchronous must be 'full' or 'normal', not {synchronous!r}")
        if on_damage not in ON_DAMAGE:
            raise ValueError(f"on_damage must be one of {', '.join(ON_DAMAGE)}, not {on_damage!r}")
        self.path = Path(path).expanduser().resolve()
        self.witness_path = self.path.with_name(self.path.name + ".witness")
        self.job = job or None
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._on_damage = on_damage
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        self._conn: sqlite3.Connection | None = None
        self._lock = FileLock(self.path)
        self._inspection = Inspection(self.path, self.witness_path, self.job)
        self._witness: Witness | None = None
        self._witness_failed = False
        self._last_seq = 0
        self._closed = False

    # All SQLite work happens on one thread: the connection is only ever used there.
    async def _run(self, fn: Callable[[], T]) -> T:
        if self._closed:
            raise StoreError(f"store {self.path} is shut down")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn)
        except sqlite3.Error as exc:
            raise StoreError(self._cause(exc)) from exc
        except OSError as exc:
            raise StoreError(self._cause(exc)) from exc

    def _cause(self, exc: sqlite3.Error | OSError) -> str:
        """The error as the user needs it: the file, SQLite's or the OS's words, and for a
        full disk how much room is left."""
        if isinstance(exc, OSError):
            where = exc.filename or self.path
            text = f"SQLite store {self.path}: {where}: {exc.strerror or exc}"
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        else:
            name = getattr(exc, "sqlite_errorname", "")
            text = f"SQLite store {self.path}: {exc}" + (f" [{name}]" if name else "")
            full = name == "SQLITE_FULL"
            if name.startswith("SQLITE_READONLY"):
                text += " (the file or its filesystem is read-only)"
        if full:
            try:
                vfs = os.statvfs(self.path.parent)
                text += f" ({vfs.f_bavail * vfs.f_frsize} bytes free on its filesystem)"
            except OSError:
                pass
        return text

    # ---- opening: lock, inspect, then open for writing ----------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            problem = folder_problem(self.path)
            if problem is not None:
                raise StoreError(f"SQLite store {self.path}: {problem}")
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            unsafe = unsafe_directory(self.path.parent, os.stat(self.path.parent))
            if unsafe is not None:
                raise StoreUnsafeError(unsafe)
            self._lock.take()
            try:
                self._conn = self._open()
            except BaseException:
                self._release()
                raise
        return self._conn

    def _release(self) -> None:
        if self._witness is not None:
            with contextlib.suppress(OSError):
                self._witness.close()
            self._witness = None
        self._lock.release()

    def _open(self) -> sqlite3.Connection:
        try:
            found = self._inspection.inspect()
        except Damage as damage:
            if self._on_damage == "move-aside":
                move_aside(self.path, damage.what)
                self._release()
                self._lock.take()
                try:
                    found = self._inspection.inspect()
                except Damage as again:
                    raise StoreDamagedError(refusal(self.path, again)) from None
            elif self._on_damage == "accept-older" and damage.accept is not None:
                log.warning(
                    "store %s %s; starting from what it holds (entry %d) as asked "
                    "(on_damage=accept-older)",
                    self.path,
                    damage.what,
                    damage.accept.last_seq,
                )
                found = damage.accept
            else:
                raise StoreDamagedError(refusal(self.path, damage)) from None
        conn = sqlite3.connect(
            self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous.upper()}")
            self._prepare(conn, found)
        except BaseException:
            conn.close()
            raise
        os.chmod(self.path, 0o600)
        return conn

    def _prepare(self, conn: sqlite3.Connection, found: Found) -> None:
        """Create, upgrade or adopt the database and its witness as inspected."""
        if found.kind == "ours":
            if self.job is not None and found.job is None:
                self._set_meta(conn, {"job": self.job})
            record = WitnessRecord(str(found.store_id), found.last_seq)
            if found.witness_counter < 0:
                self._witness = Witness.create(self.witness_path, record)
            else:
                self._witness = Witness.open(self.witness_path, record, found.witness_counter)
            self._note_durable(found.last_seq)
            return
        # The witness goes first: a crash before the database is ready leaves a witness at
        # entry 0 beside a blank or legacy database, which the next start simply redoes.
        store_id = found.store_id or uuid.uuid4().hex
        self._witness = Witness.create(self.witness_path, WitnessRecord(store_id, 0))
        with _transaction(conn):
            for stmt in _SCHEMA:
                conn.execute(stmt)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {FORMAT_VERSION}")
            values = {"format": f"chunkmaster-journal-{FORMAT_VERSION}", "store_id": store_id}
            if self.job is not None and found.job is None:
                values["job"] = self.job
            conn.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", values.items()
            )
        self._last_seq = found.last_seq
        self._witness.update(found.last_seq, sync=True)
        if found.kind == "legacy":
            log.info(
                "store %s: upgraded to format %d (store id %s)", self.path, FORMAT_VERSION, store_id
            )

    def _set_meta(self, conn: sqlite3.Connection, values: dict[str, str]) -> None:
        with _transaction(conn):
            conn.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", values.items()
            )

    def _note_durable(self, seq: int) -> None:
        """Record `seq` in the witness (full mode only: see the class docstring)."""
        self._last_seq = seq
        if self._synchronous != "full" or self._witness is None:
            return
        try:
            self._witness.update(seq, sync=False)
        except OSError as exc:  # the entry is durable; the witness only lags behind
            if not self._witness_failed:
                log.warning("store %s: cannot update its witness (%s)", self.path, exc)
            self._witness_failed = True
        else:
            self._witness_failed = False

    # ---- the Store protocol -------------------------------------------------------------

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
            self._last_seq = entries[-1][0] if entries else snap_seq
            return Recovered(snap, snap_seq, entries)

        return await self._run(work)

    async def save(self, entries: Sequence[tuple[int, bytes]]) -> None:
        if not entries:
            return

        def work() -> None:
            conn = self._connect()
            if entries[0][0] != self._last_seq + 1:
                raise StoreError(
                    f"store {self.path}: journal gap: got entry {entries[0][0]}, "
                    f"expected {self._last_seq + 1}"
                )
            with _transaction(conn):
                conn.executemany("INSERT INTO journal (seq, entry) VALUES (?, ?)", entries)
            self._note_durable(entries[-1][0])

        await self._run(work)

    async def compact(self, snapshot: bytes, seq: int) -> None:
        def work() -> None:
            conn = self._connect()
            with _transaction(conn):
                conn.execute(
                    "INSERT OR REPLACE INTO snapshot (id, seq, data) VALUES (0, ?, ?)",
                    (seq, snapshot),
                )
                conn.execute("DELETE FROM journal WHERE seq <= ?", (seq,))

        await self._run(work)

    async def shutdown(self) -> None:
        if self._closed:
            return

        def work() -> None:
            if self._conn is not None:
                self._conn.close()  # checkpoints the -wal into the database and syncs it
                self._conn = None
                if self._witness is not None:
                    try:
                        self._witness.update(self._last_seq, sync=True)
                    except OSError as exc:
                        log.warning("store %s: cannot update its witness (%s)", self.path, exc)
            self._release()

        try:
            await self._run(work)
        finally:
            self._closed = True
            self._executor.shutdown(wait=False)

    def describe(self) -> str:
        return f"embedded SQLite store at {self.path} (synchronous={self._synchronous})"


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: committed at the end of the block, rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo an open transaction, keeping the error that caused it: SQLite may already have
    rolled back (a full disk does), and a failing ROLLBACK must not hide the real cause."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
