"""One gRPC channel to one master address, with the master's errors raised as exceptions.

No retries here: the Client layers reconnection and backoff on top. Every call has a
deadline, so nothing in this module can block forever.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import grpc

from chunkmaster.core.errors import MasterError
from chunkmaster.core.model import Task, TaskMeta
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc import master_pb2_grpc as pb_grpc
from chunkmaster.rpc.wire import error_from_rpc, task_from_pb
from chunkmaster.tokens import environment_token, given_token

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
DATASET_TIMEOUT = 600.0
"""SetDataset's default deadline: indexing ten thousand files on a network filesystem is slow."""


@dataclass(frozen=True)
class ChannelSecurity:
    """What a trainer shows the master: a token, and TLS (the CA that signs the master's
    certificate, and for mutual TLS the trainer's own certificate and key), as PEM bytes."""

    token: str | None = field(default=None, repr=False)
    tls: bool = False
    ca: bytes | None = None
    cert: bytes | None = field(default=None, repr=False)
    key: bytes | None = field(default=None, repr=False)

    @classmethod
    def load(
        cls,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> ChannelSecurity:
        """Read the files (paths); without a token, the environment's (the file
        CHUNKMASTER_TOKEN_FILE names, or CHUNKMASTER_TOKEN: chunkmaster.tokens), as the
        master takes it. TLS is on once a CA or a client certificate is given. ValueError
        names a bad file, variable or token."""
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together (the client's certificate)")
        token = environment_token() if token is None else given_token(token)
        return cls(
            token=token,
            tls=tls_ca is not None or tls_cert is not None,
            ca=None if tls_ca is None else _read(tls_ca, "TLS CA"),
            cert=None if tls_cert is None else _read(tls_cert, "TLS certificate"),
            key=None if tls_key is None else _read(tls_key, "TLS key"),
        )

    @property
    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        return None if self.token is None else (("authorization", f"Bearer {self.token}"),)

    def channel(self, addr: str, options: list[tuple[str, Any]]) -> grpc.Channel:
        """A channel to `addr`: over TLS if asked for, plain otherwise."""
        if not self.tls:
            return grpc.insecure_channel(addr, options=options)
        creds = grpc.ssl_channel_credentials(self.ca, self.key, self.cert)
        return grpc.secure_channel(addr, creds, options=options)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path}: {exc.strerror}") from None


PLAIN = ChannelSecurity()


class TransportError(Exception):
    """The master could not be reached or did not answer in time (retry, maybe elsewhere)."""

    def __init__(self, addr: str, exc: grpc.RpcError) -> None:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        name = code.name if code is not None else "ERROR"
        super().__init__(f"master at {addr}: {name}: {details}")
        self.addr = addr
        self.code = code
        self.details = details

    @property
    def cause(self) -> str:
        """Why the master could not be reached, in a few words a person can act on (gRPC's
        own text is one long line of nested causes)."""
        text = self.details or ""
        if self.code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return "no answer in time"
        for needle, words in _CAUSES:
            if needle in text:
                return words
        last = text.rsplit("last error: ", 1)[-1]
        return last.rsplit(": ", 1)[-1][:120] or "no answer"


#: Pieces of gRPC's error texts, and what they mean to the person who typed the address.
_CAUSES = (
    ("Connection refused", "connection refused"),
    ("Domain name not found", "no such host"),
    ("errors resolving", "the host name does not resolve"),
    ("CERTIFICATE_VERIFY_FAILED", "TLS: its certificate is not signed by the CA given"),
    ("WRONG_VERSION_NUMBER", "TLS handshake failed: does the master serve TLS?"),
    ("Tls handshake failed", "TLS handshake failed"),
    ("Socket closed", "the connection was closed at once: does the master want TLS?"),
    ("http1.x server", "an HTTP server answers there, not a master"),
    ("No route to host", "no route to host"),
    ("Network is unreachable", "network unreachable"),
)

#: What to check when a master was never reached (client log lines, `status`, `read`).
UNREACHABLE_ADVICE = (
    "check the host and port (is a master serving there?) and whether it wants TLS or a token"
)


def join_all(threads: Iterable[threading.Thread | None], deadline: float) -> list[str]:
    """Join `threads` (None, threads never started and the calling thread skipped) until
    `deadline` (time.monotonic()); the names of those still alive then."""
    here = threading.current_thread()
    left = []
    for t in threads:
        if t is None or t is here or t.ident is None:
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            left.append(t.name)
    return left


class CallCancelled(Exception):
    """A call was cancelled from another thread (the pass was abandoned or the client closed)."""


def _closed_channel(addr: str) -> TransportError:
    return TransportError(addr, grpc.RpcError("channel closed"))


class PendingCall(Generic[T]):
    """An RPC in flight that another thread may cancel, e.g. a long-polling GetTask.

    Once answered it lets go of the call object, and the error it raises neither chains nor
    holds it: an error kept (in a log record, say) must not keep a call alive (see
    MasterConnection)."""

    def __init__(self, addr: str, future: Any, convert: Callable[[Any], T]) -> None:
        self._addr = addr
        self._future: Any = future
        self._convert = convert

    def result(self) -> T:
        """Wait for the answer (bounded by the call's deadline); raise like a sync call."""
        reply, error = _outcome(self._addr, self._future)
        self._future = None
        if error is not None:
            raise error
        return self._convert(reply)

    def cancel(self) -> None:
        """Abandon the call: `result()` raises CallCancelled, the master stops waiting."""
        future = self._future
        if future is not None:
            future.cancel()


def _outcome(addr: str, future: Any) -> tuple[Any, Exception | None]:
    """A finished call's answer, or the error to raise for it (made here, raised by the
    caller: not chained to the call's own error)."""
    try:
        return future.result(), None
    except grpc.FutureCancelledError:
        return None, CallCancelled()
    except grpc.RpcError as exc:
        if future.cancelled():
            return None, CallCancelled()
        err: MasterError | None = error_from_rpc(exc)
        return None, err if err is not None else TransportError(addr, exc)


class MasterConnection:
    """One channel to the master at `addr`, and the calls made on it.

    The calls that gRPC drives from threads of its own (Session streams, long-polling
    GetTasks) are tracked until gRPC's thread has handled their last event: `close()` ends
    them and `wait_closed()` waits for that thread. A call object must not outlive that wait
    in a reference cycle: the garbage collector may then delete it while the interpreter
    finalizes, and its `__del__` waits for the call's lock, which a gRPC thread frozen by the
    finalization may hold (the process never exits)."""

    def __init__(
        self,
        addr: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        security: ChannelSecurity = PLAIN,
    ) -> None:
        self.addr = addr
        self.timeout = timeout
        self._metadata = security.metadata
        self._channel = security.channel(
            addr,
            [
                ("grpc.keepalive_time_ms", 10_000),
                ("grpc.keepalive_timeout_ms", 5_000),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 2_000),
            ],
        )
        self._stub = pb_grpc.MasterStub(self._channel)  # type: ignore[no-untyped-call]
        self._cond = threading.Condition()
        self._calls: list[weakref.ref[Any]] = []  # the tracked calls (see the class)
        self._running = 0  # tracked calls whose last event gRPC has not handled yet
        self._spinners: set[threading.Thread] = set()  # gRPC's threads that handled them
        self._closed = False

    def _track(self, call: Any) -> None:
        """Follow `call` until gRPC's thread has handled its last event (its status), noting
        that thread: the done callback runs in it, after the call's lock is released."""
        creator = threading.current_thread()

        def over(_: Any) -> None:
            with self._cond:
                self._running -= 1
                here = threading.current_thread()
                if here is not creator:  # not already over when it was tracked
                    self._spinners = {t for t in self._spinners if t.is_alive()} | {here}
                self._cond.notify_all()

        with self._cond:
            self._calls = [r for r in self._calls if r() is not None] + [weakref.ref(call)]
            self._running += 1
        call.add_done_callback(over)

    def _call(self, method: str, request: Any, timeout: float) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            err: MasterError | None = error_from_rpc(exc)
            if err is not None:
                raise err from None
            raise TransportError(self.addr, exc) from None
        except ValueError:  # "Cannot invoke RPC on closed channel!": another thread closed it
            raise _closed_channel(self.addr) from None

    def set_dataset(
        self,
        globs: Sequence[str],
        timeout: float = DATASET_TIMEOUT,
        sources: Sequence[pb.Source] = (),
    ) -> None:
        request = pb.SetDatasetRequest(globs=list(globs), sources=list(sources))
        self._call("SetDataset", request, timeout)

    def set_weights(
        self,
        points: Sequence[pb.WeightPoint],
        mode: str = "step",
        add: Sequence[pb.Source] = (),
        timeout: float | None = None,
    ) -> tuple[int, int, int]:
        """A mixture's weights from now on, with the sources `add` added first (indexed: give
        a `timeout` as set_dataset's): (pass, unit, records planned) where they took effect."""
        request = pb.SetWeightsRequest(points=list(points), mode=mode, add=list(add))
        reply = self._call("SetWeights", request, timeout or self.timeout)
        return int(reply.pass_id), int(reply.unit), int(reply.records)

    def get_task(
        self, pass_id: int, *, wait: float = 0.0, worker: str = "", request_id: str = ""
    ) -> Task:
        request = pb.GetTaskRequest(
            pass_id=pass_id, wait_seconds=wait, worker=worker, request_id=request_id
        )
        reply = self._call("GetTask", request, wait + self.timeout)
        return task_from_pb(reply.task)

    def get_task_async(
        self, pass_id: int, *, wait: float = 0.0, worker: str = "", request_id: str = ""
    ) -> PendingCall[Task]:
        """Start a GetTask that another thread can cancel (a long poll must not pin a pass)."""
        request = pb.GetTaskRequest(
            pass_id=pass_id, wait_seconds=wait, worker=worker, request_id=request_id
        )
        try:
            future = self._stub.GetTask.future(
                request, timeout=wait + self.timeout, metadata=self._metadata
            )
        except ValueError:
            raise _closed_channel(self.addr) from None
        self._track(future)
        return PendingCall(self.addr, future, lambda reply: task_from_pb(reply.task))

    def task_finished(self, task_id: int, *, epoch: int = 0, pass_id: int = -1) -> bool:
        request = pb.TaskFinishedRequest(task_id=task_id, epoch=epoch, pass_id=pass_id)
        return bool(self._call("TaskFinished", request, self.timeout).applied)

    def task_failed(self, meta: TaskMeta, reason: str = "") -> bool:
        request = pb.TaskFailedRequest(
            meta=pb.TaskMeta(id=meta.id, epoch=meta.epoch), reason=reason
        )
        return bool(self._call("TaskFailed", request, self.timeout).applied)

    def request_save_model(self, trainer_id: str, block_dur: float) -> bool:
        request = pb.SaveModelRequest(trainer_id=trainer_id, block_seconds=block_dur)
        return bool(self._call("RequestSaveModel", request, self.timeout).approved)

    def status(self) -> dict[str, Any]:
        reply = self._call("Status", pb.StatusRequest(), self.timeout)
        result: dict[str, Any] = json.loads(reply.json)
        return result

    def open_session(self, requests: Iterator[pb.SessionRequest]) -> Any:
        """Open a Session stream fed by `requests`: an iterator of SessionResponse with
        cancel(); no deadline (it lives as long as the trainer), gRPC keep-alives watch it."""
        try:
            call = self._stub.Session(requests, metadata=self._metadata)
        except ValueError:
            raise _closed_channel(self.addr) from None
        self._track(call)
        return call

    def data_checkpoint(self) -> bytes:
        reply = self._call("DataCheckpoint", pb.DataCheckpointRequest(), self.timeout)
        return bytes(reply.checkpoint)

    def restore(
        self, checkpoint: bytes, key: str, rank: int | None = None, other_job: bool = False
    ) -> tuple[bool, int]:
        """Take the running job back to `checkpoint` (once per `key`; `rank`: the asking
        trainer's; `other_job`: a checkpoint of another job too): whether this call did it,
        and the job's pass after it."""
        request = pb.RestoreRequest(checkpoint=checkpoint, key=key, rank=rank, other_job=other_job)
        reply = self._call("Restore", request, self.timeout)
        return bool(reply.applied), int(reply.pass_id)

    def close(self) -> None:
        """Close the channel: every call on it ends now (cancelled if still going)."""
        self._closed = True
        self._channel.close()

    @property
    def ended(self) -> bool:
        """Closed, and gRPC has handled the last event of every tracked call."""
        with self._cond:
            return (
                self._closed
                and self._running == 0
                and not any(t.is_alive() for t in self._spinners)
            )

    def wait_closed(self, deadline: float) -> list[str]:
        """After close(): wait (until `deadline`, time.monotonic()) for gRPC's threads to have
        handled the last event of every tracked call, and to be gone. Returns what is still
        going at the deadline (none normally: a closed channel ends its calls at once)."""
        with self._cond:
            while self._running > 0 and self._cond.wait(max(0.0, deadline - time.monotonic())):
                pass
            running, spinners = self._running, set(self._spinners)
        left = [f"gRPC thread {name}" for name in join_all(spinners, deadline)]
        if running:
            left.append(f"{running} call(s) to {self.addr} without their last event")
        return left

    def live_calls(self) -> int:
        """How many tracked call objects are not deleted yet."""
        with self._cond:
            return sum(1 for r in self._calls if r() is not None)

    def __enter__(self) -> MasterConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
