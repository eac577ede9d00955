"""A trainer keeps its local dataset files open across chunks (client/files.py): once per
pass, not once per chunk; never more than its limit; closed at the end of the pass; and a file
replaced or rewritten on disk is never read as the file the master indexed (the job stops)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster

from chunkmaster.client import Client, EndOfPass, TaskReadError
from chunkmaster.client.files import OpenFiles
from chunkmaster.core.errors import JobStoppedError


def _descriptors_of(path: str) -> int:
    """How many descriptors of this process point at `path` (from /proc/self/fd)."""
    target = os.path.realpath(path)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                count += 1
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
    return count


def _read_pass(client: Client, pass_id: int) -> list[bytes]:
    client.start_get_records(pass_id)
    out: list[bytes] = []
    while True:
        try:
            out.append(client.next_record(timeout=60))
        except EndOfPass:
            return out


def test_a_pass_opens_its_file_once_not_once_per_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: one open (stat, open, fstat, close) per chunk, 200 a pass here."""
    path = numbered_records(tmp_path / "d.rio", 200)
    opens: list[str] = []
    real_open = os.open

    def counting_open(name: Any, *args: Any, **kwargs: Any) -> int:
        if os.fspath(name) == path:
            opens.append(path)
        return real_open(name, *args, **kwargs)

    with InProcessMaster(chunks_per_task=1, timeout_dur=60.0) as m, Client(m.addr) as c:
        c.set_dataset([path])  # the master indexes the file before the count starts
        monkeypatch.setattr(os, "open", counting_open)
        for p in range(2):
            got = _read_pass(c, p)
            assert sorted(got) == [b"%06d" % i for i in range(200)]
            # the pass is over: its descriptor is closed
            assert _descriptors_of(path) == 0
    assert len(opens) == 2  # one per pass


@pytest.mark.parametrize("how", ["replaced", "rewritten in place"])
def test_a_file_changed_on_disk_mid_pass_is_not_read_and_the_job_stops(
    tmp_path: Path, how: str
) -> None:
    """Hostile review, item 15: a file regenerated under its name after the master indexed it,
    with the same layout (same record sizes, other records), was read silently, the new records
    taken for the indexed ones. Now the trainer's next chunk of it fails naming the file and
    what changed, nothing is charged to the task (no quarantine), and the job stops: every
    trainer gets JobStoppedError naming the file and what to do. The descriptor held open is
    never read stale either way (a replaced file is a new inode at the path)."""
    path = numbered_records(tmp_path / "d.rio", 40, b"old%03d")
    new = numbered_records(tmp_path / "new.rio", 40, b"new%03d")
    hour_ago = time.time_ns() - 3600 * 10**9
    os.utime(path, ns=(hour_ago, hour_ago))  # generated before the job, as datasets are
    with InProcessMaster(chunks_per_task=1, timeout_dur=60.0) as m, Client(m.addr) as c:
        c.set_dataset([path])
        c.start_get_records(0)
        before = [c.next_record(timeout=60) for _ in range(10)]
        assert _descriptors_of(path) == 1  # held open across the chunks
        if how == "replaced":
            os.replace(new, path)
        else:
            with open(path, "r+b") as f:
                f.write(Path(new).read_bytes())
        assert os.stat(path).st_size == os.stat(tmp_path / "d.rio").st_size  # same layout
        after: list[bytes] = []
        errors: list[str] = []
        with pytest.raises(JobStoppedError) as stopped:
            while True:
                try:
                    after.append(c.next_record(timeout=60))
                except TaskReadError as exc:  # each task of it the trainer held, then the stop
                    errors.append(str(exc))
        assert errors, after
        for text in errors:
            changed = f"dataset file changed after the master indexed it: {path}: modified at"
            assert changed in text, text
            assert "after it was indexed (modified at" in text, text
            assert "restore the files, or start a new job (another --job or --store)" in text
        assert f"{path}: modified at" in str(stopped.value), stopped.value
        assert "restore the files, or start a new job" in str(stopped.value)
        st = m.status()
        assert st["quarantined_tasks"] == [] and st["job_stopped"]["tasks"] == []
        assert f"{path}: modified at" in st["job_stopped"]["message"]
    assert all(r.startswith(b"old") for r in before + after), after  # never the new records


def test_open_files_are_bounded_and_closed(tmp_path: Path) -> None:
    paths = [numbered_records(tmp_path / f"f{i}.rio", 3) for i in range(3)]
    files = OpenFiles(limit=2)
    try:
        for p in paths:
            with files.open(p) as f:
                assert f.read(4)  # a chunk header's first bytes
        assert files.held == 2
        assert sum(_descriptors_of(p) for p in paths) == 2
        # the first was closed to open the third; reading it again reopens it
        first = files.read_ranges(paths[0], [(0, 4)])[0]
        assert first == Path(paths[0]).read_bytes()[:4]
        assert files.opened == 4
        assert _descriptors_of(paths[1]) == 0  # the least recently used went
        os.unlink(paths[2])
        with pytest.raises(FileNotFoundError):
            files.open(paths[2])  # gone: as a fresh open would say; its descriptor closed
        assert files.held == 1 and _descriptors_of(paths[0]) == 1
    finally:
        files.close()
    assert files.held == 0
    assert sum(_descriptors_of(p) for p in paths) == 0


def test_a_fifo_is_refused_as_before(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.rio"
    os.mkfifo(fifo)
    files = OpenFiles()
    with pytest.raises(OSError, match="FIFO"):
        files.open(str(fifo))
    assert files.held == 0
