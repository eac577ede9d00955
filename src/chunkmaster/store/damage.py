"""Whether a SQLite store's files may be opened: a damaged store must never pass for an empty
or an older one, and SQLite alone cannot tell.

A database whose `-wal` file is missing, garbled or truncated, or that was copied back from an
older backup, opens as a valid database at an older state; a truncated file opens as an empty
one. So each store keeps a witness beside it (`witness.py`): the store's random id and the
last entry it made durable. `Inspection.inspect` reads the files through a read-only
connection (so that a damaged `-wal` file is left as it was) and checks SQLite's
`quick_check`, the application_id and format version, the tables, the job name and that the
database holds at least the witness's entry. Any failure raises `Damage`; `refusal` words it
for the user with the ways out, and `move_aside` is the way out that starts afresh.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from chunkmaster.store.witness import Witness, WitnessRecord, fsync_dir

log = logging.getLogger("chunkmaster.store")

APPLICATION_ID = 0x434D4A31  # "CMJ1" in the SQLite header: this file is a chunkmaster journal
FORMAT_VERSION = 2  # PRAGMA user_version of the files a store writes
LEGACY_FORMAT = "chunkmaster-journal-1"  # meta.format of format-1 stores, which have no witness

COLUMNS = {
    "journal": {"seq", "entry"},
    "snapshot": {"id", "seq", "data"},
    "meta": {"key", "value"},
}
_DAMAGE_CODES = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}


@dataclass(frozen=True)
class Found:
    """What the read-only inspection found in a database that may be opened."""

    kind: str  # "new" (blank), "legacy" (a format-1 store, without a witness) or "ours"
    store_id: str | None
    job: str | None
    last_seq: int
    witness_counter: int  # -1: the witness must be (re)written


class Damage(Exception):
    """Why a store may not be opened; `accept` is set when the database itself is sound and
    only its history is in doubt, so that on_damage="accept-older" may start from it."""

    def __init__(self, what: str, accept: Found | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.accept = accept


def _tables(ro: sqlite3.Connection) -> dict[str, set[str]]:
    return {
        str(name): {str(c[1]) for c in ro.execute(f"PRAGMA table_info({name!r})")}
        for (name,) in ro.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }


def _check_format(ro: sqlite3.Connection, app_id: int, tables: dict[str, set[str]]) -> None:
    """Damage unless the database is a chunkmaster store in a format this version reads, with
    all its tables: ours (`app_id` set) or a legacy store (app_id 0 and the legacy format)."""
    if app_id == 0:
        legacy = (
            COLUMNS["meta"] <= tables.get("meta", set())
            and ro.execute(
                "SELECT 1 FROM meta WHERE key = 'format' AND value = ?", (LEGACY_FORMAT,)
            ).fetchone()
        )
        if not legacy:
            raise Damage(
                f"is an SQLite database of another program (tables {sorted(tables)}), "
                "not a chunkmaster store"
            )
    else:
        version = int(ro.execute("PRAGMA user_version").fetchone()[0])
        if version > FORMAT_VERSION:
            raise Damage(
                f"was written by a newer chunkmaster (store format {version}; this one reads "
                f"up to {FORMAT_VERSION}): run that newer version"
            )
    missing = [t for t, cols in COLUMNS.items() if not cols <= tables.get(t, set())]
    if missing:
        raise Damage(
            f"lacks its {', '.join(missing)} table{'s' if len(missing) > 1 else ''} "
            "(dropped or damaged)"
        )


class Inspection:
    """The checks of one store's files (`path` and its witness) before it is opened for
    writing; `job`, when given, must be the job the store was created for."""

    def __init__(self, path: Path, witness_path: Path, job: str | None) -> None:
        self.path = path
        self.witness_path = witness_path
        self.job = job
        self.wal_found = False

    def inspect(self) -> Found:
        """Check the files without writing anything; raise Damage if they may not be used."""
        try:
            got = Witness.read(self.witness_path)
            witness_error = None
        except (ValueError, OSError) as exc:
            got, witness_error = None, str(exc)
        # Seen before SQLite opens the database: opening may create an empty -wal file.
        try:
            self.wal_found = os.stat(f"{self.path}-wal").st_size > 0
        except FileNotFoundError:
            self.wal_found = False
        uri = f"file:{quote(str(self.path))}?mode=ro"
        ro = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            return self._check_db(ro, got, witness_error)
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorname", "") not in _DAMAGE_CODES:
                raise
            raise Damage(
                f"is not a readable SQLite database ({exc}): it is damaged, or not a store"
            ) from None
        finally:
            ro.close()

    def _check_db(
        self,
        ro: sqlite3.Connection,
        got: tuple[WitnessRecord, int] | None,
        witness_error: str | None,
    ) -> Found:
        check = str(ro.execute("PRAGMA quick_check").fetchone()[0])
        if check != "ok":
            raise Damage(f"fails SQLite's integrity check ({check.splitlines()[0]})")
        app_id = int(ro.execute("PRAGMA application_id").fetchone()[0])
        tables = _tables(ro)
        if app_id not in (0, APPLICATION_ID):
            raise Damage(
                f"is an SQLite database of another program (application_id {app_id:#010x}), "
                "not a chunkmaster store"
            )
        if app_id == 0 and not tables:
            witness, counter = got if got is not None else (None, -1)
            return self._empty(witness, witness_error, counter)
        _check_format(ro, app_id, tables)
        meta = {str(k): str(v) for k, v in ro.execute("SELECT key, value FROM meta")}
        db_job = meta.get("job")
        if self.job is not None and db_job is not None and db_job != self.job:
            raise Damage(
                f"belongs to job {db_job!r}, not to job {self.job!r}: check --job and --store"
            )
        snap = ro.execute("SELECT seq FROM snapshot WHERE id = 0").fetchone()
        top = ro.execute("SELECT max(seq) FROM journal").fetchone()[0]
        last_seq = max(int(snap[0]) if snap else 0, int(top) if top is not None else 0)
        if app_id == 0:
            return Found("legacy", None, db_job, last_seq, -1)
        store_id = meta.get("store_id")
        if store_id is None:
            raise Damage("has no store id in its meta table (the table was altered)")
        return self._witnessed(Found("ours", store_id, db_job, last_seq, -1), got, witness_error)

    def _empty(
        self, witness: WitnessRecord | None, witness_error: str | None, counter: int
    ) -> Found:
        """An empty database: a new store, unless its witness says it held entries."""
        if witness is not None and witness.seq > 0:
            raise Damage(
                f"holds no journal ({self.path.stat().st_size} bytes), but the store had "
                f"made entry {witness.seq} durable (its witness {self.witness_path.name} "
                f"says so): the database file was truncated or replaced, or {self._wal_hint()}"
            )
        if witness_error is not None:
            raise Damage(
                f"is empty and its witness {self.witness_path} is damaged "
                f"({witness_error}), so nothing shows whether the store held data"
            )
        sid = witness.store_id if witness is not None else None
        return Found("new", sid, None, 0, counter if witness is not None else -1)

    def _witnessed(
        self,
        sound: Found,
        got: tuple[WitnessRecord, int] | None,
        witness_error: str | None,
    ) -> Found:
        """A sound store of ours, held to its witness: the same store, and all of it."""
        store_id, last_seq = sound.store_id, sound.last_seq
        witness, counter = got if got is not None else (None, -1)
        if witness_error is not None:
            raise Damage(f"has a damaged witness {self.witness_path} ({witness_error})", sound)
        if witness is None:
            raise Damage(
                f"has no witness {self.witness_path} beside it: the database was moved or "
                "copied without it, so nothing shows whether it is complete",
                sound,
            )
        if witness.store_id != store_id:
            raise Damage(
                f"is the database of another store (id {store_id}) than its witness "
                f"{self.witness_path} (id {witness.store_id}): a file from another job or "
                "machine was copied in",
                sound,
            )
        if last_seq < witness.seq:
            raise Damage(
                f"holds entries up to {last_seq} only, but the store had made entry "
                f"{witness.seq} durable: {self._wal_hint()}, or the database was copied back "
                "from an older backup",
                sound,
            )
        return Found("ours", store_id, sound.job, last_seq, counter)

    def _wal_hint(self) -> str:
        name = f"{self.path.name}-wal"
        if not self.wal_found:
            return f"its {name} file is missing (a backup or copy that took only the .db?)"
        return f"its {name} file is damaged or truncated"


def refusal(path: Path, damage: Damage) -> str:
    """The StoreDamagedError's text: what is wrong with the store at `path`, and the ways out."""
    name = path.name
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
        f"store {path} {damage.what}. The master will not start from it (it would "
        f"start empty or at an older state). To go on: {'; '.join(ways)}."
    )


def move_aside(path: Path, why: str) -> None:
    """Rename every file of the store at `path` out of the way, keeping SQLite's naming so
    that the moved database still opens with its -wal."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while any(Path(f"{aside}{s}").exists() for s in ("", "-wal", ".witness")):
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    for suffix in ("-wal", "-shm", ".witness", ""):
        with contextlib.suppress(FileNotFoundError):
            os.rename(f"{path}{suffix}", f"{aside}{suffix}")
    fsync_dir(path.parent)
    log.warning(
        "store %s %s; moved its files aside to %s* (on_damage=move-aside) and starting "
        "with an empty store",
        path,
        why,
        aside,
    )
