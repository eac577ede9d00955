"""A thin asyncio etcd v3 connection over aetcd's generated gRPC stubs.

Why not `aetcd.Client` itself: we need TLS (it only opens insecure channels), several endpoints
with fail-over, a deadline on every call (a watch's creation included), one watch stream per
watch (so a broken stream fails only its own watcher), and errors mapped to `StoreError`. aetcd
still provides the protobuf messages and stubs; this module only adds the policy around them.

Every call either returns or raises a `StoreError` subclass within its timeout:
`EtcdUnavailable` (transport, including "etcd is down"), `EtcdTimeout`, `EtcdCompacted` (a watch
asked for history that was compacted) or plain `EtcdRequestError` (the server refused). The
one wait without a deadline is a watch waiting for its next event (`EtcdWatch.next`): nothing
may happen for hours; a server that hangs or vanishes meanwhile is caught by gRPC keepalive
(`options.CHANNEL_OPTIONS`: a ping every 10 s, 5 s to answer), which ends the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from chunkmaster.etcd.options import CHANNEL_OPTIONS, Endpoint, EtcdOptions
from chunkmaster.etcd.protocol import aetcd_rpc
from chunkmaster.store.base import StoreError

_EOF: Any = getattr(grpc.aio, "EOF")  # noqa: B009  (missing from grpc-stubs)

log = logging.getLogger(__name__)


class EtcdUnavailable(StoreError):
    """No etcd endpoint could be reached (or the connection broke mid-call)."""


class EtcdTimeout(StoreError):
    """An etcd call did not finish within its deadline."""


class EtcdRequestError(StoreError):
    """etcd answered with an error (bad request, quota exceeded, permission...)."""


class EtcdCompacted(StoreError):
    """A watch asked for revisions that etcd has compacted away."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"etcd revision compacted (oldest available {compact_revision})")
        self.compact_revision = compact_revision


def _map_error(exc: grpc.aio.AioRpcError, target: str) -> StoreError:
    code = exc.code()
    text = f"etcd {target}: {code.name}: {exc.details()}"
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return EtcdUnavailable(text)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return EtcdTimeout(text)
    return EtcdRequestError(text)


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved: no "exception was never retrieved" noise


async def _guarded(call: Any, aw: Any, timeout: float | None) -> Any:
    """Await one gRPC step so that cancellation and timeouts are prompt and never lost.

    grpc.aio can swallow a task cancellation that lands just as a call completes (the call
    then returns normally and the task runs on), and cancelling a task blocked in a stream
    read can stall until the next message. So the step runs in its own future; on
    cancellation or timeout we cancel the call (or that future) and leave at once.
    """
    fut = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({fut}, timeout=timeout)
    except asyncio.CancelledError:
        (call or fut).cancel()
        fut.add_done_callback(_consume)
        raise
    if not done:
        (call or fut).cancel()
        fut.add_done_callback(_consume)
        raise TimeoutError
    return fut.result()


class EtcdWatch:
    """One watch on its own gRPC stream. `next()` returns the next batch of events."""

    def __init__(self, call: Any, target: str, timeout: float) -> None:
        self._call = call
        self._target = target
        self._timeout = timeout
        self.watch_id = 0

    async def _read(self, timeout: float | None) -> Any:
        try:
            resp = await _guarded(self._call, self._call.read(), timeout)
        except TimeoutError as exc:
            raise EtcdTimeout(f"etcd {self._target}: watch did not answer") from exc
        except grpc.aio.AioRpcError as exc:
            raise _map_error(exc, self._target) from exc
        if resp is _EOF:
            raise EtcdUnavailable(f"etcd {self._target}: watch stream ended")
        if resp.compact_revision:
            raise EtcdCompacted(int(resp.compact_revision))
        if resp.canceled:
            raise EtcdRequestError(f"etcd {self._target}: watch canceled: {resp.cancel_reason}")
        return resp

    async def _start(self, request: Any) -> None:
        try:
            await _guarded(self._call, self._call.write(request), self._timeout)
        except TimeoutError as exc:
            raise EtcdTimeout(f"etcd {self._target}: watch create timed out") from exc
        except grpc.aio.AioRpcError as exc:
            raise _map_error(exc, self._target) from exc
        resp = await self._read(self._timeout)
        if not resp.created:
            raise EtcdRequestError(f"etcd {self._target}: unexpected first watch response")
        self.watch_id = int(resp.watch_id)

    async def next(self) -> list[Any]:
        """Wait (without limit: a hung server is caught by gRPC keepalive) for events."""
        while True:
            resp = await self._read(None)
            if resp.events:
                return list(resp.events)

    def cancel(self) -> None:
        self._call.cancel()


class EtcdConnection:
    """A connection to one of several etcd endpoints, with fail-over and per-call deadlines.

    Must be used from one event loop (gRPC aio channels are bound to the loop that made them);
    the channel is created lazily on the first call.
    """

    def __init__(self, options: EtcdOptions, *, timeout: float = 5.0) -> None:
        self.options = options
        self.endpoints = options.endpoints
        self.timeout = timeout
        self._user = options.user
        self._index = 0
        self._channel: grpc.aio.Channel | None = None
        self._stubs: dict[str, Any] = {}
        self._metadata: tuple[tuple[str, str], ...] | None = None
        self._channel_gen = 0
        self._closed = False
        self._connect_lock: asyncio.Lock | None = None

    @property
    def current(self) -> Endpoint:
        return self.endpoints[self._index]

    def describe(self) -> str:
        return self.options.describe()

    async def _ensure(self) -> int:
        """Open a channel to the current endpoint (and log in) if there is none."""
        if self._closed:
            raise EtcdUnavailable("etcd connection is closed")
        if self._channel is not None:
            return self._channel_gen
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._channel is not None:
                return self._channel_gen
            ep = self.current
            if self.options.secure(ep):
                creds = self.options.credentials()
                channel = grpc.aio.secure_channel(ep.target, creds, CHANNEL_OPTIONS)
            else:
                channel = grpc.aio.insecure_channel(ep.target, CHANNEL_OPTIONS)
            stubs = {
                "kv": aetcd_rpc.KVStub(channel),
                "lease": aetcd_rpc.LeaseStub(channel),
                "watch": aetcd_rpc.WatchStub(channel),
                "maintenance": aetcd_rpc.MaintenanceStub(channel),
                "auth": aetcd_rpc.AuthStub(channel),
            }
            metadata = None
            if self._user is not None:
                req = aetcd_rpc.AuthenticateRequest(name=self._user, password=self.options.password)
                try:
                    resp = await stubs["auth"].Authenticate(req, timeout=self.timeout)
                except grpc.aio.AioRpcError as exc:
                    await channel.close(None)
                    raise _map_error(exc, ep.target) from exc
                metadata = (("token", str(resp.token)),)
            self._channel, self._stubs, self._metadata = channel, stubs, metadata
            self._channel_gen += 1
            return self._channel_gen

    async def _connected(self, timeout: float) -> int:
        """The current channel generation, connecting first if needed.

        Not `asyncio.wait_for`: on Python 3.11 it can swallow a cancellation that arrives as
        the inner call completes, and a background task would then never stop.
        """
        if self._channel is not None and not self._closed:
            return self._channel_gen
        return int(await _guarded(None, self._ensure(), timeout))

    def _drop_channel(self, gen: int, rotate: bool) -> None:
        """Forget a broken channel (once, even if several calls saw it break) and maybe rotate."""
        if gen != self._channel_gen or self._channel is None:
            return
        channel, self._channel, self._stubs = self._channel, None, {}
        if rotate:
            self._index = (self._index + 1) % len(self.endpoints)
        # Let in-flight calls on the old channel fail on their own; close it in the background.
        task = asyncio.get_running_loop().create_task(channel.close(grace=1.0))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def unary(
        self, stub: str, method: str, request: Any, timeout: float | None = None
    ) -> Any:
        """Call one unary RPC within `timeout`, failing over to other endpoints on UNAVAILABLE.

        At most one attempt per endpoint (two with a single endpoint, to ride over a stale
        channel after an etcd restart), so an unreachable etcd is reported quickly.
        """
        budget = self.timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        attempts = max(2, len(self.endpoints))
        reauthed = False
        last: StoreError | None = None
        for attempt in range(attempts + 1):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            target = self.current.target
            try:
                gen = await self._connected(remaining)
                remaining = deadline - loop.time()
                fn = getattr(self._stubs[stub], method)
                call = fn(request, timeout=max(remaining, 0.001), metadata=self._metadata)
                return await _guarded(call, call, None)
            except TimeoutError as exc:
                raise EtcdTimeout(f"etcd {target}: {method} timed out") from exc
            except grpc.aio.AioRpcError as exc:
                err = _map_error(exc, target)
                code = exc.code()
                if code == grpc.StatusCode.UNAVAILABLE and attempt < attempts - 1:
                    last = err
                    self._drop_channel(gen, rotate=len(self.endpoints) > 1)
                    continue
                if code == grpc.StatusCode.UNAUTHENTICATED and self._user and not reauthed:
                    reauthed = True  # the token expired: log in again once
                    self._drop_channel(gen, rotate=False)
                    continue
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    self._drop_channel(gen, rotate=len(self.endpoints) > 1)
                raise err from exc
            except StoreError as exc:  # from _ensure (login failed)
                last = exc
                break
        raise last or EtcdTimeout(f"etcd {self.current.target}: {method} timed out")

    # --- KV ---------------------------------------------------------------------------------

    async def range(
        self, key: bytes, range_end: bytes = b"", *, timeout: float | None = None, **kw: Any
    ) -> Any:
        req = aetcd_rpc.RangeRequest(key=key, range_end=range_end, **kw)
        return await self.unary("kv", "Range", req, timeout)

    async def get(self, key: bytes) -> Any | None:
        """The KeyValue at `key` (with `.value`, `.create_revision`, ...), or None."""
        resp = await self.range(key)
        return resp.kvs[0] if resp.kvs else None

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> Any:
        req = aetcd_rpc.PutRequest(key=key, value=value, lease=lease)
        return await self.unary("kv", "Put", req)

    async def delete(self, key: bytes, range_end: bytes = b"") -> Any:
        req = aetcd_rpc.DeleteRangeRequest(key=key, range_end=range_end)
        return await self.unary("kv", "DeleteRange", req)

    async def txn(
        self,
        compare: Sequence[Any],
        success: Sequence[Any],
        failure: Sequence[Any] = (),
        timeout: float | None = None,
    ) -> Any:
        req = aetcd_rpc.TxnRequest(compare=compare, success=success, failure=failure)
        return await self.unary("kv", "Txn", req, timeout)

    async def compact(self, revision: int, physical: bool = False) -> None:
        req = aetcd_rpc.CompactionRequest(revision=revision, physical=physical)
        await self.unary("kv", "Compact", req)

    # --- leases -----------------------------------------------------------------------------

    async def lease_grant(self, ttl: int) -> int:
        resp = await self.unary("lease", "LeaseGrant", aetcd_rpc.LeaseGrantRequest(TTL=ttl))
        if resp.error:
            raise EtcdRequestError(f"lease grant failed: {resp.error}")
        return int(resp.ID)

    async def lease_keepalive(self, lease_id: int, timeout: float | None = None) -> int:
        """Refresh once; returns the new TTL, 0 when the lease no longer exists."""
        budget = self.timeout if timeout is None else timeout
        gen = await self._connected(budget)
        target = self.current.target
        call = self._stubs["lease"].LeaseKeepAlive(metadata=self._metadata)
        try:
            async with asyncio.timeout(budget):
                req = aetcd_rpc.LeaseKeepAliveRequest(ID=lease_id)
                await _guarded(call, call.write(req), None)
                resp = await _guarded(call, call.read(), None)
        except TimeoutError as exc:
            raise EtcdTimeout(f"etcd {target}: lease keepalive timed out") from exc
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self._drop_channel(gen, rotate=len(self.endpoints) > 1)
            raise _map_error(exc, target) from exc
        finally:
            call.cancel()
        if resp is _EOF:
            raise EtcdUnavailable(f"etcd {target}: keepalive stream ended")
        return int(resp.TTL)

    async def lease_revoke(self, lease_id: int, timeout: float | None = None) -> None:
        req = aetcd_rpc.LeaseRevokeRequest(ID=lease_id)
        await self.unary("lease", "LeaseRevoke", req, timeout)

    # --- maintenance --------------------------------------------------------------------------

    async def status(self) -> Any:
        return await self.unary("maintenance", "Status", aetcd_rpc.StatusRequest())

    async def alarms(self) -> list[int]:
        """Active alarm types (aetcd_rpc.NOSPACE, ...), across members."""
        req = aetcd_rpc.AlarmRequest(action=aetcd_rpc.AlarmRequest.GET, alarm=aetcd_rpc.NONE)
        resp = await self.unary("maintenance", "Alarm", req)
        return [int(a.alarm) for a in resp.alarms]

    # --- watch ------------------------------------------------------------------------------

    async def watch(
        self,
        key: bytes,
        range_end: bytes = b"",
        start_revision: int = 0,
        prev_kv: bool = False,
    ) -> EtcdWatch:
        """Open a watch on its own stream; raises (e.g. EtcdCompacted) if it cannot start."""
        gen = await self._connected(self.timeout)
        target = self.current.target
        call = self._stubs["watch"].Watch(metadata=self._metadata)
        watch = EtcdWatch(call, target, self.timeout)
        create = aetcd_rpc.WatchCreateRequest(
            key=key, range_end=range_end, start_revision=start_revision, prev_kv=prev_kv
        )
        try:
            await watch._start(aetcd_rpc.WatchRequest(create_request=create))
        except BaseException as exc:
            watch.cancel()
            if isinstance(exc, EtcdUnavailable | EtcdTimeout):
                self._drop_channel(gen, rotate=len(self.endpoints) > 1)
            raise
        return watch

    async def close(self) -> None:
        self._closed = True
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close(None)


async def get_key(client: Any, key: str | bytes, timeout: float) -> bytes | None:
    """Read one key's value with a deadline; works with `EtcdConnection` and `aetcd.Client`."""
    raw = key.encode() if isinstance(key, str) else key
    try:
        async with asyncio.timeout(timeout):
            kv = await client.get(raw)
    except TimeoutError as exc:
        raise StoreError(f"reading {raw!r} from etcd timed out after {timeout}s") from exc
    return None if kv is None else bytes(kv.value)
