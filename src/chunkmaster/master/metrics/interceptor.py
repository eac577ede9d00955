"""A gRPC server interceptor that times every unary RPC and counts refusals."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from chunkmaster.master.metrics.counters import MasterMetrics

if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
    Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    Handler = grpc.RpcMethodHandler
    Interceptor = grpc.aio.ServerInterceptor


class RpcMetrics(Interceptor):
    """Times every unary RPC by method and counts refusals by status code. Placed first
    among the server's interceptors, it also counts what later ones (auth) refuse."""

    def __init__(self, metrics: MasterMetrics) -> None:
        self.metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._timed(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._watched(method, handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _timed(self, method: str, inner: Any) -> Any:
        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            began = time.perf_counter()
            try:
                return await inner(request, context)
            except BaseException:
                self._refused(method, context, grpc.StatusCode.UNKNOWN)
                raise
            finally:
                self.metrics.rpc_seconds.labels(method).observe(time.perf_counter() - began)

        return call

    def _watched(self, method: str, inner: Any) -> Any:
        """A stream lasts as long as its trainer: counted when refused, never timed."""

        async def call(
            requests: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            try:
                async for response in inner(requests, context):
                    yield response
            except BaseException:
                self._refused(method, context, grpc.StatusCode.UNKNOWN)
                raise

        return call

    def _refused(
        self, method: str, context: grpc.aio.ServicerContext[Any, Any], default: grpc.StatusCode
    ) -> None:
        code = context.code() or default
        if isinstance(code, grpc.StatusCode) and code is not grpc.StatusCode.OK:
            self.metrics.refused.labels(method, code.name).inc()
