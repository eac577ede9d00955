"""Progress, commits and data checkpoints for every format: a trainer commits part of a pass,
the job's data checkpoint is saved, the whole job dies, and a fresh master restored from the
checkpoint delivers exactly the records that were not committed."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from helpers.formats import MAKERS, SMALL_CHUNKS, digest_of
from helpers.master_process import MasterProcess

from chunkmaster.client import Session
from chunkmaster.client.client import Client
from chunkmaster.digest import Digest


@pytest.mark.parametrize("fmt", sorted(MAKERS))
def test_a_restored_job_delivers_exactly_what_was_not_committed(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHUNKMASTER_CHUNK_SIZE", SMALL_CHUNKS[fmt])  # several chunks a file
    data = tmp_path / "data"
    data.mkdir()
    pattern, records = MAKERS[fmt](data, 2, 60)
    args = ["--chunk-per-task", "1"]
    first = MasterProcess(["--store", str(tmp_path / "first.db"), *args]).start()
    before = Digest()
    try:
        assert first.addr is not None
        with Client(first.addr, name="t", session=Session(report_every=1)) as client:
            client.set_dataset([pattern])
            it = client.records(0)
            for record in itertools.islice(it, 50):  # mid-task: a partial commit too
                before.add(record)
            client.commit()
            blob = client.data_checkpoint()
            for _ in itertools.islice(it, 10):  # read on, never committed
                pass
    finally:
        first.kill()  # the whole job dies
    ckpt = tmp_path / "job.ckpt"
    ckpt.write_bytes(blob)
    second = MasterProcess(
        ["--store", str(tmp_path / "second.db"), "--restore", str(ckpt), *args]
    ).start()
    after = Digest()
    try:
        assert second.addr is not None
        with Client(second.addr, session=True, name="t2") as client:
            for record in client.records(0):
                after.add(record)
    finally:
        second.kill()
    assert before.count == 50
    before.merge(after)
    assert before == digest_of(records)  # every record once: the committed, then the rest
