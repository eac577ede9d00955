"""What an operator watches: Prometheus metrics and a live dashboard, on one small HTTP port.

Figures that describe the state (the pass, the queues, the trainers, the record ledger, the
store's health) are read from the service when Prometheus scrapes, so they can never drift
from it. Only events that leave no trace in the state are counted as they happen: dispatches,
finishes and failures (the ledger's `on_event`), store writes (its `on_save`), RPCs (a gRPC
server interceptor) and leadership. Every figure lives in a private registry, so two masters
in one process (the tests) never mix their numbers.

The HTTP server runs on the master's event loop (asyncio streams): the state is read on the
thread that changes it, and a slow client holds only its own connection.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chunkmaster.core.events import Dispatch, Event, Fail, Finish
from chunkmaster.core.model import TIMEOUT_REASON, Task
from chunkmaster.core.state import READ_FAILURE
from chunkmaster.master.ledger import LedgerSubscriber
from chunkmaster.master.service import Service
from chunkmaster.master.status import MixtureView, PassRecords, StoreView, Trainer

log = logging.getLogger("chunkmaster.metrics")

__all__ = ["MasterMetrics", "MetricsServer", "RpcMetrics", "start_metrics"]

#: Seconds a task may take between dispatch and finish: from a tiny test task to hours.
TASK_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1200, 3600, 4 * 3600)
#: Seconds for one RPC or one store write: sub-millisecond to a GetTask's long wait.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
    10, 30, 60,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
    Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    Handler = grpc.RpcMethodHandler
    Interceptor = grpc.aio.ServerInterceptor
READ_TIMEOUT = 10.0  # seconds a client has to send its request
#: HTTP connections served at once (a dashboard or two and Prometheus need a few); those
#: beyond are closed as soon as they are accepted, so a flood holds few descriptors.
MAX_HTTP_CLIENTS = 32


class StateCollector(Collector):
    """The figures the state holds, read at scrape time from `Service.status_view()`."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        st = self.service.status_view()
        yield _gauge("chunkmaster_pass", "The pass being dispatched.", st.cur_pass)
        yield _gauge("chunkmaster_ready", "1 once a dataset is set.", int(st.ready))
        yield _gauge("chunkmaster_dataset_tasks", "Tasks in one pass.", st.num_tasks)
        queues = GaugeMetricFamily(
            "chunkmaster_tasks", "Tasks of the current pass by queue.", labels=["queue"]
        )
        for queue, n in (("todo", st.todo), ("pending", st.pending), ("done", st.done)):
            queues.add_metric([queue], n)
        queues.add_metric(["failed"], st.failed)
        yield queues
        yield _gauge(
            "chunkmaster_tasks_with_failures",
            "Tasks that failed at least once (all passes).",
            st.tasks_with_failures,
        )
        yield _gauge("chunkmaster_trainers", "Trainers with a live session.", st.sessions)
        yield from _trainer_metrics(st.trainers)
        yield from _pass_metrics(st.ledger)
        yield _gauge(
            "chunkmaster_job_stopped",
            "1 once more records were quarantined in a pass than the error budget allows.",
            int(st.job_stopped is not None),
        )
        yield _gauge(
            "chunkmaster_commit_floor", "The first pass not wholly committed.", st.commit_floor
        )
        yield from _store_metrics(st.store)
        if st.mixture is not None:
            yield from _source_metrics(st.mixture)


def _source_metrics(mixture: MixtureView) -> Iterator[Metric]:
    records = GaugeMetricFamily(
        "chunkmaster_source_records",
        "Records of each source of a mixture, the whole job, by stage: handed out, "
        "reported consumed, committed.",
        labels=["source", "stage"],
    )
    target = GaugeMetricFamily(
        "chunkmaster_source_weight",
        "Each source's weight in force (normalised: the share of records it is planned).",
        labels=["source"],
    )
    share = GaugeMetricFamily(
        "chunkmaster_source_share",
        "Each source's share of the records consumed so far (0 to 1).",
        labels=["source"],
    )
    epoch = GaugeMetricFamily(
        "chunkmaster_source_epoch", "The epoch of each source's next task.", labels=["source"]
    )
    for s in mixture.sources:
        for stage, n in (
            ("handed_out", s.handed_out),
            ("consumed", s.consumed),
            ("committed", s.committed),
        ):
            records.add_metric([s.name, stage], n)
        target.add_metric([s.name], s.target)
        if s.share is not None:
            share.add_metric([s.name], s.share)
        epoch.add_metric([s.name], s.epoch)
    yield records
    yield target
    yield share
    yield epoch


def _trainer_metrics(trainers: Sequence[Trainer]) -> Iterator[Metric]:
    rate = GaugeMetricFamily(
        "chunkmaster_trainer_records_per_second",
        "Each trainer's recent reading rate (records/s), from its progress reports.",
        labels=["trainer", "session"],
    )
    consumed = GaugeMetricFamily(
        "chunkmaster_trainer_records_consumed",
        "Records each trainer reported consumed, all passes.",
        labels=["trainer", "session"],
    )
    wait = GaugeMetricFamily(
        "chunkmaster_trainer_data_wait_seconds",
        "How long each trainer's training loop waited for a batch over its last minute "
        "(p50, p99), as its loader measured it.",
        labels=["trainer", "session", "quantile"],
    )
    share = GaugeMetricFamily(
        "chunkmaster_trainer_data_wait_share",
        "The share of each trainer's wall time its training loop spent waiting for data "
        "over its last minute (0 to 1): a rank that starves shows here.",
        labels=["trainer", "session"],
    )
    for t in trainers:
        labels = [t.name, t.session]
        if t.records_per_second is not None:
            rate.add_metric(labels, t.records_per_second)
        consumed.add_metric(labels, t.records_consumed)
        w = t.data_wait
        if w is not None:
            wait.add_metric([*labels, "0.5"], w.p50_ms / 1000)
            wait.add_metric([*labels, "0.99"], w.p99_ms / 1000)
            share.add_metric(labels, w.share)
    yield rate
    yield consumed
    yield wait
    yield share


def _pass_metrics(ledger: Sequence[PassRecords]) -> Iterator[Metric]:
    records = GaugeMetricFamily(
        "chunkmaster_pass_records",
        "Records of a pass (the current and the previous one) by stage: handed out, "
        "reported consumed, committed, quarantined (not delivered: their task failed "
        "more than the limit); with equal steps also dropped (not handed out) and "
        "padded (handed out again to even the trainers up).",
        labels=["pass", "stage"],
    )
    again = GaugeMetricFamily(
        "chunkmaster_pass_records_redispatched",
        "Records of a pass handed out again, by why.",
        labels=["pass", "reason"],
    )
    for entry in ledger:
        p = str(entry.pass_id)
        for stage in ("dispatched", "consumed", "committed", "quarantined", "dropped", "padded"):
            records.add_metric([p, stage], getattr(entry, stage))
        for reason, n in entry.redispatched.items():
            again.add_metric([p, reason], n)
    yield records
    yield again


def _store_metrics(store: StoreView) -> Iterator[Metric]:
    yield _gauge("chunkmaster_store_healthy", "1 while the store takes writes.", int(store.healthy))
    yield _gauge(
        "chunkmaster_store_failed_attempts",
        "Store writes that failed since it last worked.",
        store.failed_attempts,
    )
    yield _gauge("chunkmaster_journal_seq", "Last journal entry applied.", store.seq)
    yield _gauge(
        "chunkmaster_journal_durable_seq",
        "Last journal entry the store acknowledged.",
        store.durable_seq,
    )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class MasterMetrics(LedgerSubscriber):
    """The master's registry: state figures read at scrape time plus event counters."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        r.register(StateCollector(service))
        self.dispatches = Counter("chunkmaster_dispatches", "Tasks handed out.", registry=r)
        self.finishes = Counter("chunkmaster_finishes", "Tasks reported finished.", registry=r)
        self.failures = Counter(
            "chunkmaster_failures",
            "Task failures by reason: 'timeout' (no finish in time) or 'read failure' "
            "(the trainer reported one).",
            ["reason"],
            registry=r,
        )
        self.task_seconds = Histogram(
            "chunkmaster_task_duration_seconds",
            "Seconds from a task's dispatch to its finish.",
            buckets=TASK_BUCKETS,
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "chunkmaster_rpc_duration_seconds",
            "Seconds a unary RPC took to answer, by method (GetTask includes its wait).",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.refused = Counter(
            "chunkmaster_rpc_refused",
            "RPCs answered with an error, by method and status code.",
            ["method", "code"],
            registry=r,
        )
        self.store_seconds = Histogram(
            "chunkmaster_store_commit_seconds",
            "Seconds one batch of journal entries took to be durable in the store.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.store_batch = Histogram(
            "chunkmaster_store_batch_entries",
            "Journal entries written per store batch.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.leader = Gauge(
            "chunkmaster_leader", "1 while this master leads and serves.", registry=r
        )
        self.leadership_changes = Counter(
            "chunkmaster_leadership_changes",
            "Times this process won or lost the job's leadership (etcd).",
            registry=r,
        )
        for reason in (TIMEOUT_REASON, READ_FAILURE):
            self.failures.labels(reason)
        # task -> (epoch, monotonic time) of its latest dispatch; one entry per task at most,
        # so tasks handed back without a finish (a session's end) cost no more than that
        self._dispatched_at: dict[int, tuple[int, float]] = {}
        service.ledger.subscribe(self)

    def event_applied(self, event: Event, result: Task | bool | int | None) -> None:
        if isinstance(event, Dispatch) and isinstance(result, Task):
            self.dispatches.inc()
            self._dispatched_at[result.meta.id] = (result.meta.epoch, time.monotonic())
        elif isinstance(event, Finish) and result:
            self.finishes.inc()
            began = self._dispatched_at.pop(event.task_id, None)
            if began is not None and began[0] == event.epoch:
                self.task_seconds.observe(time.monotonic() - began[1])
        elif isinstance(event, Fail) and result:
            self.failures.labels(
                TIMEOUT_REASON if event.reason == TIMEOUT_REASON else READ_FAILURE
            ).inc()
            self._dispatched_at.pop(event.task_id, None)

    def batch_written(self, entries: int, seconds: float) -> None:
        self.store_batch.observe(entries)
        self.store_seconds.observe(seconds)

    def leading(self, leads: bool, *, change: bool) -> None:
        """Note whether this master leads; `change`: it won or lost an election."""
        self.leader.set(1 if leads else 0)
        if change:
            self.leadership_changes.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


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


async def start_metrics(
    service: Service,
    host: str,
    port: int,
    *,
    elected: bool,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[MasterMetrics, MetricsServer]:
    """The master's metrics, served on `host:port` (0 picks a free port). `elected`: this
    master won an election to serve (etcd), which counts as a leadership change."""
    metrics = MasterMetrics(service)
    metrics.leading(True, change=elected)
    server = MetricsServer(metrics, token=token, ssl_context=ssl_context)
    await server.start(host, port)
    scheme = "http" if ssl_context is None else "https"
    log.info("metrics and dashboard on %s://%s/", scheme, server.address)
    return metrics, server
