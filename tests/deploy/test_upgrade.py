"""Upgrades (docs/deploy.md): what an earlier release of chunkmaster left, this one opens.

The slow test (`cluster`, in `make test-cluster`) installs an earlier commit of this
repository, OLD_RELEASE, in a virtualenv of its own (`git archive` of the clone's history, then
`pip install`). Its master runs on an embedded store, or on a real etcd; its trainers (its
`chunkmaster.Client`, `upgrade_trainer.py` run by its python) read a pass and part of the
next, committing, past the master's first snapshot (written after 10,000 journal entries: the
dataset has 6,000 one-chunk tasks); its `chunkmaster checkpoint save` saves a data checkpoint
in the middle; the master is SIGKILLed. Then this version opens the same state and the job
goes on exactly where it was, and it restores the old checkpoint on an empty store the same
way. At the end the old release is given the state this version wrote (and snapshotted): it
refuses it, though not in one line of ours (its traceback names the snapshot's version only).

The quick test checks what is in this version's power: a store, a snapshot, a journal entry or
a data checkpoint of a version newer than it reads is refused in one line naming the versions.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.datasets import write_records
from helpers.deploy import REPO, ensure
from helpers.etcd_server import EtcdServer
from helpers.master_process import MasterProcess

from chunkmaster.core import checkpoint
from chunkmaster.core.codec import (
    READABLE_VERSIONS,
    SNAPSHOT_VERSION,
    decode_event,
    encode_snapshot,
    pack,
    unpack,
)
from chunkmaster.core.master_state import MasterState
from chunkmaster.core.state import apply
from chunkmaster.store.damage import FORMAT_VERSION

#: The earlier release the test installs: 339 commits before this test was written, its
#: snapshots are version 5 (sessions and who holds what), its data checkpoints version 1, its
#: store format 2.
OLD_RELEASE = "469d9ed195e04a45ff802f80c97fe9e0ed632077"
TRAINER = Path(__file__).with_name("upgrade_trainer.py")
TASKS = 6000  # chunks of 2 records, one a task: a pass is 12,000 journal entries at least
RECORDS = [f"r{i:06d}" for i in range(2 * TASKS)]


def old_env() -> dict[str, str]:
    """The environment of the old release's processes: none of this checkout's paths."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def old_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The python of a virtualenv with OLD_RELEASE installed."""
    root = tmp_path_factory.mktemp("old-release")
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", OLD_RELEASE],
        capture_output=True,
        timeout=120,
    )
    if archive.returncode != 0:
        pytest.skip(
            f"the clone has no commit {OLD_RELEASE[:7]} (a shallow clone or an export?): "
            + archive.stderr.decode(errors="replace").strip()
        )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root / "src", filter="data")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(root / "src")],
        capture_output=True,
        text=True,
        timeout=900,
        env=old_env(),
    )
    assert install.returncode == 0, install.stdout + install.stderr
    yield python


def read_pass(python: str, addr: str, dataset: str, pass_id: int, take: int = 0) -> list[str]:
    """The records one trainer read of `pass_id` (at most `take`), all committed."""
    env = old_env() if python != sys.executable else None
    args = ["--addr", addr, "--dataset", dataset, "--pass", str(pass_id), "--take", str(take)]
    proc = subprocess.run(
        [python, str(TRAINER), *args, "--commit-every", "500"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got: list[str] = json.loads(proc.stdout)
    return got


def cli(
    python: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "chunkmaster", *args], capture_output=True, text=True, timeout=120, env=env
    )


def snapshot_version(store: Path) -> int | None:
    with sqlite3.connect(store) as db:
        row = db.execute("SELECT data FROM snapshot WHERE id = 0").fetchone()
    return None if row is None else int(unpack(row[0])[0]["version"])


def status(addr: str) -> dict[str, object]:
    proc = cli(sys.executable, "status", "--addr", addr, "--json")
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def exactly_once(got: list[str], expected: set[str]) -> None:
    assert len(got) == len(set(got)), "a record was read twice"
    assert set(got) == expected, (
        f"{len(expected - set(got))} records not read, {len(set(got) - expected)} read that "
        "were committed before"
    )


@pytest.fixture(params=["sqlite", "etcd"])
def state_args(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """Where both releases keep the job's state: an embedded store, or a real etcd."""
    if request.param == "sqlite":
        store = tmp_path / "store" / "state.db"
        store.parent.mkdir(mode=0o700)
        yield ["--store", str(store)]
        return
    ensure("ensure-etcd.sh")
    with EtcdServer() as etcd:
        yield ["--endpoints", etcd.endpoint, "--job", "upgraded", "--ttl", "3"]


@pytest.mark.cluster
def test_a_store_and_a_data_checkpoint_of_an_earlier_release_go_on_where_they_were(
    old_python: str, state_args: list[str], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    dataset = str(
        write_records(data / "train-0.rio", [r.encode() for r in RECORDS], max_chunk_size=20)
    )
    store = Path(state_args[1]) if state_args[0] == "--store" else None
    args = [*state_args, "--host", "127.0.0.1", "--chunk-per-task", "1"]

    # The old release: a pass and a half, a data checkpoint in the middle, a SIGKILL.
    old = MasterProcess(args, python=old_python, env=old_env()).start(60)
    try:
        assert old.addr is not None
        first = read_pass(old_python, old.addr, dataset, 0)
        assert status(old.addr)["num_tasks"] == TASKS
        exactly_once(first, set(RECORDS))
        before = read_pass(old_python, old.addr, dataset, 1, take=1001)  # ends mid-task
        saved = cli(
            old_python,
            "checkpoint",
            "save",
            "--addr",
            old.addr,
            str(tmp_path / "old.ckpt"),
            env=old_env(),
        )
        assert saved.returncode == 0, saved.stderr
        after = read_pass(old_python, old.addr, dataset, 1, take=1500)
        assert old.wait_log(r"compacted the journal into a \d+-byte snapshot")
    finally:
        old.kill()
    blob = (tmp_path / "old.ckpt").read_bytes()
    assert int.from_bytes(blob[8:12], "little") == 1  # the old checkpoint format
    if store is not None:
        assert snapshot_version(store) == 5  # the old snapshot format (this one writes 6)
    assert len(set(before) | set(after)) == 2501

    # This version on the old store: the pass goes on from the last commits, each record once.
    new = MasterProcess(args).start(60)
    try:
        assert new.addr is not None
        assert new.wait_log(r"recovered state at entry \d+ \(snapshot at \d+ \+ \d+ journal")
        st = status(new.addr)
        assert st["cur_pass"] == 1 and st["commit_floor"] == 1
        ledger = {row["pass"]: row for row in st["ledger"]}  # type: ignore[union-attr]
        assert ledger[0]["committed"] == len(RECORDS) and ledger[1]["committed"] == 2501
        rest = read_pass(sys.executable, new.addr, dataset, 1)
        exactly_once(rest, set(RECORDS) - set(before) - set(after))
        assert status(new.addr)["cur_pass"] == 2
        assert new.wait_log(r"compacted the journal into a \d+-byte snapshot")
    finally:
        new.kill()
    if store is not None:
        assert snapshot_version(store) == SNAPSHOT_VERSION  # this version's

    # The old release on the store this version wrote: refused (a traceback, its last line
    # naming the snapshot's version only: docs/deploy.md quotes it).
    refused = cli(old_python, "master", *args, "--port", "0", env=old_env())
    assert refused.returncode != 0, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        f"chunkmaster.core.codec.CodecError: snapshot version {SNAPSHOT_VERSION} is not supported"
    )

    # This version restores the old data checkpoint on an empty store the same way (the
    # checkpoint's job: on etcd, the job's name).
    fresh = tmp_path / "fresh" / "state.db"
    fresh.parent.mkdir(mode=0o700)
    job = state_args[state_args.index("--job") :][:2] if "--job" in state_args else []
    restore = ["--chunk-per-task", "1", "--restore", str(tmp_path / "old.ckpt")]
    restored = MasterProcess(["--store", str(fresh), *job, *restore]).start(60)
    try:
        assert restored.addr is not None
        assert status(restored.addr)["cur_pass"] == 1
        again = read_pass(sys.executable, restored.addr, dataset, 1)
        exactly_once(again, set(RECORDS) - set(before))
    finally:
        restored.kill()


def newest_master(args: list[str]) -> subprocess.CompletedProcess[str]:
    """This version's master, run until it stops (it should, at once)."""
    return cli(sys.executable, "master", *args, "--port", "0")


def one_line_refusal(proc: subprocess.CompletedProcess[str]) -> str:
    """The master's error: its exit code 1 and one line, the last of its output."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("chunkmaster: error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return last


def test_state_newer_than_this_version_reads_is_refused_in_one_line(tmp_path: Path) -> None:
    """What a newer release may leave: a store format, a snapshot version, a journal entry
    kind and a data checkpoint format this version does not read, each made here by altering
    what this version wrote. The master stops, naming the version found and those it reads."""
    data = tmp_path / "data"
    data.mkdir()
    dataset = str(
        write_records(data / "d.rio", [b"r%03d" % i for i in range(40)], max_chunk_size=30)
    )
    store = tmp_path / "store" / "state.db"
    store.parent.mkdir(mode=0o700)
    master = MasterProcess(["--store", str(store)]).start(60)
    try:
        assert master.addr is not None
        read_pass(sys.executable, master.addr, dataset, 0, take=15)
        saved = cli(
            sys.executable, "checkpoint", "save", "--addr", master.addr, str(tmp_path / "c")
        )
        assert saved.returncode == 0, saved.stderr
    finally:
        assert master.terminate() == 0

    def altered(name: str, change: str) -> Path:
        """A copy of the store, changed by the SQL `change`."""
        copy = tmp_path / name / "state.db"
        copy.parent.mkdir(mode=0o700)
        for suffix in ("", "-wal", "-shm", ".witness"):
            if Path(f"{store}{suffix}").exists():
                copy.with_name(copy.name + suffix).write_bytes(
                    Path(f"{store}{suffix}").read_bytes()
                )
        with sqlite3.connect(copy) as db:
            db.execute(change)
        return copy

    # the store format (SQLite's user_version)
    newer_format = altered("format", f"PRAGMA user_version = {FORMAT_VERSION + 1}")
    line = one_line_refusal(newest_master(["--store", str(newer_format)]))
    assert f"(store format {FORMAT_VERSION + 1}; this one reads up to {FORMAT_VERSION})" in line

    # a snapshot of a newer version: this version's state, its version field raised
    with sqlite3.connect(store) as db:
        entries = db.execute("SELECT seq, entry FROM journal ORDER BY seq").fetchall()
    state = MasterState()
    for _, entry in entries:
        apply(state, decode_event(entry))
    header, blobs = unpack(encode_snapshot(state))
    newer = max(READABLE_VERSIONS) + 1
    snapshot = pack(dict(header, version=newer), blobs).hex()
    newer_snapshot = altered(
        "snapshot",
        f"INSERT OR REPLACE INTO snapshot (id, seq, data) VALUES (0, {entries[-1][0]}, "
        f"X'{snapshot}')",
    )
    line = one_line_refusal(newest_master(["--store", str(newer_snapshot)]))
    assert f"cannot read the job's state in the store {newer_snapshot}: snapshot version " in line
    assert (
        f"{newer} was written by a newer chunkmaster (this chunkmaster reads snapshot versions "
        f"{min(READABLE_VERSIONS)} to {max(READABLE_VERSIONS)})"
    ) in line

    # a journal entry of a kind this version does not know
    newer_entry = altered(
        "entry", f"INSERT INTO journal (seq, entry) VALUES ({entries[-1][0] + 1}, X'01ff00')"
    )
    line = one_line_refusal(newest_master(["--store", str(newer_entry)]))
    assert "a journal entry of a kind this chunkmaster does not know (tag b'\\x01'" in line

    # a data checkpoint of a newer format, restored on an empty store
    blob = bytearray((tmp_path / "c").read_bytes())
    newest = max(checkpoint.VERSIONS) + 1
    blob[8:12] = newest.to_bytes(4, "little")
    blob[-16:] = hashlib.blake2b(bytes(blob[:-16]), digest_size=16).digest()
    (tmp_path / "newer.ckpt").write_bytes(bytes(blob))
    empty = tmp_path / "empty" / "state.db"
    empty.parent.mkdir(mode=0o700)
    line = one_line_refusal(
        newest_master(["--store", str(empty), "--restore", str(tmp_path / "newer.ckpt")])
    )
    assert f"data checkpoint format version {newest} is not supported: this build reads " in line
    versions = ", ".join(map(str, checkpoint.VERSIONS[:-1])) + f" and {checkpoint.VERSIONS[-1]}"
    assert f"reads versions {versions}; restore it with the chunkmaster version" in line
