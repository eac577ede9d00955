"""What an operator watches: Prometheus metrics and a live dashboard, on one small HTTP port.

- `collector`: the figures the state holds, read from the service at scrape time;
- `counters`: the registry, with counters of events that leave no trace in the state;
- `interceptor`: the gRPC interceptor that times RPCs and counts refusals;
- `http`: the HTTP server of `/metrics`, `/status.json` and the dashboard.
"""

from __future__ import annotations

import logging
import ssl

from chunkmaster.master.metrics.collector import StateCollector
from chunkmaster.master.metrics.counters import LeadershipChanges, MasterMetrics
from chunkmaster.master.metrics.http import MAX_HTTP_CLIENTS, MetricsServer
from chunkmaster.master.metrics.interceptor import RpcMetrics
from chunkmaster.master.service import Service

log = logging.getLogger("chunkmaster.metrics")

__all__ = [
    "MAX_HTTP_CLIENTS",
    "LeadershipChanges",
    "MasterMetrics",
    "MetricsServer",
    "RpcMetrics",
    "StateCollector",
    "start_metrics",
]


async def start_metrics(
    service: Service,
    host: str,
    port: int,
    *,
    elected: bool,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    changes: LeadershipChanges | None = None,
) -> tuple[MasterMetrics, MetricsServer]:
    """The master's metrics, served on `host:port` (0 picks a free port). `elected`: this
    master won an election to serve (etcd), which counts as a leadership change; `changes`:
    the process's count of them over its terms so far."""
    metrics = MasterMetrics(service, changes)
    metrics.leading(True, change=elected)
    server = MetricsServer(metrics, token=token, ssl_context=ssl_context)
    await server.start(host, port)
    scheme = "http" if ssl_context is None else "https"
    log.info("metrics and dashboard on %s://%s/", scheme, server.address)
    return metrics, server
