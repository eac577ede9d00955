"""The gRPC face of a Service: the Master service plus the standard health service."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from chunkmaster.core.errors import InvalidArgumentError, MasterError
from chunkmaster.core.model import TaskMeta
from chunkmaster.master.auth import TokenInterceptor, peer_identity
from chunkmaster.master.datasets import check_data_roots, in_daemon_thread
from chunkmaster.master.service import Service
from chunkmaster.master.stream import Malformed, SessionConversation
from chunkmaster.rpc import master_pb2 as pb
from chunkmaster.rpc import master_pb2_grpc as pb_grpc
from chunkmaster.rpc.wire import ERROR_KEY, status_code_of, task_to_pb

log = logging.getLogger("chunkmaster.server")

SERVICE_NAME = "chunkmaster.v1.Master"
R = TypeVar("R")


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
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError:
            return Malformed(f"invalid argument: the request is not a valid {cls.__name__}")

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


class MasterServicer(pb_grpc.MasterServicer):
    def __init__(self, service: Service, data_roots: Sequence[str] = ()) -> None:
        self.service = service
        self.data_roots = tuple(data_roots)

    async def SetDataset(self, request: Any, context: Any) -> Any:
        globs = list(request.globs)

        async def set_dataset() -> None:
            # In a thread: checking a pattern globs the file system, which may be slow.
            await in_daemon_thread(check_data_roots, globs, self.data_roots)
            await self.service.set_dataset(globs)

        await _answer(context, set_dataset)
        return pb.SetDatasetResponse()

    async def GetTask(self, request: Any, context: Any) -> Any:
        wait = max(0.0, request.wait_seconds)
        remaining = context.time_remaining()
        if remaining is not None:  # answer before the caller's own deadline expires
            wait = min(wait, max(0.0, remaining - 0.25))
        worker = request.worker or context.peer()
        owner = peer_identity(context) or ""  # journaled with the dispatch
        task = await _answer(
            context,
            lambda: self.service.get_task(
                request.pass_id,
                wait=wait,
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
        return pb.StatusResponse(json=json.dumps(self.service.status()))

    async def DataCheckpoint(self, request: Any, context: Any) -> Any:
        blob = await _answer(context, self.service.data_checkpoint)
        return pb.DataCheckpointResponse(checkpoint=blob)

    async def Session(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        conversation = SessionConversation(self.service, context.peer(), peer_identity(context))
        async for response in conversation.run(request_iterator):
            yield response


class MasterServer:
    """A Service served over gRPC on `host:port` (port 0 picks a free one).

    `interceptors`: run before the token check (e.g. metrics, which then count refusals);
    `credentials`: serve over TLS (`chunkmaster.master.auth.server_credentials`); `token`:
    every Master call must carry it; `data_roots`: where datasets may lie
    (`chunkmaster.master.datasets.check_data_roots`).
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
        data_roots: Sequence[str] = (),
    ) -> None:
        self.service = service
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self.server = grpc.aio.server(
            interceptors=[*interceptors, *([] if token is None else [TokenInterceptor(token)])],
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ],
        )
        servicer = MasterServicer(service, data_roots)
        self.server.add_generic_rpc_handlers((_master_handler(servicer),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        where = f"{_bracket(host)}:{port}"
        if credentials is None:
            bound = self.server.add_insecure_port(where)
        else:
            bound = self.server.add_secure_port(where, credentials)
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
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            result = self.health.set(name, status)
            if result is not None:
                await result

    async def stop(self, grace: float | None = 1.0) -> None:
        await self.set_serving(False)
        await self.server.stop(grace)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
