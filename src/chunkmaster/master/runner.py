"""Running a master process: pick the store, recover, serve, and stop cleanly.

One path for every store: campaign for the lock (on etcd a standby waits here; a master on an
embedded store leads at once, `leadership.Alone`), recover, listen, and only then publish the
address (on etcd under the lease, so it never points at a master that cannot answer). Losing
the lock stops serving at once. The ready file, if asked
for, is written last: once it exists, the master answers at the address it holds.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import logging
import os
import resource
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chunkmaster.master.auth import is_loopback, server_credentials, server_ssl_context
from chunkmaster.master.checkpoint_file import read_checkpoint
from chunkmaster.master.config import MasterConfig
from chunkmaster.master.leadership import Alone, Leadership
from chunkmaster.master.metrics import (
    MAX_HTTP_CLIENTS,
    MasterMetrics,
    MetricsServer,
    RpcMetrics,
    start_metrics,
)
from chunkmaster.master.readiness import remove_ready_file, write_ready_file
from chunkmaster.master.server import MasterServer
from chunkmaster.master.service import Service
from chunkmaster.store.base import Store

log = logging.getLogger("chunkmaster.master")


def external_ip() -> str:
    """This host's first non-loopback IPv4 address on an interface that is up (what trainers
    elsewhere can reach), read from the interfaces themselves: no packet is sent."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("256s", name[:15].encode())
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req), 16)[0]
                if not flags & _IFF_UP:
                    continue
                ip = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24])
            except OSError:  # no IPv4 address on this interface
                continue
        if not ip.startswith("127."):
            return ip
    raise OSError("no non-loopback IPv4 address: are you connected to the network?")


_SIOCGIFFLAGS, _SIOCGIFADDR, _IFF_UP = 0x8913, 0x8915, 0x1  # Linux ioctl numbers


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (services often start
    with a soft limit of 1024 and a far higher hard one); the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:  # e.g. above the kernel's nr_open
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, want, exc)
    return soft


#: Descriptors kept for everything but RPC connections: the store, the metrics port and its
#: clients, etcd, dataset files being indexed, gRPC's and Python's own, and the connections
#: over the limit, which hold a descriptor from their accept to their close.
RESERVED_FDS = 128 + 2 * MAX_HTTP_CLIENTS


def connection_limit(open_files: int) -> int:
    """RPC connections served at once under an open-file limit: a flood of connections then
    never leaves the master without a descriptor to accept, write or answer with."""
    return max(open_files // 2, open_files - RESERVED_FDS)


def default_store_path(job: str) -> Path:
    """Where a job's embedded store lives unless --store says otherwise (XDG state dir)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "chunkmaster" / f"{job}.db"


def build_store(config: MasterConfig) -> tuple[Store, Leadership]:
    """The store the config names and the leadership that comes with it: etcd's election, or
    for an embedded store a master alone (modules imported only by the master that uses them)."""
    if config.etcd is not None:
        from chunkmaster.etcd.journal import EtcdStore

        etcd = EtcdStore(config.etcd, ttl_sec=config.ttl_sec, job=config.job)
        return etcd, etcd
    if config.store == ":memory:":
        from chunkmaster.store.memory import InMemStore

        return InMemStore(), Alone()
    from chunkmaster.store.sqlite import SqliteStore

    path = config.store or default_store_path(config.job or "default")
    store = SqliteStore(
        path, synchronous=config.store_sync, job=config.job, on_damage=config.store_on_damage
    )
    return store, Alone()


def _log_protection(config: MasterConfig, host: str) -> None:
    """One line at start-up saying who can reach this master and what they must prove."""
    tls = "no TLS" if config.tls_cert is None else "TLS"
    if config.tls_client_ca is not None:
        tls = "mutual TLS"
    token = "a token" if config.token is not None else "no token"
    if not config.protected and is_loopback(host):
        log.info(
            "no TLS and no token: listening on loopback only (%s); give --tls-cert/--tls-key "
            "or --token-file to serve other hosts",
            host,
        )
    elif not config.protected:
        log.warning("--insecure: listening on %s with no TLS and no token: anyone can call", host)
    else:
        log.info("security: %s, %s", tls, token)
    if config.data_roots:
        log.info("datasets must lie under: %s", ", ".join(config.data_roots))
    if config.storage_options:  # the keys only: the values may be credentials
        log.info("storage options for URL datasets: %s", ", ".join(sorted(config.storage_options)))


async def run_master(config: MasterConfig, install_signals: Callable[[asyncio.Event], None]) -> int:
    """Serve until asked to stop. On etcd, a master that loses the lock (an etcd outage longer
    than its TTL, a lease revoked behind its back) stops serving at once and campaigns again as
    a standby: the job outlives etcd outages without a supervisor restarting its masters."""
    stop = asyncio.Event()
    install_signals(stop)
    if config.ready_file is not None:
        remove_ready_file(config.ready_file)  # a stale one must not pass for this master's
    credentials = None
    if config.tls_cert is not None and config.tls_key is not None:
        credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
    # Unprotected, a master beyond loopback was refused by its config unless --insecure.
    host = config.host or ("127.0.0.1" if config.etcd is None else external_ip())
    _log_protection(config, host)
    open_files = raise_open_files_limit()
    max_connections = connection_limit(open_files)
    log.info(
        "accepting at most %d RPC connections at once (open-file limit %d)",
        max_connections,
        open_files,
    )
    while await _serve(config, stop, credentials, host, max_connections):
        log.warning("campaigning for the master lock again, as a standby")
    return 0


async def _serve(
    config: MasterConfig, stop: asyncio.Event, credentials: Any, host: str, max_connections: int
) -> bool:
    """Lead (on etcd: once elected) and serve until stopped; True when the lock was lost."""
    store, leadership = build_store(config)
    log.info("state: %s", store.describe())
    if not await _elected(leadership, stop):
        await store.shutdown()
        return False
    service = await _started_service(store, config)
    settle_collector()
    metrics, http = await _metrics(service, config, host, leadership.elected)
    server = MasterServer(
        service,
        host,
        config.port,
        interceptors=() if metrics is None else (RpcMetrics(metrics),),
        credentials=credentials,
        token=config.token,
        max_connections=max_connections,
    )
    await server.start()
    await leadership.publish_addr(f"{host}:{server.port}")
    await server.set_leading()  # `chunkmaster-health --leader`: ready from here on
    log.info("serving on %s", server.address)
    if config.ready_file is not None:
        metrics_addr = None if http is None else http.address
        write_ready_file(
            config.ready_file, server.address, config.store_name, metrics_addr=metrics_addr
        )
    lost = asyncio.create_task(leadership.lost.wait())
    waiters: list[asyncio.Task[Any]] = [asyncio.create_task(stop.wait()), lost]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    was_lost = lost.done()
    if was_lost:
        log.critical(
            "lost the master lock: stopped serving at once so that the new leader alone serves"
        )
        if metrics is not None:
            metrics.leading(False, change=True)
        await server.stop(grace=0)
    else:
        log.info("shutting down")
        await server.stop(grace=1.0)
    for w in waiters:
        w.cancel()
    if http is not None:
        await http.stop()
    await service.close()
    gc.unfreeze()  # this service's objects, frozen at its start, can go now
    if config.ready_file is not None:
        remove_ready_file(config.ready_file)
    log.info("stopped")
    return was_lost and not stop.is_set()


# The collector's first threshold while serving: a keep-alive's short-lived objects (thousands
# a second from 10,000 sessions) no longer set off collections every few hundred allocations,
# each of which can cascade into a full pass over every session's objects (docs/limits.md).
SERVING_GC_THRESHOLDS = (50_000, 20, 100)


def settle_collector() -> None:
    """After recovery: freeze what recovery built (the dataset, the state, the modules), so
    the collector's full passes no longer walk it, and raise its thresholds for serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLDS)


async def _elected(leadership: Leadership, stop: asyncio.Event) -> bool:
    """Campaign until this master leads (True) or it is asked to stop first (False)."""
    campaign = asyncio.create_task(leadership.campaign())
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([campaign, waiter], return_when=asyncio.FIRST_COMPLETED)
    if not campaign.done():
        campaign.cancel()
        await leadership.shutdown()
        return False
    waiter.cancel()
    campaign.result()
    return True


async def _started_service(store: Store, config: MasterConfig) -> Service:
    """The service recovered from the store (and restored from --restore), or closed."""
    service = Service(store, config.settings())
    try:
        await service.start()
        if config.restore is not None:
            await service.restore(
                read_checkpoint(config.restore),
                replace=config.restore_replace,
                other_job=config.restore_other_job,
            )
    except Exception:
        await service.close()
        raise
    return service


async def _metrics(
    service: Service, config: MasterConfig, host: str, elected: bool
) -> tuple[MasterMetrics | None, MetricsServer | None]:
    """The metrics and dashboard server, if --metrics-port asks for one: the same rules as
    the RPC port (its token, its TLS)."""
    if config.metrics_port is None:
        return None, None
    tls = None
    if config.tls_cert is not None and config.tls_key is not None:
        tls = server_ssl_context(config.tls_cert, config.tls_key, config.tls_client_ca)
    return await start_metrics(
        service, host, config.metrics_port, elected=elected, token=config.token, ssl_context=tls
    )
