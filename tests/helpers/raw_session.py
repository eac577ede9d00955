"""A trainer's Session stream spoken by hand (raw protobuf over real gRPC), for server tests."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import grpc

from chunkmaster.client.connection import PLAIN, ChannelSecurity
from chunkmaster.rpc import master_pb2 as pb

_END = object()


class RawSession:
    """Send SessionRequest bodies with `send`; read answers with `recv` (blocking, bounded).
    `security`: a token, TLS (and a client certificate, for mutual TLS)."""

    def __init__(self, addr: str, security: ChannelSecurity = PLAIN) -> None:
        self.channel = security.channel(addr, [])
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._seq = 0
        method = self.channel.stream_stream(
            "/chunkmaster.v1.Master/Session",
            request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
            response_deserializer=pb.SessionResponse.FromString,
        )
        token = security.token
        metadata = None if token is None else (("authorization", f"Bearer {token}"),)
        self.call = method(self._iter(), metadata=metadata)
        self._responses: queue.SimpleQueue[Any] = queue.SimpleQueue()
        import threading

        threading.Thread(target=self._read, daemon=True).start()

    def _iter(self) -> Iterator[Any]:
        while True:
            item = self._requests.get()
            if item is _END:
                return
            yield item

    def _read(self) -> None:
        try:
            for resp in self.call:
                self._responses.put(resp)
        except grpc.RpcError as exc:
            self._responses.put(exc)
        self._responses.put(None)

    def send(self, **body: Any) -> int:
        self._seq += 1
        self._requests.put(pb.SessionRequest(seq=self._seq, **body))
        return self._seq

    def send_raw(self, data: bytes) -> None:
        self._requests.put(data)

    def recv(self, timeout: float = 30.0) -> Any:
        return self._responses.get(timeout=timeout)

    def hello(self, session_id: str = "", name: str = "t", report_every: int = 0) -> Any:
        self.send(
            hello=pb.Hello(
                session_id=session_id, name=name, host="h", pid=1, report_every=report_every
            )
        )
        return self.recv()

    def end(self) -> None:
        self._requests.put(_END)

    def close(self) -> None:
        self.end()
        self.call.cancel()
        self.channel.close()


def position(task: Any, records: int) -> pb.TaskPosition:
    return pb.TaskPosition(
        task_id=task.meta.id, epoch=task.meta.epoch, pass_id=task.pass_id, records=records
    )
