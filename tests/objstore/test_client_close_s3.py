"""Client.close() mid-pass of an s3:// dataset joins the read-ahead workers too (they fetch
the next chunks' byte ranges): when it returns, no thread of the client is left
(docs/client.md, "Threads and performance"; the other ways to close:
tests/client/test_client_close.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from helpers.closing import assert_all_ended, close_within, track_calls
from helpers.s3_server import S3Server
from test_master_s3 import master_with_options, upload_dataset

from chunkmaster.client import Client, Reading


def test_close_mid_pass_joins_the_read_ahead_workers(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    urls = upload_dataset(s3, tmp_path, files=3, records=200, prefix="train")
    m = master_with_options(tmp_path, s3, "--chunk-per-task", "2")
    calls = track_calls(monkeypatch)
    try:
        # fsspec's own event loop thread lives as long as the process: started before
        s3.fs().ls("data")
        before = set(threading.enumerate())
        client = Client(m.addr, reading=Reading(storage_options=s3.storage_options(), read_ahead=4))
        client.set_dataset(urls)
        client.start_get_records(0)
        for _ in range(30):
            client.next_record(timeout=60)
        assert any(t.name == "read-ahead" for t in threading.enumerate()), "no read-ahead"
        close_within(client)
        assert_all_ended(before, calls)
    finally:
        m.kill()
