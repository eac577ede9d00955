"""The wire of a trainer's session: one Session call's stream and the answers awaited on it.

`SessionStream` is one bidirectional call, with the two threads that use it; `Reply` is the
master's answer to one message, which the thread that sent it waits on (session.py, outbox.py).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from chunkmaster.client.connection import CallCancelled, join_all
from chunkmaster.core.errors import MasterError
from chunkmaster.core.model import Position, Task
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc.wire import error_from_name


def session_error(err: pb.SessionError) -> MasterError:
    """The master's error carried by a SessionError."""
    exc = error_from_name(err.error, err.message)
    return exc if exc is not None else MasterError(f"{err.error}: {err.message}")


def position_to_pb(pos: Position) -> pb.TaskPosition:
    return pb.TaskPosition(
        task_id=pos.task_id, epoch=pos.epoch, pass_id=pos.pass_id, records=pos.records
    )


class Dispatched(list[Task]):
    """Tasks a session got, with its `generation` then: once the session is found lost
    (a new generation), they are someone else's and the buffer refuses them."""

    def __init__(self, tasks: list[Task], generation: int) -> None:
        super().__init__(tasks)
        self.generation = generation


class Reply:
    """The master's answer to one message, awaited by the thread that sent it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._response: pb.SessionResponse | None = None
        self._error: BaseException | None = None
        self.cancelled = False
        self.generation = -1  # the session generation of the stream that answered
        self._callbacks: list[Callable[[], None]] = []

    def on_done(self, fn: Callable[[], None]) -> None:
        """Call `fn`, from the thread that settles this reply and with none of its locks held,
        once the answer, an error or a cancel comes. Not called if that happened already (the
        caller's locks may be held here): check `done` after."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)

    def _settle(
        self,
        response: pb.SessionResponse | None = None,
        error: BaseException | None = None,
        cancelled: bool = False,
    ) -> bool:
        """The answer, an error or a cancel came: the first of them settles it."""
        with self._lock:
            if self._done.is_set():
                return False
            self._response, self._error, self.cancelled = response, error, cancelled
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()
        return True

    def resolve(self, response: pb.SessionResponse) -> bool:
        """Deliver the answer; False if the waiter gave up (cancelled) before it came."""
        return self._settle(response=response)

    def fail(self, exc: BaseException) -> None:
        self._settle(error=exc)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> pb.SessionResponse:
        """The answer; raises the master's error, CallCancelled, or TimeoutError."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"no answer to {self.kind} within {timeout}s")
        with self._lock:
            response, error = self._response, self._error
        if error is not None:
            raise error
        if response is None:
            raise CallCancelled()
        if response.WhichOneof("body") == "error":
            raise session_error(response.error)
        return response

    def cancel(self) -> None:
        self._settle(cancelled=True)


class SessionStream:
    """One Session call: its outgoing queue, the call, the Hello it began with, and the two
    threads that use the call: this session's reader, and gRPC's thread that sends the
    requests, iterating `requests()` (it ends once `end()` ends that iterator).

    A thread still inside the call at interpreter exit can hold the call's lock while the
    finalization freezes it, and the call object's `__del__` then waits for that lock for
    ever (the process never exits): the session's close joins both threads (`join()`)."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.queue: queue.SimpleQueue[pb.SessionRequest | None] = queue.SimpleQueue()
        self.call: Any = None
        self.hello_seq = 0
        self.hello = Reply("Hello")
        self.broken = threading.Event()
        self.sender: threading.Thread | None = None  # gRPC's thread iterating requests()
        self.sending = threading.Event()  # set once that thread has started
        self.reader: threading.Thread | None = None  # the session's thread reading answers
        self.welcomed = False  # a stream that never got its Welcome fails quietly (the link logs)
        self.expired = False
        self.generation = 0  # the session generation when it was opened

    def requests(self) -> Iterator[pb.SessionRequest]:
        self.sender = threading.current_thread()
        self.sending.set()
        while True:
            req = self.queue.get()
            if req is None:
                return
            yield req

    def send(self, req: pb.SessionRequest) -> None:
        self.queue.put(req)

    def end(self) -> None:
        """No more requests: gRPC's sending thread leaves requests() once at the end."""
        self.queue.put(None)

    def close(self) -> None:
        self.end()
        if self.call is not None:
            self.call.cancel()

    def let_go(self) -> bool:
        """Let go of the call once both threads that use it are gone (or never started):
        whether they are. Nothing of the session then holds the call object (an error kept
        in a log record may still hold this stream)."""
        reader, sender = self.reader, self.sender
        if reader is not None and reader.is_alive():
            return False
        if self.call is not None:
            if not self.sending.is_set() or sender is None or sender.is_alive():
                return False
            self.call = None
        return True

    def join(self, deadline: float) -> list[str]:
        """After close(): wait (until `deadline`, time.monotonic()) for the reader and gRPC's
        sending thread to be gone (that one always starts with the call, and leaves once the
        call is cancelled), then let go of the call. The names of those still alive."""
        left = join_all([self.reader], deadline)
        if self.call is not None:
            if not self.sending.wait(max(0.0, deadline - time.monotonic())):
                left.append(f"gRPC's sender of the stream to {self.addr} (not started)")
            left += join_all([self.sender], deadline)
        if not left:
            self.call = None
        return left


class Bounded:
    """A Reply awaited with a timeout, cancellable through a CancelToken."""

    def __init__(self, reply: Reply, timeout: float) -> None:
        self._reply = reply
        self._timeout = timeout

    def result(self) -> pb.SessionResponse:
        return self._reply.result(self._timeout)

    def cancel(self) -> None:
        self._reply.cancel()
