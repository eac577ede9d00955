"""`chunkmaster-health`: one gRPC health check of a master, for container and Kubernetes probes.

Exit 0 when the master's standard health service answers SERVING, 1 otherwise, with one line
saying why; 2 for a bad argument. The health service needs no token, so a probe needs none.
It is the image's HEALTHCHECK and the Kubernetes manifests' exec probe (docs/deploy.md): the
kubelet's own `grpc:` probe cannot speak TLS to the master.

Defaults come from the master's own variables, so a probe in the master's container needs no
arguments: the address is CHUNKMASTER_HEALTH_ADDR, else CHUNKMASTER_HOST (127.0.0.1 when it is
unset or a wildcard) and CHUNKMASTER_PORT (8080). With CHUNKMASTER_TLS_CERT set the master
speaks TLS, and the probe needs the CA that signed its certificate (`--tls-ca`), and the name
the certificate carries when it is not the address's host (`--server-name`).

`--standby-ok`: nothing listening at the address counts as healthy. A master on etcd listens
only once it leads, so a standby waiting for the lock has no port open; this makes the probe a
liveness check for it (a leader that stopped answering still fails).

`--leader`: healthy only while the master at the address leads, its address published (the
health service's `chunkmaster.v1.Leader`); a standby, with nothing listening, is not, whatever
`--standby-ok` says. As a readiness probe it makes the leader the only ready master, so a
Kubernetes Service over the masters reaches the leader alone, and the standbys stay live under
the liveness probe's `--standby-ok` (deploy/kubernetes/, docs/deploy.md).
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from collections.abc import Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chunkmaster.client.connection import ChannelSecurity

__all__ = ["LEADER_SERVICE", "check", "default_addr", "main"]

HEALTHY, UNHEALTHY, USAGE = 0, 1, 2

#: The health service's name for "this master leads": SERVING from the moment a master leads
#: and has published its address (on etcd) until it stops serving; unknown before. Asked for
#: by `--leader`, the readiness probe that makes the leader the only ready master, so that a
#: Kubernetes Service over the masters reaches the leader alone (deploy/kubernetes/).
LEADER_SERVICE = "chunkmaster.v1.Leader"


def default_addr(environ: Mapping[str, str]) -> str:
    """Where the master in this container listens, from its own variables."""
    given = environ.get("CHUNKMASTER_HEALTH_ADDR", "").strip()
    if given:
        return given
    host = environ.get("CHUNKMASTER_HOST", "").strip() or "127.0.0.1"
    if host in ("0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    port = environ.get("CHUNKMASTER_PORT", "").strip() or "8080"
    return f"{host}:{port}"


def _listening(addr: str, timeout: float) -> bool:
    """False only when the connection is refused: nothing listens at `addr`."""
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError as exc:
        return exc.errno != errno.ECONNREFUSED


def check(
    addr: str,
    *,
    security: ChannelSecurity,
    server_name: str | None = None,
    service: str = "",
    timeout: float = 5.0,
    standby_ok: bool = False,
    leader: bool = False,
) -> tuple[int, str]:
    """The exit code and the line to print for one health check of the master at `addr`;
    with `leader`, of whether it leads (`service` is then the leader's)."""
    if leader:
        service = LEADER_SERVICE
        if not _listening(addr, timeout):
            return UNHEALTHY, f"{addr}: nothing listening: not the leader (a standby?)"
    elif standby_ok and not _listening(addr, timeout):
        return HEALTHY, f"{addr}: nothing listening (a standby waiting to lead)"
    options: list[tuple[str, object]] = []
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    channel = security.channel(addr, options)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        name = code.name if code is not None else "error"
        if leader and code == grpc.StatusCode.NOT_FOUND:
            return UNHEALTHY, f"{addr}: not the leader yet (its address is not published)"
        return UNHEALTHY, f"{addr}: {name}: {detail}"
    finally:
        channel.close()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if leader and status == "SERVING":
        return HEALTHY, f"{addr}: leading"
    if leader:
        return UNHEALTHY, f"{addr}: {status}: not leading"
    return (HEALTHY if status == "SERVING" else UNHEALTHY), f"{addr}: {status}"


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    p = _parser(env)
    args = p.parse_args(argv)
    if args.leader and args.service:
        p.error("--leader asks the leader's own service: leave --service out")
    addr = args.addr or default_addr(env)
    if env.get("CHUNKMASTER_TLS_CERT") and args.tls_ca is None and args.tls_cert is None:
        print(
            f"chunkmaster-health: the master serves TLS (CHUNKMASTER_TLS_CERT): give --tls-ca "
            f"(or CHUNKMASTER_HEALTH_TLS_CA) to check it at {addr}",
            file=sys.stderr,
        )
        return USAGE
    try:
        security = ChannelSecurity.load(None, args.tls_ca, args.tls_cert, args.tls_key)
    except ValueError as exc:
        print(f"chunkmaster-health: {exc}", file=sys.stderr)
        return USAGE
    code, line = check(
        addr,
        security=security,
        server_name=args.server_name,
        service=args.service,
        timeout=args.timeout,
        standby_ok=args.standby_ok,
        leader=args.leader,
    )
    print(line, file=sys.stdout if code == HEALTHY else sys.stderr)
    return code


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The probe's flags, their defaults from the probe's variables in `env`."""
    p = argparse.ArgumentParser(
        prog="chunkmaster-health", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument("--addr", default=None, help="HOST:PORT (default: from the master's variables)")
    p.add_argument(
        "--tls-ca",
        default=env.get("CHUNKMASTER_HEALTH_TLS_CA") or None,
        metavar="FILE",
        help="talk TLS; the CA that signed the master's certificate (CHUNKMASTER_HEALTH_TLS_CA)",
    )
    p.add_argument(
        "--server-name",
        default=env.get("CHUNKMASTER_HEALTH_SERVER_NAME") or None,
        help="the name the master's certificate carries (CHUNKMASTER_HEALTH_SERVER_NAME)",
    )
    p.add_argument(
        "--tls-cert",
        default=env.get("CHUNKMASTER_HEALTH_TLS_CERT") or None,
        metavar="FILE",
        help="a client certificate, when the master asks for one (--tls-client-ca)",
    )
    p.add_argument(
        "--tls-key", default=env.get("CHUNKMASTER_HEALTH_TLS_KEY") or None, metavar="FILE"
    )
    p.add_argument("--service", default="", help="the service to ask about (default: the server)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    p.add_argument(
        "--standby-ok",
        action="store_true",
        default=_flag(env, "CHUNKMASTER_HEALTH_STANDBY_OK"),
        help="nothing listening counts as healthy: an etcd standby (CHUNKMASTER_HEALTH_STANDBY_OK)",
    )
    p.add_argument(
        "--leader",
        action="store_true",
        help="healthy only while the master leads (a readiness probe that makes the leader the "
        "only ready master); a standby is not, whatever --standby-ok says",
    )
    return p


if __name__ == "__main__":
    sys.exit(main())
