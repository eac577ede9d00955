"""Where etcd is and how to reach it: one validated value for the master and the trainers.

Endpoints are parsed here, once (`EtcdOptions.parse`); everything else takes `EtcdOptions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import grpc

#: Large enough for any response we ask for: reads are paginated to a few tens of MiB.
MAX_RECEIVE_BYTES = 512 * 1024 * 1024

#: gRPC channel settings for every etcd connection, the master's and the trainers'.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # Notice a hung (SIGSTOPped, partitioned) server on an open watch stream. etcd refuses pings
    # more often than every 5 s, and pings without an active call.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # Come back quickly after an etcd restart.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: bool

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(endpoints: str | Sequence[str]) -> tuple[Endpoint, ...]:
    """Accept `http://h:p`, `https://h:p`, `h:p` or `h`, as a list or a comma-separated string."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out: list[Endpoint] = []
    for raw in items:
        text = raw.strip()
        if not text:
            continue
        try:
            parts = urlsplit(text if "://" in text else "http://" + text)
            port = parts.port
        except ValueError:  # a port that is not a number, or out of range
            raise ValueError(f"bad etcd endpoint {raw!r}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"bad etcd endpoint {raw!r}")
        out.append(Endpoint(parts.hostname, port or 2379, parts.scheme == "https"))
    if not out:
        raise ValueError("no etcd endpoints given")
    return tuple(out)


@dataclass(frozen=True)
class EtcdOptions:
    """The etcd cluster and the credentials for it. TLS file paths are read at connect time."""

    endpoints: tuple[Endpoint, ...]
    ca_cert: str | None = None
    cert_cert: str | None = None
    cert_key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("no etcd endpoints given")
        if (self.user is None) != (self.password is None):
            raise ValueError("etcd user and password must be given together")
        if (self.cert_key is None) != (self.cert_cert is None):
            raise ValueError("etcd client cert and key must be given together")

    @classmethod
    def parse(
        cls,
        endpoints: str | Sequence[str],
        *,
        ca_cert: str | None = None,
        cert_cert: str | None = None,
        cert_key: str | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> EtcdOptions:
        """Options from endpoints as users write them (see `parse_endpoints`)."""
        return cls(parse_endpoints(endpoints), ca_cert, cert_cert, cert_key, user, password)

    def describe(self) -> str:
        return ",".join(("https://" if e.tls else "") + e.target for e in self.endpoints)

    def secure(self, endpoint: Endpoint) -> bool:
        """Whether to speak TLS to `endpoint` (an https endpoint, or a CA was given)."""
        return endpoint.tls or self.ca_cert is not None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as fh:
                return fh.read()

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_cert),
            private_key=read(self.cert_key),
            certificate_chain=read(self.cert_cert),
        )
