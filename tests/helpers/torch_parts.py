"""Pieces of PyTorch training loops for the tests, importable by DataLoader workers under any
start method (spawn and forkserver import them by name)."""

from __future__ import annotations

import faulthandler
import json
import time
from typing import Any

import torch


def record_id(record: Any) -> torch.Tensor:
    """A record's number: RecordIO and text records are its digits, JSON Lines and Parquet
    records a dict with an "id"."""
    if isinstance(record, dict):
        return torch.tensor(int(record["id"]))
    if isinstance(record, bytes | str):
        return torch.tensor(int(record))
    raise TypeError(f"no record ID in {record!r}")


def slow_record_id(record: Any) -> torch.Tensor:
    """record_id, slowly: a reader too slow for its training loop."""
    time.sleep(0.005)
    return record_id(record)


def worker_and_head_id(record: Any) -> torch.Tensor:
    """[the record's number in its first 8 bytes (big-endian), the DataLoader worker that
    read it], after 50 ms: a worker as slow as one that decodes a large image (a task of 320
    records takes 16 s, so a trainer that starts a few seconds late still finds tasks)."""
    time.sleep(0.05)
    info = torch.utils.data.get_worker_info()
    return torch.tensor([int.from_bytes(record[:8], "big"), -1 if info is None else info.id])


def dump_on_crash(worker: int) -> None:
    """worker_init_fn: a worker that crashes dumps its Python stacks (stderr)."""
    faulthandler.enable(all_threads=True)


def ids_of(batch: Any) -> list[int]:
    """The record IDs of a batch (a tensor of IDs, or one ID)."""
    if isinstance(batch, torch.Tensor):
        return [int(x) for x in batch.reshape(-1).tolist()]
    return [int(batch)]


def write_jsonl(path: Any, ids: range) -> None:
    with open(path, "w") as f:
        for i in ids:
            f.write(json.dumps({"id": i, "x": [i * 0.5, 1.0]}) + "\n")
