"""The embedded store: a SQLite file in WAL mode, the default on a single machine.

Every `save` is one transaction, committed (and with synchronous=FULL, fsynced) before it
returns, so `kill -9` at any moment loses nothing acknowledged.

A damaged store must never pass for an empty or an older one, and SQLite alone cannot tell:
a database whose `-wal` file is missing, garbled or truncated, or that was copied back from an
older backup, opens as a valid database at an older state; a truncated file opens as an empty
one. So each store keeps a *witness* beside it (`<db>.witness`, see `Witness`): the store's
random id and the last entry it made durable. Before anything is written (through a
read-only connection, so that a damaged `-wal` file is left as it was) the store checks
SQLite's `quick_check`, its application_id and format version, its tables, its job name and
that it holds at least the witness's entry. Any failure raises StoreDamagedError naming the
file, what is wrong and the ways out (`on_damage`); nothing is ever deleted.

The store's directory must be the master's own: owned by its user (or root) and writable by no
one else, since whoever can write a directory can rename, replace or delete the files in it
(`unsafe_directory`).

One master per store, however its path is spelled (symlink, hard link, bind mount, `/./`,
relative): the lock is an exclusive flock on the database file's inode.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import pwd
import sqlite3
import stat
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from chunkmaster.store.base import (
    Recovered,
    StoreDamagedError,
    StoreError,
    StoreInUseError,
    StoreUnsafeError,
)

T = TypeVar("T")

log = logging.getLogger("chunkmaster.store")

APPLICATION_ID = 0x434D4A31  # "CMJ1" in the SQLite header: this file is a chunkmaster journal
FORMAT_VERSION = 2  # PRAGMA user_version of the files this module writes
_LEGACY_FORMAT = "chunkmaster-journal-1"  # meta.format of stores from before the witness

ON_DAMAGE = ("refuse", "move-aside", "accept-older")

_COLUMNS = {
    "journal": {"seq", "entry"},
    "snapshot": {"id", "seq", "data"},
    "meta": {"key", "value"},
}
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS journal (seq INTEGER PRIMARY KEY, entry BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS snapshot ("
    " id INTEGER PRIMARY KEY CHECK (id = 0), seq INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)
_DAMAGE_CODES = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}

# Stores this process holds, by (st_dev, st_ino): a second attempt from the same process must
# not open (and then close) a descriptor of a held file, which would drop SQLite's own locks.
_held: set[tuple[int, int]] = set()
_held_lock = threading.Lock()


@dataclass(frozen=True)
class WitnessRecord:
    store_id: str  # 32 hex digits, the same as the database's meta.store_id
    seq: int  # the store had made entries up to this one durable


class Witness:
    """The record, outside the database, of which store this is and how far it got.

    Two fixed 64-byte slots written in turn, each with its own CRC: a torn write spoils at
    most the slot being written, and the other still holds the previous record. After each
    commit one slot is rewritten in place without fsync (a few microseconds next to the
    commit's own fsync); it may lag the database after a power cut, never lead it, since
    it is written after the commit is durable. Opening, accepting and closing fsync it.
    """

    _SLOT = struct.Struct("<8sQQ16sI")  # magic, write counter, seq, store id, crc32
    _MAGIC = b"CMWITNS1"
    _SLOT_SIZE = 64

    def __init__(self, path: Path, fd: int, record: WitnessRecord, counter: int) -> None:
        self.path = path
        self._fd = fd
        self._store_id = record.store_id
        self.seq = record.seq
        self._counter = counter

    @classmethod
    def read(cls, path: Path) -> tuple[WitnessRecord, int] | None:
        """The newest intact record and its write counter; None if there is no witness.
        Raises ValueError if the file exists but holds no intact record."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        best: tuple[int, int, bytes] | None = None
        for i in (0, 1):
            raw = data[i * cls._SLOT_SIZE : i * cls._SLOT_SIZE + cls._SLOT.size]
            if len(raw) < cls._SLOT.size:
                continue
            magic, counter, seq, sid, crc = cls._SLOT.unpack(raw)
            if magic != cls._MAGIC or zlib.crc32(raw[:-4]) != crc:
                continue
            if best is None or counter > best[0]:
                best = (counter, seq, sid)
        if best is None:
            raise ValueError(f"neither of its two records is intact ({len(data)} bytes)")
        counter, seq, sid = best
        return WitnessRecord(sid.hex(), seq), counter

    @classmethod
    def create(cls, path: Path, record: WitnessRecord) -> Witness:
        """Write a fresh witness atomically (temporary file, fsync, rename, fsync the folder)."""
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            body = cls._slot(0, record) + cls._slot(1, record)
            os.pwrite(fd, body, 0)
            os.fsync(fd)
            os.rename(tmp, path)
            _fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, record, 1)

    @classmethod
    def open(cls, path: Path, record: WitnessRecord, counter: int) -> Witness:
        return cls(path, os.open(path, os.O_RDWR | os.O_CLOEXEC), record, counter)

    @classmethod
    def _slot(cls, counter: int, record: WitnessRecord) -> bytes:
        head = cls._SLOT.pack(cls._MAGIC, counter, record.seq, bytes.fromhex(record.store_id), 0)
        raw = head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))
        return raw.ljust(cls._SLOT_SIZE, b"\0")

    def update(self, seq: int, *, sync: bool) -> None:
        self._counter += 1
        slot = self._slot(self._counter, WitnessRecord(self._store_id, seq))
        os.pwrite(self._fd, slot, (self._counter % 2) * self._SLOT_SIZE)
        if sync:
            os.fsync(self._fd)
        self.seq = seq

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True)
class _Found:
    """What the read-only inspection found in a database that may be opened."""

    kind: str  # "new" (blank), "legacy" (a store from before the witness) or "ours"
    store_id: str | None
    job: str | None
    last_seq: int
    witness_counter: int  # -1: the witness must be (re)written


class _Damage(Exception):
    """Why a store may not be opened; `accept` is set when the database itself is sound and
    only its history is in doubt, so that on_damage="accept-older" may start from it."""

    def __init__(self, what: str, accept: _Found | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.accept = accept


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def unsafe_directory(
    directory: Path, st: os.stat_result, uid: int | None = None, gid: int | None = None
) -> str | None:
    """Why `directory` (whose stat is `st`) may not hold a store for the user `uid` with the
    group `gid` (default: this process's effective ones), or None if it may.

    Refused: a directory another user owns (root aside), and one others or its group can
    write, sticky bit or not: a sticky bit keeps others from renaming the store's files but
    not from making its `-wal`, `-shm` or `.witness` file before the master does. Accepted
    as group-writable: a directory root owns whose group is the master's own, for a master
    not running as root, which is what Kubernetes makes of a volume with fsGroup (and
    runAsGroup) 10001: there the group is the pod's. (A directory of the master's own user
    it can make private itself.)"""
    uid = os.geteuid() if uid is None else uid
    gid = os.getegid() if gid is None else gid
    mode = stat.S_IMODE(st.st_mode)
    what = f"store directory {directory} (mode {mode:04o}, owner {_user(st.st_uid)})"
    if st.st_uid not in (uid, 0):
        return (
            f"{what} belongs to another user, who could rename, replace or delete the "
            f"store's files: choose another --store, in a directory {_user(uid)} owns"
        )
    platform_group = uid != 0 and st.st_uid == 0 and st.st_gid == gid  # a volume for a group
    if mode & 0o002 or (mode & 0o020 and not platform_group):
        who = "others" if mode & 0o002 else f"its group (gid {st.st_gid})"
        could = "rename, replace or delete the store's files"
        if mode & stat.S_ISVTX:  # they cannot rename what is not theirs, but can make it first
            could = "make the store's files (-wal, -shm, .witness) before the master does"
        return (
            f"{what} can be written by {who}, who could {could}: chmod 700 {directory}, "
            "or choose another --store"
        )
    return None


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
        self._lock_fd: int | None = None
        self._lock_key: tuple[int, int] | None = None
        self._witness: Witness | None = None
        self._witness_failed = False
        self._wal_found = False
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
            self._take_file_lock()
            try:
                self._conn = self._open()
            except BaseException:
                self._release()
                raise
        return self._conn

    def _take_file_lock(self) -> None:
        while True:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(self.path)
                with _held_lock:
                    if (st.st_dev, st.st_ino) in _held:
                        raise self._in_use("this process")
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _flock_holder(os.fstat(fd))
                os.close(fd)
                raise self._in_use(f"pid {holder}") from None
            # Between open and flock the name may have been moved aside by a master that held
            # the lock: then this descriptor is not the store any more; start over.
            mine = os.fstat(fd)
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                with _held_lock:
                    _held.add((mine.st_dev, mine.st_ino))
                self._lock_fd, self._lock_key = fd, (mine.st_dev, mine.st_ino)
                return
            os.close(fd)

    def _in_use(self, holder: str) -> StoreInUseError:
        return StoreInUseError(
            f"store {self.path} is in use by another master ({holder}); two masters must "
            "never share one journal (the lock is on the file itself, whatever path names it)"
        )

    def _release(self) -> None:
        if self._witness is not None:
            with contextlib.suppress(OSError):
                self._witness.close()
            self._witness = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._lock_key is not None:
            with _held_lock:
                _held.discard(self._lock_key)
            self._lock_key = None

    def _open(self) -> sqlite3.Connection:
        try:
            found = self._inspect()
        except _Damage as damage:
            if self._on_damage == "move-aside":
                self._move_aside(damage.what)
                try:
                    found = self._inspect()
                except _Damage as again:
                    raise StoreDamagedError(self._refusal(again)) from None
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
                raise StoreDamagedError(self._refusal(damage)) from None
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

    def _inspect(self) -> _Found:
        """Check the files without writing anything; raise _Damage if they may not be used."""
        try:
            got = Witness.read(self.witness_path)
            witness_error = None
        except (ValueError, OSError) as exc:
            got, witness_error = None, str(exc)
        # Seen before SQLite opens the database: opening may create an empty -wal file.
        try:
            self._wal_found = os.stat(f"{self.path}-wal").st_size > 0
        except FileNotFoundError:
            self._wal_found = False
        uri = f"file:{quote(str(self.path))}?mode=ro"
        ro = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            return self._inspect_db(ro, got, witness_error)
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorname", "") not in _DAMAGE_CODES:
                raise
            raise _Damage(
                f"is not a readable SQLite database ({exc}): it is damaged, or not a store"
            ) from None
        finally:
            ro.close()

    def _inspect_db(
        self,
        ro: sqlite3.Connection,
        got: tuple[WitnessRecord, int] | None,
        witness_error: str | None,
    ) -> _Found:
        witness, counter = got if got is not None else (None, -1)
        check = str(ro.execute("PRAGMA quick_check").fetchone()[0])
        if check != "ok":
            raise _Damage(f"fails SQLite's integrity check ({check.splitlines()[0]})")
        app_id = int(ro.execute("PRAGMA application_id").fetchone()[0])
        version = int(ro.execute("PRAGMA user_version").fetchone()[0])
        tables = {
            str(name): {str(c[1]) for c in ro.execute(f"PRAGMA table_info({name!r})")}
            for (name,) in ro.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if app_id not in (0, APPLICATION_ID):
            raise _Damage(
                f"is an SQLite database of another program (application_id {app_id:#010x}), "
                "not a chunkmaster store"
            )
        if app_id == 0 and not tables:
            return self._empty(witness, witness_error, counter)
        if app_id == 0:
            legacy = (
                _COLUMNS["meta"] <= tables.get("meta", set())
                and ro.execute(
                    "SELECT 1 FROM meta WHERE key = 'format' AND value = ?", (_LEGACY_FORMAT,)
                ).fetchone()
            )
            if not legacy:
                raise _Damage(
                    f"is an SQLite database of another program (tables {sorted(tables)}), "
                    "not a chunkmaster store"
                )
        elif version > FORMAT_VERSION:
            raise _Damage(
                f"was written by a newer chunkmaster (store format {version}; this one reads "
                f"up to {FORMAT_VERSION}): run that newer version"
            )
        missing = [t for t, cols in _COLUMNS.items() if not cols <= tables.get(t, set())]
        if missing:
            raise _Damage(
                f"lacks its {', '.join(missing)} table{'s' if len(missing) > 1 else ''} "
                "(dropped or damaged)"
            )
        meta = {str(k): str(v) for k, v in ro.execute("SELECT key, value FROM meta")}
        db_job = meta.get("job")
        if self.job is not None and db_job is not None and db_job != self.job:
            raise _Damage(
                f"belongs to job {db_job!r}, not to job {self.job!r}: check --job and --store"
            )
        snap = ro.execute("SELECT seq FROM snapshot WHERE id = 0").fetchone()
        top = ro.execute("SELECT max(seq) FROM journal").fetchone()[0]
        last_seq = max(int(snap[0]) if snap else 0, int(top) if top is not None else 0)
        if app_id == 0:
            return _Found("legacy", None, db_job, last_seq, -1)
        store_id = meta.get("store_id")
        if store_id is None:
            raise _Damage("has no store id in its meta table (the table was altered)")
        return self._witnessed(_Found("ours", store_id, db_job, last_seq, -1), got, witness_error)

    def _empty(
        self, witness: WitnessRecord | None, witness_error: str | None, counter: int
    ) -> _Found:
        """An empty database: a new store, unless its witness says it held entries."""
        if witness is not None and witness.seq > 0:
            raise _Damage(
                f"holds no journal ({self.path.stat().st_size} bytes), but the store had "
                f"made entry {witness.seq} durable (its witness {self.witness_path.name} "
                f"says so): the database file was truncated or replaced, or {self._wal_hint()}"
            )
        if witness_error is not None:
            raise _Damage(
                f"is empty and its witness {self.witness_path} is damaged "
                f"({witness_error}), so nothing shows whether the store held data"
            )
        sid = witness.store_id if witness is not None else None
        return _Found("new", sid, None, 0, counter if witness is not None else -1)

    def _witnessed(
        self,
        sound: _Found,
        got: tuple[WitnessRecord, int] | None,
        witness_error: str | None,
    ) -> _Found:
        """A sound store of ours, held to its witness: the same store, and all of it."""
        store_id, last_seq = sound.store_id, sound.last_seq
        witness, counter = got if got is not None else (None, -1)
        if witness_error is not None:
            raise _Damage(f"has a damaged witness {self.witness_path} ({witness_error})", sound)
        if witness is None:
            raise _Damage(
                f"has no witness {self.witness_path} beside it: the database was moved or "
                "copied without it, so nothing shows whether it is complete",
                sound,
            )
        if witness.store_id != store_id:
            raise _Damage(
                f"is the database of another store (id {store_id}) than its witness "
                f"{self.witness_path} (id {witness.store_id}): a file from another job or "
                "machine was copied in",
                sound,
            )
        if last_seq < witness.seq:
            raise _Damage(
                f"holds entries up to {last_seq} only, but the store had made entry "
                f"{witness.seq} durable: {self._wal_hint()}, or the database was copied back "
                "from an older backup",
                sound,
            )
        return _Found("ours", store_id, sound.job, last_seq, counter)

    def _wal_hint(self) -> str:
        name = f"{self.path.name}-wal"
        if not self._wal_found:
            return f"its {name} file is missing (a backup or copy that took only the .db?)"
        return f"its {name} file is damaged or truncated"

    def _refusal(self, damage: _Damage) -> str:
        name = self.path.name
        ways = [
            f"restore {name} together with its {name}-wal and {name}.witness files from a "
            "backup (or a data checkpoint) taken with the master stopped"
        ]
        if damage.accept is not None:
            ways.append(
                "if you put an older copy back on purpose, start with "
                "--store-on-damage=accept-older to continue from what it holds"
            )
        ways.append(
            "or start fresh with --store-on-damage=move-aside: the store's files are renamed "
            f"to {name}.damaged-<time>* (nothing is deleted) and the master starts empty"
        )
        return (
            f"store {self.path} {damage.what}. The master will not start from it (it would "
            f"start empty or at an older state). To go on: {'; '.join(ways)}."
        )

    def _move_aside(self, why: str) -> None:
        """Rename every file of the store out of the way (keeping SQLite's naming, so the
        moved database still opens with its -wal), then lock a fresh file at the path."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{self.path.name}.damaged-{stamp}")
        n = 1
        while any(Path(f"{aside}{s}").exists() for s in ("", "-wal", ".witness")):
            n += 1
            aside = self.path.with_name(f"{self.path.name}.damaged-{stamp}-{n}")
        for suffix in ("-wal", "-shm", ".witness", ""):
            with contextlib.suppress(FileNotFoundError):
                os.rename(f"{self.path}{suffix}", f"{aside}{suffix}")
        _fsync_dir(self.path.parent)
        log.warning(
            "store %s %s; moved its files aside to %s* (on_damage=move-aside) and starting "
            "with an empty store",
            self.path,
            why,
            aside,
        )
        self._release()
        self._take_file_lock()

    def _prepare(self, conn: sqlite3.Connection, found: _Found) -> None:
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
        conn.execute("BEGIN IMMEDIATE")
        try:
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
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        self._last_seq = found.last_seq
        self._witness.update(found.last_seq, sync=True)
        if found.kind == "legacy":
            log.info(
                "store %s: upgraded to format %d (store id %s)", self.path, FORMAT_VERSION, store_id
            )

    def _set_meta(self, conn: sqlite3.Connection, values: dict[str, str]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", values.items()
            )
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

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
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("INSERT INTO journal (seq, entry) VALUES (?, ?)", entries)
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            self._note_durable(entries[-1][0])

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
                _rollback(conn)
                raise

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


def folder_problem(path: Path) -> str | None:
    """Why a store file at `path` could not be made or written beside (SQLite adds its journal
    files next to it), in words naming the folder at fault; None if nothing is known to be
    wrong. The OS's own word for a folder that is a file is "File exists"."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the store makes the missing folders: its nearest one counts
    if not folder.is_dir():
        return f"{folder} is a file, not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the directory {folder} is not writable by this user"
    return None


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo an open transaction, keeping the error that caused it: SQLite may already have
    rolled back (a full disk does), and a failing ROLLBACK must not hide the real cause."""
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flock_holder(st: os.stat_result) -> str:
    """The pid holding a flock on this inode, from /proc/locks (Linux); "unknown" elsewhere."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return "unknown"
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; queued waiters carry "->"
        if len(parts) < 6 or parts[1] != "FLOCK" or "->" in parts:
            continue
        try:
            major, minor, ino = parts[5].split(":")
            if (int(major, 16), int(minor, 16), int(ino)) == (
                os.major(st.st_dev),
                os.minor(st.st_dev),
                st.st_ino,
            ):
                return parts[4]
        except ValueError:
            continue
    return "unknown"
