"""A master's Service started in the test's own event loop (no gRPC, no thread)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from chunkmaster.master.service import Service
from chunkmaster.store.base import Store
from chunkmaster.store.memory import InMemStore


@contextlib.asynccontextmanager
async def started_service(
    store: Store | None = None, *, data: Sequence[str] = (), **settings: Any
) -> AsyncIterator[Service]:
    """A started Service on `store` (in memory by default) with `data` as its dataset, if
    any; closed after. `settings`: Service's keywords (chunks_per_task, clock, ...)."""
    svc = Service(store if store is not None else InMemStore(), **settings)
    await svc.start()
    try:
        if data:
            await svc.set_dataset(list(data))
        yield svc
    finally:
        await svc.close()
