"""The gRPC face of a Service: the Master service plus the standard health service."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from chunkmaster.core.checkpoint import CheckpointError
from chunkmaster.core.errors import CheckpointRefusedError, InvalidArgumentError, MasterError
from chunkmaster.core.model import TaskMeta
from chunkmaster.healthcheck import LEADER_SERVICE
from chunkmaster.master.auth import TokenInterceptor, peer_identity
from chunkmaster.master.daemon_threads import in_daemon_thread
from chunkmaster.master.job_dataset import SourceSpec
from chunkmaster.master.service import Service
from chunkmaster.master.stream import Malformed, SessionConversation
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc import master_pb2_grpc as pb_grpc
from chunkmaster.rpc.wire import ERROR_KEY, status_code_of, task_to_pb, tidy_request

log = logging.getLogger("chunkmaster.server")

SERVICE_NAME = "chunkmaster.v1.Master"
R = TypeVar("R")

#: Streams one connection may have open at once: a trainer needs its session and a few unary
#: calls; more is a client gone wrong, and each stream costs the master memory.
MAX_STREAMS_PER_CONNECTION = 100
#: Seconds a new connection has to complete its handshake (TLS, and HTTP/2's preface) before
#: the master drops it: a connection that says nothing holds a slot no longer than this.
HANDSHAKE_TIMEOUT = 10.0


async def _answer(
    context: grpc.aio.ServicerContext[Any, Any], call: Callable[[], Awaitable[R]]
) -> R:
    """Run an operation; turn a MasterError into its status code and original message."""
    try:
        return await call()
    except MasterError as exc:
        context.set_trailing_metadata(((ERROR_KEY, type(exc).__name__),))
        await context.abort(status_code_of(exc), str(exc))
        raise  # unreachable: abort raises


def _lenient(cls: Any) -> Callable[[bytes], Any]:
    """The request parsed, its free text cut to size (`wire.tidy_request`); Malformed for
    bytes that do not parse or a string too long to take."""

    def parse(data: bytes) -> Any:
        try:
            msg = cls.FromString(data)
        except DecodeError:
            return Malformed(f"invalid argument: the request is not a valid {cls.__name__}")
        problem = tidy_request(msg)
        if problem is not None:
            return Malformed(f"invalid argument: {problem}")
        return msg

    return parse


def _refusing_malformed(method: Callable[[Any, Any], Awaitable[Any]]) -> Any:
    async def call(request: Any, context: Any) -> Any:
        if isinstance(request, Malformed):
            context.set_trailing_metadata(((ERROR_KEY, InvalidArgumentError.__name__),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await method(request, context)

    return call


#: Each Master method's request and response message types.
_METHODS: dict[str, tuple[Any, Any]] = {
    "SetDataset": (pb.SetDatasetRequest, pb.SetDatasetResponse),
    "GetTask": (pb.GetTaskRequest, pb.GetTaskResponse),
    "TaskFinished": (pb.TaskFinishedRequest, pb.TaskReportResponse),
    "TaskFailed": (pb.TaskFailedRequest, pb.TaskReportResponse),
    "RequestSaveModel": (pb.SaveModelRequest, pb.SaveModelResponse),
    "Status": (pb.StatusRequest, pb.StatusResponse),
    "DataCheckpoint": (pb.DataCheckpointRequest, pb.DataCheckpointResponse),
    "Restore": (pb.RestoreRequest, pb.RestoreResponse),
    "SetWeights": (pb.SetWeightsRequest, pb.SetWeightsResponse),
}


def _master_handler(servicer: MasterServicer) -> grpc.GenericRpcHandler[Any, Any]:
    """The Master service's handlers; malformed request bytes get INVALID_ARGUMENT (gRPC's
    own deserialisation failure would answer UNKNOWN)."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(
            _refusing_malformed(getattr(servicer, name)),
            request_deserializer=_lenient(request),
            response_serializer=response.SerializeToString,
        )
        for name, (request, response) in _METHODS.items()
    }
    handlers["Session"] = grpc.stream_stream_rpc_method_handler(
        servicer.Session,
        request_deserializer=_lenient(pb.SessionRequest),
        response_serializer=pb.SessionResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def _weight_points(request: Any) -> list[tuple[int, list[tuple[str, float]]]]:
    return [(p.records, [(w.name, w.weight) for w in p.weights]) for p in request.points]


class MasterServicer(pb_grpc.MasterServicer):
    def __init__(self, service: Service) -> None:
        self.service = service

    async def SetDataset(self, request: Any, context: Any) -> Any:
        globs = list(request.globs)
        sources = [
            SourceSpec(s.name, tuple(s.globs), s.weight, s.format or None) for s in request.sources
        ]
        await _answer(context, lambda: self.service.set_dataset(globs, sources))
        return pb.SetDatasetResponse()

    async def SetWeights(self, request: Any, context: Any) -> Any:
        # (name, weight) pairs, as sent: a point naming a source twice is refused, not merged;
        # read off the event loop (up to the gRPC message's size of them)
        points = await in_daemon_thread(_weight_points, request)
        add = [SourceSpec(s.name, tuple(s.globs), s.weight, s.format or None) for s in request.add]
        done = await _answer(context, lambda: self.service.set_weights(points, request.mode, add))
        return pb.SetWeightsResponse(pass_id=done.pass_id, unit=done.unit, records=done.records)

    async def GetTask(self, request: Any, context: Any) -> Any:
        worker = request.worker or context.peer()
        owner = peer_identity(context) or ""  # journaled with the dispatch
        task = await _answer(
            context,
            lambda: self.service.get_task(
                request.pass_id,
                wait=request.wait_seconds,
                time_left=context.time_remaining(),  # answered before the caller gives up
                worker=worker,
                request_id=request.request_id,
                owner=owner,
            ),
        )
        return pb.GetTaskResponse(task=task_to_pb(task))

    async def TaskFinished(self, request: Any, context: Any) -> Any:
        applied = await _answer(
            context,
            lambda: self.service.task_finished(
                request.task_id,
                epoch=request.epoch,
                pass_id=request.pass_id,
                identity=peer_identity(context),
            ),
        )
        return pb.TaskReportResponse(applied=applied)

    async def TaskFailed(self, request: Any, context: Any) -> Any:
        meta = TaskMeta(request.meta.id, request.meta.epoch)
        applied = await _answer(
            context,
            lambda: self.service.task_failed(meta, request.reason, identity=peer_identity(context)),
        )
        return pb.TaskReportResponse(applied=applied)

    async def RequestSaveModel(self, request: Any, context: Any) -> Any:
        approved = await _answer(
            context,
            lambda: self.service.request_save_model(request.trainer_id, request.block_seconds),
        )
        return pb.SaveModelResponse(approved=approved)

    async def Status(self, request: Any, context: Any) -> Any:
        # UTF-8 as is (not \\u escapes): what the status holds is bounded in bytes (wire.py)
        return pb.StatusResponse(json=json.dumps(self.service.status(), ensure_ascii=False))

    async def DataCheckpoint(self, request: Any, context: Any) -> Any:
        blob = await _answer(context, self.service.data_checkpoint)
        return pb.DataCheckpointResponse(checkpoint=blob)

    async def Restore(self, request: Any, context: Any) -> Any:
        key = request.key

        async def restore() -> bool:
            if not key:
                raise InvalidArgumentError("invalid argument: a restore needs the restart's key")
            try:
                rank = request.rank if request.HasField("rank") else -1
                return await self.service.restore(
                    request.checkpoint, key=key, rank=rank, other_job=request.other_job
                )
            except CheckpointError as exc:
                raise CheckpointRefusedError(f"restore refused: {exc}") from None

        applied = await _answer(context, restore)
        return pb.RestoreResponse(applied=applied, pass_id=self.service.ledger.state.cur_pass)

    async def Session(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        conversation = SessionConversation(self.service, context.peer(), peer_identity(context))
        async for response in conversation.run(request_iterator):
            yield response


class MasterServer:
    """A Service served over gRPC on `host:port` (port 0 picks a free one).

    `interceptors`: run before the token check (e.g. metrics, which then count refusals);
    `credentials`: serve over TLS (`chunkmaster.master.auth.server_credentials`); `token`:
    every Master call must carry it; `max_connections`: connections served at once (gRPC
    accepts and closes those beyond at once, so a flood cannot take every file descriptor:
    `runner.connection_limit`). Where datasets may lie is the Service's to say (`data_roots`),
    for every way a dataset reaches it.
    """

    def __init__(
        self,
        service: Service,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        interceptors: Sequence[grpc.aio.ServerInterceptor[Any, Any]] = (),
        credentials: grpc.ServerCredentials | None = None,
        token: str | None = None,
        max_connections: int | None = None,
    ) -> None:
        self.service = service
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        options: list[tuple[str, Any]] = [
            ("grpc.so_reuseport", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
            ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT * 1000)),
        ]
        if max_connections is not None:
            options.append(("grpc.max_allowed_incoming_connections", max_connections))
        self.server = grpc.aio.server(
            interceptors=[*interceptors, *([] if token is None else [TokenInterceptor(token)])],
            options=options,
        )
        servicer = MasterServicer(service)
        self.server.add_generic_rpc_handlers((_master_handler(servicer),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        where = f"{_bracket(host)}:{port}"
        try:
            if credentials is None:
                bound = self.server.add_insecure_port(where)
            else:
                bound = self.server.add_secure_port(where, credentials)
        except RuntimeError:  # gRPC's "failed to bind": a port taken since the CLI's check
            bound = 0
        if bound == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        self.host, self.port = host, bound

    @property
    def address(self) -> str:
        return f"{_bracket(self.host)}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        await self.set_serving(True)

    async def set_serving(self, serving: bool) -> None:
        names = ("", SERVICE_NAME) if serving else ("", SERVICE_NAME, LEADER_SERVICE)
        await self._set(names, serving)

    async def set_leading(self) -> None:
        """Say in the health service that this master leads, its address published
        (`healthcheck.LEADER_SERVICE`: NOT_SERVING again once it stops serving)."""
        await self._set((LEADER_SERVICE,), True)

    async def _set(self, names: Sequence[str], serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in names:
            result = self.health.set(name, status)
            if result is not None:
                await result

    async def stop(self, grace: float | None = 1.0) -> None:
        await self.set_serving(False)
        await self.server.stop(grace)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
