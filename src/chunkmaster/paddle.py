"""PaddlePaddle v2-style reader creators: `cloud_reader` (through a master) and `recordio` (local).

A reader creator returns a reader: a function that, each time it is called and iterated, runs
one pass and yields `pickle.loads(record)` for every record, as `paddle.v2` trainers expect.
Records of formats that are not bytes (JSON Lines values, text lines, Parquet rows;
docs/formats.md) are yielded as they are: there is nothing to unpickle.

Fixed from the original (paddle/v2/reader/creator.py):
* the pass counter belongs to the reader, not to the process (two readers do not share it, D14);
* `set_dataset` errors and read errors are raised, not printed (D15, D8);
* an empty record is a record, not the end of the pass; records are binary-safe (D9), so any
  pickle protocol works;
* leaving a pass early cancels it instead of leaving a fetcher that feeds the next pass (D19).
"""

from __future__ import annotations

import glob
import pickle
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from chunkmaster.client.client import Client
from chunkmaster.client.options import Connection
from chunkmaster.recordio.scanner import scan

__all__ = ["cloud_reader", "recordio"]

Reader = Callable[[], Iterator[Any]]


def _paths(paths: str | Sequence[str]) -> list[str]:
    """A single string may hold several comma-separated patterns, as in the original."""
    if isinstance(paths, str):
        return [p for p in paths.split(",") if p]
    return list(paths)


def cloud_reader(
    paths: str | Sequence[str],
    etcd_endpoints: str | Sequence[str] | None = None,
    timeout_sec: float = 5,
    buf_size: int | None = None,
    *,
    addr: str | None = None,
    first_pass: int = 0,
    token: str | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> Reader:
    """A reader creator over a master found through etcd (or at `addr`).

    The dataset is set at once (the first trainer's call wins; errors are raised). Each
    iteration of the returned reader is one pass, numbered from `first_pass` (give the
    master's current pass to a restarted trainer so it does not replay finished passes).
    The reader has `close()`; its client is also closed when the reader is collected.
    `token`, `tls_ca`, `tls_cert` and `tls_key` are `chunkmaster.Client`'s (its
    `Connection`). `buf_size`, the original's, did nothing here and is deprecated.
    """
    if buf_size is not None:
        warnings.warn(
            "cloud_reader(buf_size=...) does nothing and is deprecated: remove it (no records "
            "are read ahead; tasks are, as many as the trainer's pace needs)",
            DeprecationWarning,
            stacklevel=2,
        )
    client = Client(
        addr,
        etcd_endpoints=None if addr is not None else etcd_endpoints,
        connection=Connection(
            etcd_timeout=timeout_sec, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
        ),
    )
    try:
        client.set_dataset(_paths(paths))
    except BaseException:
        client.close()
        raise
    next_pass = first_pass

    def reader() -> Iterator[Any]:
        nonlocal next_pass
        pass_id = next_pass  # taken when iteration starts: reader() alone uses no pass
        next_pass += 1
        loads = pickle.loads
        for record in client.records(pass_id):
            yield loads(record) if type(record) is bytes else record

    weakref.finalize(reader, client.close)
    reader.close = client.close  # type: ignore[attr-defined]
    reader.client = client  # type: ignore[attr-defined]
    return reader


def recordio(paths: str | Sequence[str], buf_size: int | None = None) -> Reader:
    """The local twin of cloud_reader: every record of the matching files, unpickled.

    `buf_size`, the original's, does nothing here (reading is chunk-buffered) and is
    deprecated.
    """
    if buf_size is not None:
        warnings.warn(
            "recordio(buf_size=...) does nothing and is deprecated: remove it (reading is "
            "already chunk-buffered)",
            DeprecationWarning,
            stacklevel=2,
        )
    patterns = _paths(paths)

    def reader() -> Iterator[Any]:
        loads = pickle.loads
        for pattern in patterns:
            matches = sorted(glob.glob(pattern)) or [pattern]  # a missing file raises
            for path in matches:
                for record in scan(path):
                    yield loads(record)

    return reader
