"""A first training run whose Loader state a test restores (as saved beside a model)."""

from __future__ import annotations

from typing import Any

from chunkmaster.torch import Loader
from helpers.torch_parts import ids_of, record_id


def saved_after(addr: str, data: str, steps: int) -> tuple[list[int], dict[str, Any]]:
    """`steps` batches of 10 records of `data` taken from the master at `addr`: the record
    numbers taken, and the Loader's state_dict() after them."""
    with Loader(addr, dataset=[data], transform=record_id, batch_size=10) as loader:
        it = iter(loader)
        taken = [i for _ in range(steps) for i in ids_of(next(it))]
        return taken, loader.state_dict()
