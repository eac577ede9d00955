"""A real master served over real gRPC on loopback, in a background thread of the test process.

Faster to start than a subprocess; used where a test does not kill the master.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from chunkmaster.master.server import MasterServer
from chunkmaster.master.service import Service
from chunkmaster.master.status import Status
from chunkmaster.store.base import Store
from chunkmaster.store.memory import InMemStore

T = TypeVar("T")


class InProcessMaster:
    """`server_options` go to MasterServer (credentials, token); the rest of the keyword
    arguments to the Service (data_roots among them)."""

    def __init__(
        self,
        store: Store | None = None,
        *,
        server_options: dict[str, Any] | None = None,
        **service_kwargs: Any,
    ) -> None:
        self.store = store if store is not None else InMemStore()
        self.service_kwargs = service_kwargs
        self.server_options = dict(server_options or {})
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.service: Service | None = None
        self.server: MasterServer | None = None

    def call(self, fn: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
        """Run a coroutine on the master's loop and wait for its result."""
        fut: Future[T] = asyncio.run_coroutine_threadsafe(_as_coro(fn), self.loop)
        return fut.result(timeout)

    def __enter__(self) -> InProcessMaster:
        self._thread.start()

        async def start() -> None:
            self.service = Service(self.store, **self.service_kwargs)
            await self.service.start()
            self.server = MasterServer(self.service, "127.0.0.1", 0, **self.server_options)
            await self.server.start()

        self.call(start)
        return self

    @property
    def addr(self) -> str:
        assert self.server is not None
        return self.server.address

    def status(self) -> dict[str, Any]:
        assert self.service is not None
        service = self.service

        async def st() -> dict[str, Any]:
            return service.status()

        return self.call(st)

    def status_view(self) -> Status:
        """The status as the master's typed view (Service.status_view)."""
        assert self.service is not None
        service = self.service

        async def st() -> Status:
            return service.status_view()

        return self.call(st)

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            if self.server is not None:
                await self.server.stop(grace=0)
            if self.service is not None:
                await self.service.close()

        try:
            self.call(stop)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


async def _as_coro(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()
