"""The metrics port: `/metrics`, `/status.json` and the dashboard over plain HTTP/1.1.

The server runs on the master's event loop (asyncio streams): the state is read on the
thread that changes it, and a slow client holds only its own connection.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import ssl
from importlib import resources
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from chunkmaster.master.metrics.counters import MasterMetrics

log = logging.getLogger("chunkmaster.metrics")

READ_TIMEOUT = 10.0  # seconds a client has to send its request
#: HTTP connections served at once (a dashboard or two and Prometheus need a few); those
#: beyond are closed as soon as they are accepted, so a flood holds few descriptors.
MAX_HTTP_CLIENTS = 32


def dashboard_html() -> bytes:
    return resources.files("chunkmaster.master").joinpath("dashboard.html").read_bytes()


class MetricsServer:
    """`/metrics` (Prometheus), `/status.json` (the master's status) and `/` (the dashboard),
    over plain HTTP/1.1, one request per connection."""

    def __init__(
        self,
        metrics: MasterMetrics,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.metrics = metrics
        self._token = token
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._clients = 0
        self._page = dashboard_html()
        self.host, self.port = "", 0

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def start(self, host: str, port: int) -> None:
        try:
            # backlog: connections accepted in one go before their handlers run (and close
            # those over MAX_HTTP_CLIENTS)
            tls: dict[str, Any] = {}
            if self._ssl is not None:  # a TLS handshake gets no longer than a request
                tls = {"ssl": self._ssl, "ssl_handshake_timeout": READ_TIMEOUT}
            self._server = await asyncio.start_server(
                self._handle, host, port, backlog=MAX_HTTP_CLIENTS, **tls
            )
        except OSError as exc:
            raise OSError(f"cannot listen for metrics on {host}:{port}: {exc.strerror}") from None
        self.host = host
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._clients >= MAX_HTTP_CLIENTS:
            writer.transport.abort()  # busy: the client may try again
            return
        self._clients += 1
        try:
            await self._serve(reader, writer)
        finally:
            self._clients -= 1

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            status, ctype, body = self._answer(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            status, ctype, body = "400 Bad Request", "text/plain", b"bad request\n"
        except ConnectionError:
            writer.close()
            return
        except Exception:  # a bug, not the client's fault: say so, keep serving
            log.exception("the metrics server failed to answer a request")
            status, ctype, body = "500 Internal Server Error", "text/plain", b"internal error\n"
        challenge = 'WWW-Authenticate: Basic realm="chunkmaster"\r\n' if status[:3] == "401" else ""
        try:
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{challenge}"
                f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _answer(self, head: bytes) -> tuple[str, str, bytes]:
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3:
            return "400 Bad Request", "text/plain", b"bad request\n"
        verb, target = parts[0], parts[1].split(b"?", 1)[0]
        if self._token is not None and not self._authorized(head):
            self.metrics.refused.labels("HTTP", "UNAUTHENTICATED").inc()
            return "401 Unauthorized", "text/plain", b"the master's token is needed\n"
        if verb != b"GET":
            return "405 Method Not Allowed", "text/plain", b"only GET\n"
        if target == b"/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, self.metrics.exposition()
        if target == b"/status.json":
            body = json.dumps(self.metrics.service.status()).encode()
            return "200 OK", "application/json", body
        if target in (b"/", b"/index.html"):
            return "200 OK", "text/html; charset=utf-8", self._page
        return "404 Not Found", "text/plain", b"not found: try /, /metrics or /status.json\n"

    def _authorized(self, head: bytes) -> bool:
        """`Authorization: Bearer TOKEN`, or Basic with the token as password (a browser's
        prompt), compared in constant time."""
        assert self._token is not None
        want = self._token.encode()
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() != b"authorization":
                continue
            scheme, _, cred = value.strip().partition(b" ")
            if scheme.lower() == b"bearer":
                return hmac.compare_digest(cred.strip(), want)
            if scheme.lower() == b"basic":
                try:
                    decoded = base64.b64decode(cred.strip(), validate=True)
                except ValueError:
                    return False
                return hmac.compare_digest(decoded.partition(b":")[2], want)
        return False
