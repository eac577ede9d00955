"""One gRPC channel to one master address, with the master's errors raised as exceptions.

No retries here: the Client layers reconnection and backoff on top. Every call has a
deadline, so nothing in this module can block forever.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import grpc

from chunkmaster.core.errors import MasterError
from chunkmaster.core.model import Task, TaskMeta
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc import master_pb2_grpc as pb_grpc
from chunkmaster.rpc.wire import error_from_rpc, task_from_pb

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
DATASET_TIMEOUT = 600.0
"""SetDataset's default deadline: indexing ten thousand files on a network filesystem is slow."""


TOKEN_ENV = "CHUNKMASTER_TOKEN"


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
        """Read the files (paths); the token comes from CHUNKMASTER_TOKEN if not given.
        TLS is on once a CA or a client certificate is given. ValueError names a bad file."""
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together (the client's certificate)")
        if token is None:
            token = os.environ.get(TOKEN_ENV, "").strip() or None
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


class CallCancelled(Exception):
    """A call was cancelled from another thread (the pass was abandoned or the client closed)."""


def _closed_channel(addr: str) -> TransportError:
    return TransportError(addr, grpc.RpcError("channel closed"))


class PendingCall(Generic[T]):
    """An RPC in flight that another thread may cancel, e.g. a long-polling GetTask."""

    def __init__(self, addr: str, future: Any, convert: Callable[[Any], T]) -> None:
        self._addr = addr
        self._future = future
        self._convert = convert

    def result(self) -> T:
        """Wait for the answer (bounded by the call's deadline); raise like a sync call."""
        try:
            reply = self._future.result()
        except grpc.FutureCancelledError:
            raise CallCancelled() from None
        except grpc.RpcError as exc:
            if self._future.cancelled():
                raise CallCancelled() from None
            err: MasterError | None = error_from_rpc(exc)
            if err is not None:
                raise err from None
            raise TransportError(self._addr, exc) from None
        return self._convert(reply)

    def cancel(self) -> None:
        """Abandon the call: `result()` raises CallCancelled, the master stops waiting."""
        self._future.cancel()


class MasterConnection:
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
            return self._stub.Session(requests, metadata=self._metadata)
        except ValueError:
            raise _closed_channel(self.addr) from None

    def data_checkpoint(self) -> bytes:
        reply = self._call("DataCheckpoint", pb.DataCheckpointRequest(), self.timeout)
        return bytes(reply.checkpoint)

    def restore(self, checkpoint: bytes, key: str) -> tuple[bool, int]:
        """Take the running job back to `checkpoint` (once per `key`): whether this call did
        it, and the job's pass after it."""
        reply = self._call(
            "Restore", pb.RestoreRequest(checkpoint=checkpoint, key=key), self.timeout
        )
        return bool(reply.applied), int(reply.pass_id)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> MasterConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
