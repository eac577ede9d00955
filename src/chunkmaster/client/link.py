"""Calling the master from trainer threads, through crashes, restarts and moves.

Every call has a deadline (the connection's). A failure the answers table says to reconnect
on (answers.Act.RECONNECT: transport failures, UnavailableError) drops the channel, waits with
exponential backoff and full jitter, and tries again on a fresh channel: to the same address
(a master restarted in place) or to wherever etcd now says the master is. Waits are logged
through a WaitLog. Cancellation (a pass abandoned, the client closed) interrupts both the
backoff sleep and a call in flight.
"""

from __future__ import annotations

import gc
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import grpc

from chunkmaster.client.answers import Act, meaning
from chunkmaster.client.connection import (
    DEFAULT_TIMEOUT,
    PLAIN,
    UNREACHABLE_ADVICE,
    CallCancelled,
    ChannelSecurity,
    MasterConnection,
    TransportError,
)
from chunkmaster.client.errors import NeverConnectedError, StartupTimeoutError, duration
from chunkmaster.core.errors import MasterError
from chunkmaster.waitlog import WaitLog

log = logging.getLogger("chunkmaster.client")

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

LOG_EVERY = 10.0
"""Seconds between "still waiting" log lines of one wait."""

NEVER_CONNECTED_REMINDERS = (60.0, 120.0, 240.0, 480.0, 1080.0)
"""Seconds after the "never connected" warning when it is said again (then every 10 min): an
address that never answered is most likely wrong, and the first warning said what to check."""


DEFAULT_STARTUP_TIMEOUT = 300.0
"""Seconds a client may take to get started (Connection.startup_timeout): a wrong address or a
master with no dataset raises then, rather than leaving a trainer silent for ever."""

STARTUP_LOGS = 4
"""Within a start-up bound, a wait is logged at least this often (a 2 s bound: every 0.5 s)."""


def _reminder_at(n: int, bound: float | None = None) -> float:
    """When the `n`-th "still never connected" reminder is due, in seconds after the first;
    within a start-up `bound`, at least STARTUP_LOGS times in it."""
    last = len(NEVER_CONNECTED_REMINDERS) - 1
    if n <= last:
        at = NEVER_CONNECTED_REMINDERS[n]
    else:
        at = NEVER_CONNECTED_REMINDERS[last] + 600.0 * (n - last)
    return at if bound is None else min(at, (n + 1) * bound / STARTUP_LOGS)


class Startup:
    """The bound on getting started (Connection.startup_timeout): from the client's first
    need of the master (`begin()`) until it has what it needs to read, a master that
    answered (`connected`) with a dataset (`dataset`). Waits normal mid-run are not bounded
    here: once started, this bounds nothing."""

    def __init__(self, bound: float | None, address: Callable[[], str | None]) -> None:
        self.bound = bound
        self._address = address
        self._lock = threading.Lock()
        self.began: float | None = None
        self.connected = False
        self.dataset = False

    def begin(self) -> float:
        """When the start began (now, the first time)."""
        with self._lock:
            if self.began is None:
                self.began = time.monotonic()
            return self.began

    def over(self, now: float) -> bool:
        """Whether the bound has passed without the client having started."""
        if self.bound is None or (self.connected and self.dataset):
            return False
        return now - self.begin() >= self.bound

    def log_every(self, usual: float) -> float:
        """Seconds between the log lines of a start-up wait: `usual`, or more often within
        a short bound."""
        return usual if self.bound is None else min(usual, self.bound / STARTUP_LOGS)

    def poll(self, wait: float) -> float:
        """Seconds a task request may wait at the master (`wait`, a long poll): less within a
        short bound until started, so that the wait is logged and given up on in time."""
        if self.bound is None or self.dataset:
            return wait
        return min(wait, self.bound / STARTUP_LOGS)

    def no_dataset(self, now: float) -> StartupTimeoutError:
        """The error of a master that answers but has had no dataset for the whole bound."""
        return StartupTimeoutError(
            f"the master at {self._address()} has no dataset after "
            f"{duration(now - self.begin())} of asking it for tasks: no trainer called "
            "set_dataset and its store holds none (give one: Client.set_dataset(), "
            "Loader(dataset=...), chunkmaster read --dataset), or one is still indexing its "
            "files (that takes a longer bound); gave up after "
            f"Connection(startup_timeout={self.bound:g}) (None: wait for ever)"
        )


class Cancelled(Exception):
    """The operation was cancelled by its owner (pass abandoned, client closed)."""


class Locator(Protocol):
    """What the link needs from service discovery (chunkmaster.etcd.discovery.MasterLocator)."""

    @property
    def key(self) -> bytes: ...

    def current(self) -> str | None: ...

    def wait_for_address(self, timeout: float) -> str | None: ...

    def close(self) -> None: ...


class Awaited(Protocol[T_co]):
    """An answer in flight that another thread may cancel: a long-polling GetTask
    (connection.PendingCall) or a message on the session stream (stream.Reply)."""

    def result(self) -> T_co: ...

    def cancel(self) -> None: ...


class CancelToken:
    """A cancellation flag that can also abort the one RPC currently attached to it.

    Tokens form a tree: cancelling a parent (the client) cancels its children (passes).
    """

    def __init__(self, parent: CancelToken | None = None) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._call: Awaited[Any] | None = None
        self._children: list[CancelToken] = []
        if parent is not None:
            with parent._lock:
                parent._children.append(self)
                cancelled = parent.cancelled
            if cancelled:
                self.cancel()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            call, self._call = self._call, None
            children = list(self._children)
        if call is not None:
            call.cancel()
        for child in children:
            child.cancel()

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake at once and raise Cancelled if cancelled meanwhile."""
        if self._event.wait(seconds):
            raise Cancelled()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled()

    def run(self, call: Awaited[T]) -> T:
        """Wait for `call`, cancelling it if this token is (or gets) cancelled."""
        with self._lock:
            if self._event.is_set():
                call.cancel()
                raise Cancelled()
            self._call = call
        try:
            return call.result()
        except CallCancelled:
            raise Cancelled() from None
        finally:
            with self._lock:
                if self._call is call:
                    self._call = None


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff with full jitter (spreads reconnecting trainers over time)."""
    return random.uniform(0.0, min(cap, base * (2**attempt)))  # jitter, not crypto


class MasterLink:
    """The trainer's single way to the master: one channel at a time, replaced on failure."""

    def __init__(
        self,
        addr: str | None = None,
        locator: Locator | None = None,
        *,
        rpc_timeout: float = DEFAULT_TIMEOUT,
        retry_timeout: float | None = None,
        backoff_base: float = 0.05,
        backoff_max: float = 2.0,
        security: ChannelSecurity = PLAIN,
        startup_timeout: float | None = None,
    ) -> None:
        if (addr is None) == (locator is None):
            raise ValueError("give exactly one of addr and locator")
        self._addr = addr
        self._locator = locator
        self.rpc_timeout = rpc_timeout
        self.retry_timeout = retry_timeout
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.security = security
        self._lock = threading.Lock()
        self._conn: MasterConnection | None = None
        self._made: list[MasterConnection] = []  # every channel opened, for wait_closed()
        self._closed = False
        self._reached = False  # a master has answered (anything) on this link
        self._never_warned: float | None = None  # when "never connected" was first said
        self._reminders = 0
        self.startup = Startup(startup_timeout, lambda: self.address)

    @property
    def address(self) -> str | None:
        """The address currently used (or about to be)."""
        if self._locator is not None:
            return self._locator.current()
        return self._addr

    def call(
        self,
        what: str,
        fn: Callable[[MasterConnection], T],
        cancel: CancelToken,
        deadline: float | None = None,
    ) -> T:
        """Run `fn(connection)`, retrying transport failures until it answers or is cancelled.

        The master's own errors (other than UnavailableError) propagate at once: they are
        answers, not failures. Raises Cancelled, or the last failure after `retry_timeout` or
        once the `deadline` (time.monotonic()) has passed; NeverConnectedError once a master
        never reached has not answered for the start-up bound (`Startup`).
        """
        began = self.startup.begin()
        waits = WaitLog(log, what, LOG_EVERY)
        attempt = 0
        while True:
            cancel.check()
            conn = self._connection(cancel, what)
            try:
                result = fn(conn)
            except Exception as exc:
                if meaning(exc).reach is not Act.RECONNECT:
                    if isinstance(exc, MasterError):
                        self._answered(conn.addr)
                    raise
                cancel.check()  # a cancelled call shows up as a transport error: not a failure
                cancel.sleep(self._failed(exc, conn, waits, attempt, began, deadline))
                attempt += 1
                continue
            lasted = waits.over()
            if self._answered(conn.addr) and lasted is not None:
                log.warning("%s: master at %s answers again after %.1fs", what, conn.addr, lasted)
            return result

    def _failed(
        self,
        exc: Exception,
        conn: MasterConnection,
        waits: WaitLog,
        attempt: int,
        began: float,
        deadline: float | None,
    ) -> float:
        """A call failed on its way (`exc`): the seconds to back off before the next try.
        Raises `exc`, or NeverConnectedError, once the retries' time is up."""
        now = time.monotonic()
        never = isinstance(exc, TransportError) and not self._reached
        if isinstance(exc, TransportError):  # the next attempt dials afresh
            with self._lock:
                if self._conn is conn:
                    self._conn = None
            conn.close()
        else:
            self._reached = self.startup.connected = True  # its store fails for now
        if never:  # said once for the link (every call fails alike), then less often
            assert isinstance(exc, TransportError)
            self._never_connected(exc, now)
        why = f"{exc}; retrying with backoff"
        if never:  # said by _never_connected
            waits.wait("failing", why, every=math.inf, first=None)
        else:
            waits.wait("failing", why)
        startup_over = never and self.startup.over(now)
        out_of_time = (
            self.retry_timeout is not None and now - waits.since >= self.retry_timeout
        ) or (deadline is not None and now >= deadline)
        if out_of_time or startup_over:
            if never:
                assert isinstance(exc, TransportError)
                bound = self.startup.bound if startup_over else None
                raise NeverConnectedError(exc, now - began, bound) from None
            raise exc
        delay = backoff_delay(attempt, self.backoff_base, self.backoff_max)
        if deadline is not None:
            delay = min(delay, deadline - now)
        if never and self.startup.bound is not None:  # give up on time
            delay = min(delay, max(0.0, began + self.startup.bound - now))
        return delay

    def _never_connected(self, exc: TransportError, now: float) -> None:
        """Say that the address never answered, and what to check: once for the link, then
        at NEVER_CONNECTED_REMINDERS."""
        with self._lock:
            first = self._never_warned
            if first is None:
                self._never_warned = now
            elif now - first >= _reminder_at(self._reminders, self.startup.bound):
                self._reminders += 1
            else:
                return
        if first is None:
            log.warning(
                "never connected to %s (%s): %s; retrying",
                exc.addr,
                exc.cause,
                UNREACHABLE_ADVICE,
            )
        else:
            log.warning(
                "still never connected to %s after %s (%s); retrying",
                exc.addr,
                duration(now - first),
                exc.cause,
            )

    def _answered(self, addr: str) -> bool:
        """Note that the master answered; False the first time after "never connected" was
        said (which is then followed by "connected", once)."""
        with self._lock:
            if self._reached:
                return True
            self._reached = True
            self.startup.connected = True
            warned = self._never_warned
        if warned is not None:
            log.warning("connected to %s after %s", addr, duration(time.monotonic() - warned))
            return False
        return True

    def _connection(self, cancel: CancelToken, what: str) -> MasterConnection:
        addr = self._addr if self._locator is None else self._await_address(cancel, what)
        with self._lock:
            if self._closed:
                raise Cancelled()
            conn = self._conn
            if conn is not None and conn.addr != addr:
                log.warning("master moved from %s to %s; reconnecting", conn.addr, addr)
                conn.close()
                conn = None
            if conn is None:
                assert addr is not None
                conn = self._conn = MasterConnection(
                    addr, timeout=self.rpc_timeout, security=self.security
                )
                made = [c for c in self._made if not c.ended or c.live_calls()]
                self._made = [*made, conn]
            return conn

    def _await_address(self, cancel: CancelToken, what: str) -> str:
        """The address etcd holds now; waits (logging why) while there is none."""
        locator = self._locator
        assert locator is not None
        addr = locator.current()
        if addr:
            return addr
        key = locator.key.decode(errors="replace")
        waits = WaitLog(log, what, self.startup.log_every(LOG_EVERY))
        why = f"no master address at {key} in etcd; waiting for one"
        waits.wait("no address", why)
        deadline = None if self.retry_timeout is None else waits.since + self.retry_timeout
        bound = self.startup.bound
        if bound is not None and not self._reached:  # not started yet: its bound holds too
            end = self.startup.begin() + bound
            deadline = end if deadline is None else min(deadline, end)
        while True:
            cancel.check()
            addr = locator.wait_for_address(0.2)
            if addr:
                return addr
            if deadline is not None and time.monotonic() >= deadline:
                raise TransportError("etcd", _NoAddress(f"no master address at {key} in etcd"))
            waits.wait("no address", why)

    def close(self) -> None:
        """Close the channel; calls in flight on it fail and see their cancellation."""
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def wait_closed(self, deadline: float) -> list[str]:
        """After close(), once the threads that used the calls are joined: wait (until
        `deadline`, time.monotonic()) for gRPC's threads to be done with every call of every
        channel this link opened, and see that no call object is left for the garbage
        collector to delete at interpreter exit (connection.MasterConnection says why): one
        kept alive by a reference cycle (an exception's traceback) is collected now. Returns
        what is still going at the deadline, or still alive."""
        with self._lock:
            made, self._made = self._made, []
        left = [what for conn in made for what in conn.wait_closed(deadline)]
        for generation in range(3):  # the young first: most cycles are recent
            if not any(conn.live_calls() for conn in made):
                break
            gc.collect(generation)
        alive = sum(conn.live_calls() for conn in made)
        if alive:
            left.append(f"{alive} gRPC call object(s) still referenced")
        return left


class _NoAddress(grpc.RpcError):
    """Stands in for the gRPC error that TransportError expects when there is no address."""
