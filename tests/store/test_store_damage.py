"""A damaged, foreign, older or shared embedded store is refused with a way out (issue 9).

Each case is made the way a user would meet it: a real master process writes the store and is
killed (SIGKILL) or stopped, the files are damaged with the master down, and the next master
must refuse to start, naming the file, what is wrong and what to do; never start empty or at
an older state.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers.aio import run
from helpers.datasets import numbered_records
from helpers.master_process import MasterProcess
from helpers.status_view import status_view

from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.codec import encode_event
from chunkmaster.core.events import Configure
from chunkmaster.core.model import FailedPolicy
from chunkmaster.store.base import StoreDamagedError, StoreInUseError
from chunkmaster.store.sqlite import SqliteStore

FINISHED = 6  # tasks finished (acknowledged) before the master goes down


def populate(
    tmp_path: Path, db: Path, *, stop: str = "kill", extra: Sequence[str] = ()
) -> dict[str, int]:
    """A real master on `db` finishes FINISHED tasks, then is killed (or stopped cleanly)."""
    data = numbered_records(tmp_path / "d.rio", 20, b"%03d")
    master = MasterProcess(["--store", str(db), "--chunk-per-task", "1", *extra]).start()
    try:
        with MasterConnection(master.addr) as c:
            c.set_dataset([data])
            for _ in range(FINISHED):
                t = c.get_task(0)
                assert c.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=0)
            st = c.status()
    finally:
        if stop == "kill":
            master.kill()
        else:
            assert master.terminate() == 0
    return {"done": st["done"], "seq": st["store"]["durable_seq"]}


def start_refused(db: Path, *extra: str, cwd: Path | None = None) -> str:
    """Start a master that must refuse: return its error output."""
    proc = subprocess.run(
        [sys.executable, "-m", "chunkmaster", "master", "--store", str(db), "--port", "0", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    assert proc.returncode != 0, proc.stderr
    assert "serving on" not in proc.stderr
    return proc.stderr


def done_after_restart(db: Path, extra: Sequence[str] = ()) -> int:
    master = MasterProcess(["--store", str(db), *extra]).start()
    try:
        with MasterConnection(master.addr) as c:
            return int(status_view(c.status()).done)
    finally:
        master.kill()


def assert_refusal(err: str, db: Path, *what: str, accept_older: bool | None) -> None:
    """The refusal names the file, what is wrong and the ways out (accept-older only for a
    sound database whose history is in doubt; None: either)."""
    assert f"store {db.resolve()} " in err
    for w in what:
        assert w in err, err
    assert "--store-on-damage=move-aside" in err and "nothing is deleted" in err
    if accept_older is not None:
        assert ("--store-on-damage=accept-older" in err) == accept_older


@pytest.mark.parametrize("sync", ["full", "normal"])
def test_kill_9_then_restart_is_not_mistaken_for_damage(tmp_path: Path, sync: str) -> None:
    db = tmp_path / "state.db"
    extra = ["--store-sync", sync]
    before = populate(tmp_path, db, extra=extra)
    assert Path(f"{db}-wal").stat().st_size > 0  # the entries live in the -wal file
    assert done_after_restart(db, extra) == before["done"] == FINISHED
    assert done_after_restart(db, extra) == FINISHED  # and again, after a second kill


def test_missing_wal_file_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    before = populate(tmp_path, db)
    os.remove(f"{db}-wal")  # a backup or copy that took only the .db
    with pytest.raises(FileNotFoundError):
        os.remove(f"{db}-wal")
    err = start_refused(db)
    assert_refusal(
        err,
        db,
        f"the store had made entry {before['seq']} durable",
        "state.db-wal file is missing",
        accept_older=None,
    )


def test_database_copied_without_its_witness_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    populate(tmp_path, db, stop="term")
    elsewhere = tmp_path / "moved"
    elsewhere.mkdir()
    shutil.copy(db, elsewhere / "state.db")
    err = start_refused(elsewhere / "state.db")
    assert_refusal(err, elsewhere / "state.db", "has no witness", accept_older=True)


def test_database_truncated_to_zero_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    before = populate(tmp_path, db, stop="term")
    os.truncate(db, 0)
    err = start_refused(db)
    assert_refusal(
        err, db, "holds no journal (0 bytes)", f"entry {before['seq']} durable", accept_older=False
    )


def test_database_truncated_to_zero_after_a_kill_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    populate(tmp_path, db)
    os.truncate(db, 0)
    assert_refusal(start_refused(db), db, "durable", accept_older=None)


def test_dropped_journal_table_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    populate(tmp_path, db, stop="term")
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE journal")
    conn.close()
    err = start_refused(db)
    assert_refusal(err, db, "lacks its journal table", accept_older=False)


@pytest.mark.parametrize("how", ["garbled", "truncated"])
def test_damaged_wal_file_is_refused(tmp_path: Path, how: str) -> None:
    db = tmp_path / "state.db"
    before = populate(tmp_path, db)
    wal = Path(f"{db}-wal")
    size = wal.stat().st_size
    assert size > 32 * 1024
    if how == "truncated":
        os.truncate(wal, size // 2)
    else:
        with open(wal, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\xa5" * 4096)
    err = start_refused(db)
    assert_refusal(
        err,
        db,
        f"the store had made entry {before['seq']} durable",
        "state.db-wal file is damaged or truncated",
        accept_older=None,
    )


def test_older_backup_copied_back_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    populate(tmp_path, db, stop="term")
    backup = tmp_path / "backup.db"
    shutil.copy(db, backup)  # a clean stop leaves everything in the .db
    master = MasterProcess(["--store", str(db)]).start()
    try:
        with MasterConnection(master.addr) as c:
            t = c.get_task(0)
            assert c.task_finished(t.meta.id, epoch=t.meta.epoch, pass_id=0)
            newer = status_view(c.status()).store.durable_seq
    finally:
        assert master.terminate() == 0
    shutil.copy(backup, db)
    err = start_refused(db)
    assert_refusal(
        err, db, f"entry {newer} durable", "copied back from an older backup", accept_older=True
    )


def test_garbage_and_foreign_databases_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(8192))
    err = start_refused(junk)
    assert_refusal(err, junk, "is not a readable SQLite database", accept_older=False)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    conn.close()
    assert_refusal(start_refused(other), other, "of another program", accept_older=False)
    app = tmp_path / "app.db"
    with sqlite3.connect(app) as conn:
        conn.execute("PRAGMA application_id = 1234")
        conn.execute("CREATE TABLE journal (seq INTEGER PRIMARY KEY, entry BLOB NOT NULL)")
    conn.close()
    assert_refusal(start_refused(app), app, "application_id 0x000004d2", accept_older=False)


def test_two_masters_never_share_a_store_however_its_path_is_spelled(tmp_path: Path) -> None:
    real_dir = tmp_path / "state"
    real_dir.mkdir()
    db = real_dir / "s.db"
    (tmp_path / "link.db").symlink_to(db)
    (tmp_path / "linkdir").symlink_to(real_dir)
    first = MasterProcess(["--store", str(db)]).start()
    try:
        pid = first.proc.pid if first.proc is not None else -1
        os.link(db, tmp_path / "hard.db")
        spellings = [
            (str(tmp_path / "link.db"), None),
            (str(tmp_path / "hard.db"), None),
            (f"{real_dir}/./s.db", None),
            (str(tmp_path / "linkdir" / "s.db"), None),
            ("s.db", real_dir),
            ("state/../state/s.db", tmp_path),
        ]
        for path, cwd in spellings:
            err = start_refused(Path(path), cwd=cwd)
            assert "is in use by another master" in err, (path, err)
            assert f"pid {pid}" in err, (path, err)
        assert first.running
    finally:
        first.kill()


# ---- the store's own API: job names, other stores, the ways out ------------------------


async def write(store: SqliteStore, n: int) -> int:
    rec = await store.load()
    seq = rec.entries[-1][0] if rec.entries else rec.snapshot_seq
    entry = encode_event(Configure(3, FailedPolicy.RETRY))
    await store.save([(seq + i + 1, entry) for i in range(n)])
    return seq + n


async def last_seq(store: SqliteStore) -> int:
    rec = await store.load()
    await store.shutdown()
    return rec.entries[-1][0] if rec.entries else rec.snapshot_seq


def test_a_store_of_another_job_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "s.db"

    async def main() -> None:
        a = SqliteStore(db, job="alpha")
        await write(a, 3)
        await a.shutdown()
        with pytest.raises(StoreDamagedError, match="belongs to job 'alpha', not to job 'beta'"):
            await SqliteStore(db, job="beta").load()
        assert await last_seq(SqliteStore(db, job="alpha")) == 3
        assert await last_seq(SqliteStore(db)) == 3  # no job given: no check

    run(main())


def test_a_database_of_another_store_is_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a.db", tmp_path / "b.db"

    async def main() -> None:
        for path in (a, b):
            s = SqliteStore(path)
            await write(s, 2)
            await s.shutdown()
        shutil.copy(b, a)
        with pytest.raises(StoreDamagedError, match="database of another store") as err:
            await SqliteStore(a).load()
        assert "a file from another job or machine was copied in" in str(err.value)

    run(main())


def test_move_aside_keeps_every_file_and_starts_empty(tmp_path: Path) -> None:
    db = tmp_path / "s.db"

    async def main() -> None:
        s = SqliteStore(db)
        await write(s, 4)
        await s.shutdown()
        os.truncate(db, 0)
        with pytest.raises(StoreDamagedError):
            await SqliteStore(db).load()
        assert await last_seq(SqliteStore(db, on_damage="move-aside")) == 0
        moved = sorted(p.name for p in tmp_path.iterdir() if ".damaged-" in p.name)
        assert len(moved) == 2 and moved[0].startswith("s.db.damaged-")
        assert moved[1] == moved[0] + ".witness"
        assert await last_seq(SqliteStore(db)) == 0  # the fresh store is sound

    run(main())


def test_move_aside_leaves_a_sound_store_alone(tmp_path: Path) -> None:
    db = tmp_path / "s.db"

    async def main() -> None:
        s = SqliteStore(db)
        await write(s, 4)
        await s.shutdown()
        assert await last_seq(SqliteStore(db, on_damage="move-aside")) == 4
        assert not [p for p in tmp_path.iterdir() if ".damaged-" in p.name]

    run(main())


def test_accept_older_continues_from_a_backup_put_back_on_purpose(tmp_path: Path) -> None:
    db = tmp_path / "s.db"

    async def main() -> None:
        s = SqliteStore(db)
        await write(s, 4)
        await s.shutdown()
        shutil.copy(db, tmp_path / "backup")
        s = SqliteStore(db)
        await write(s, 5)
        await s.shutdown()
        shutil.copy(tmp_path / "backup", db)
        with pytest.raises(StoreDamagedError, match="holds entries up to 4 only"):
            await SqliteStore(db).load()
        with pytest.raises(StoreDamagedError):  # not for a store that is not sound
            junk = tmp_path / "junk.db"
            junk.write_bytes(b"x" * 4096)
            await SqliteStore(junk, on_damage="accept-older").load()
        assert await last_seq(SqliteStore(db, on_damage="accept-older")) == 4
        assert await last_seq(SqliteStore(db)) == 4  # the witness follows it from now on

    run(main())


def test_a_store_from_before_the_witness_is_adopted(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(
            """
            PRAGMA journal_mode=WAL;
            CREATE TABLE journal (seq INTEGER PRIMARY KEY, entry BLOB NOT NULL);
            CREATE TABLE snapshot (
                id INTEGER PRIMARY KEY CHECK (id = 0), seq INTEGER NOT NULL, data BLOB NOT NULL);
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            INSERT INTO meta (key, value) VALUES ('format', 'chunkmaster-journal-1');
            """
        )
        entry = encode_event(Configure(3, FailedPolicy.RETRY))
        conn.executemany("INSERT INTO journal VALUES (?, ?)", [(1, entry), (2, entry)])
    conn.close()

    async def main() -> None:
        s = SqliteStore(db, job="j")
        assert await write(s, 1) == 3
        await s.shutdown()
        assert Path(f"{db}.witness").exists()
        assert await last_seq(SqliteStore(db, job="j")) == 3

    run(main())


def test_a_second_store_in_one_process_is_refused_without_breaking_the_first(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.db"

    async def main() -> None:
        first = SqliteStore(db)
        await write(first, 2)
        with pytest.raises(StoreInUseError, match="in use by another master"):
            await SqliteStore(tmp_path / "." / "s.db").load()
        assert await write(first, 1) == 3
        await first.shutdown()

    run(main())


def test_refusal_is_one_error_line_and_move_aside_starts_fresh(tmp_path: Path) -> None:
    """From the command line: a refusal is a message, not a traceback, and the named way out
    (--store-on-damage=move-aside) starts an empty master and keeps the damaged files."""
    db = tmp_path / "state.db"
    populate(tmp_path, db)
    os.remove(f"{db}-wal")
    err = start_refused(db)
    assert "Traceback" not in err
    assert done_after_restart(db, ["--store-on-damage", "move-aside"]) == 0
    assert list(tmp_path.glob("state.db.damaged-*")), sorted(p.name for p in tmp_path.iterdir())
