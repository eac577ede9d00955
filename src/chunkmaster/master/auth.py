"""Who may talk to the master: TLS credentials, the shared token, and the peer's identity.

The token travels as gRPC metadata (`authorization: Bearer <token>`) and is checked by a
server interceptor before any Master method runs, the Session stream included; the health
service stays open so that load balancers and orchestrators can probe a master they hold no
token for. Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeAlias

import grpc

from chunkmaster.core.errors import UnauthenticatedError
from chunkmaster.rpc.wire import ERROR_KEY
from chunkmaster.tokens import HOW_TO_GIVE, check_token

log = logging.getLogger("chunkmaster.auth")

__all__ = [
    "NO_TOKEN",
    "WRONG_TOKEN",
    "TokenInterceptor",
    "is_loopback",
    "peer_identity",
    "server_credentials",
    "server_ssl_context",
]

#: Methods of these services need no token.
OPEN_SERVICES = ("/grpc.health.v1.Health/",)

#: What a caller is told when it sent no token, and when it sent one that is not this
#: master's: which of the two it was (the caller knows that already), nothing more.
NO_TOKEN = f"unauthenticated: no token was sent: give one with {HOW_TO_GIVE}"
WRONG_TOKEN = (
    "unauthenticated: the token sent is not this master's (check that the trainer reads the "
    "token file the master was started with, and that the file was not written again since)"
)


def _read_bytes(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path}: {exc.strerror}") from None


def server_credentials(cert: str, key: str, client_ca: str | None = None) -> grpc.ServerCredentials:
    """TLS with this certificate and key; with `client_ca`, every client must present a
    certificate signed by it (mutual TLS)."""
    return grpc.ssl_server_credentials(
        [(_read_bytes(key, "TLS key"), _read_bytes(cert, "TLS certificate"))],
        root_certificates=None if client_ca is None else _read_bytes(client_ca, "client CA"),
        require_client_auth=client_ca is not None,
    )


def server_ssl_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The same TLS for the metrics and dashboard server (HTTPS) as for gRPC."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
        if client_ca is not None:
            ctx.load_verify_locations(client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the TLS certificate {cert} and key {key}: {exc}") from None
    return ctx


def is_loopback(host: str) -> bool:
    """Whether listening on `host` keeps the master reachable from this machine only."""
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def peer_identity(context: Any) -> str | None:
    """The subject of the client's verified certificate (mutual TLS), or None without one."""
    auth = context.auth_context() or {}
    for key in ("x509_subject", "x509_common_name"):
        values = auth.get(key)
        if values:
            first = values[0]
            return first.decode(errors="replace") if isinstance(first, bytes) else str(first)
    return None


Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Refuses, with UNAUTHENTICATED, every call without `authorization: Bearer <token>`,
    telling a call that sent no token from one that sent another."""

    def __init__(self, token: str) -> None:
        problem = check_token(token)
        if problem is not None:  # no client could ever send it
            raise ValueError(f"the master's token {problem}")
        self._expected = f"Bearer {token}".encode()

    def _refusal(self, details: grpc.HandlerCallDetails) -> str | None:
        """Why the call is refused (NO_TOKEN or WRONG_TOKEN), or None if it may go on."""
        method = details.method or ""
        if method.startswith(OPEN_SERVICES):
            return None
        given = b""
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else bytes(value)
                break
        if hmac.compare_digest(given, self._expected):
            return None
        return NO_TOKEN if given.strip() in (b"", b"Bearer") else WRONG_TOKEN

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        refusal = self._refusal(handler_call_details)
        if refusal is None:
            return handler
        why = "no token" if refusal == NO_TOKEN else "wrong token"
        log.warning("refused %s: %s", handler_call_details.method, why)
        return _refusing(handler, refusal)


def _refusing(handler: Handler, message: str) -> Handler:
    """A handler of the same kind as `handler` that only refuses, saying `message`."""

    async def deny(request: Any, context: Any) -> None:
        context.set_trailing_metadata(((ERROR_KEY, UnauthenticatedError.__name__),))
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def deny_stream(request: Any, context: Any) -> AsyncIterator[Any]:
        """The refusal as a response stream: an async generator, like the handler it
        replaces (an interceptor that wraps it iterates it: RpcMetrics)."""
        await deny(request, context)
        return  # abort raised already: nothing is ever sent
        yield  # (what makes this function an async generator)

    de, ser = handler.request_deserializer, handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny_stream, de, ser)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, de, ser)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny_stream, de, ser)
    return grpc.unary_unary_rpc_method_handler(deny, de, ser)
