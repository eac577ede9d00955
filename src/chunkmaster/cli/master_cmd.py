"""`chunkmaster master`: run the master, with the original's flags and environment variables.

Each flag can also come from the environment: CHUNKMASTER_<NAME>, or the original's bare
<NAME> (PORT, TTL, ENDPOINTS, TASK_TIMOUT_DUR, ...). The command line wins over the
environment, which wins over the default.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from typing import Any

from chunkmaster.cli.common import CliError, env_default, parse_duration
from chunkmaster.core.model import FailedPolicy

log = logging.getLogger("chunkmaster.cli.master")

LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "crit": logging.CRITICAL,
}


def _env(name: str, default: str) -> str:
    return env_default((f"CHUNKMASTER_{name}", name), default)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "master",
        help="run the master that hands tasks to trainers",
        description=(
            "Run the master. Without --endpoints it keeps its state in an embedded SQLite "
            "store (--store); with --endpoints it runs as a leader or hot standby on etcd. "
            "Every flag can be set from the environment as CHUNKMASTER_<FLAG> or the "
            "original's <FLAG> (e.g. PORT, TASK_TIMOUT_DUR)."
        ),
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(_env("PORT", "8080")),
        help="RPC port; 0 picks a free one (default 8080)",
    )
    p.add_argument(
        "--host",
        default=_env("HOST", ""),
        help="interface to listen on (default 127.0.0.1 with the embedded store; "
        "with --endpoints, this host's first non-loopback IPv4 address). "
        "Use 0.0.0.0 to accept trainers from every interface",
    )
    p.add_argument(
        "--endpoints",
        default=_env("ENDPOINTS", ""),
        help="comma-separated etcd endpoints; empty (default) uses the embedded store",
    )
    p.add_argument(
        "--ttl",
        type=int,
        default=int(_env("TTL", "60")),
        help="etcd lease TTL in seconds: bounds failover after a crash (default 60)",
    )
    p.add_argument(
        "--job",
        default=_env("JOB", ""),
        help="job name: namespaces the etcd keys and names the default store file",
    )
    p.add_argument("--etcd-ca", default=_env("ETCD_CA", "") or None,
                   help="CA certificate file to verify etcd's TLS certificate")
    p.add_argument("--etcd-cert", default=_env("ETCD_CERT", "") or None,
                   help="client certificate file for etcd (with --etcd-key)")
    p.add_argument("--etcd-key", default=_env("ETCD_KEY", "") or None,
                   help="client private key file for etcd (with --etcd-cert)")
    p.add_argument("--etcd-user", default=_env("ETCD_USER", "") or None,
                   help="etcd user name; the password comes from CHUNKMASTER_ETCD_PASSWORD "
                        "(never from the command line, where other users could read it)")
    timeout_default = env_default(
        ("CHUNKMASTER_TASK_TIMEOUT_DUR", "TASK_TIMEOUT_DUR", "TASK_TIMOUT_DUR"), "20m"
    )
    p.add_argument(
        "--task-timeout-dur",
        "--task-timout-dur",
        dest="task_timeout_dur",
        default=timeout_default,
        help="time a trainer has for one task before it is handed out again "
        "(Go-style duration: 20m, 90s, 1.5h; default 20m). "
        "--task-timout-dur is the original's spelling",
    )
    p.add_argument(
        "--task-timeout-max",
        type=int,
        default=int(_env("TASK_TIMEOUT_MAX", "3")),
        help="failures a task may have before it is set aside as failed (default 3)",
    )
    p.add_argument(
        "--chunk-per-task",
        type=int,
        default=int(_env("CHUNK_PER_TASK", "10")),
        help="RecordIO chunks per task; 0 or less means 1 (default 10)",
    )
    p.add_argument(
        "--failed-policy",
        choices=[x.value for x in FailedPolicy],
        default=_env("FAILED_POLICY", "retry"),
        help="at a pass rollover, 'retry' puts failed tasks back with a fresh count; "
        "'keep' keeps them out and reports them (default retry)",
    )
    p.add_argument(
        "--store",
        default=_env("STORE", ""),
        help="embedded store file (default ~/.local/state/chunkmaster/<job>.db); "
        "':memory:' keeps state in memory only",
    )
    p.add_argument(
        "--store-sync",
        choices=["full", "normal"],
        default=_env("STORE_SYNC", "full"),
        help="SQLite synchronous mode: full survives power loss, normal only a "
        "killed process (default full)",
    )
    p.add_argument(
        "--log-level",
        choices=sorted(LOG_LEVELS),
        default=_env("LOG_LEVEL", "info"),
        help="debug, info, warn, error or crit (default info)",
    )
    p.set_defaults(func=run)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=LOG_LEVELS[level],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def run(args: argparse.Namespace) -> int:
    try:
        args.timeout_seconds = parse_duration(args.task_timeout_dur)
    except ValueError as exc:
        raise CliError(f"--task-timeout-dur: {exc}") from None
    if args.timeout_seconds <= 0:
        raise CliError("--task-timeout-dur must be positive")
    if args.task_timeout_max < 0:
        raise CliError("--task-timeout-max must be 0 or more")
    if (args.etcd_cert is None) != (args.etcd_key is None):
        raise CliError("--etcd-cert and --etcd-key go together")
    args.etcd_password = os.environ.get("CHUNKMASTER_ETCD_PASSWORD") or None
    if args.etcd_user and args.etcd_password is None:
        raise CliError("--etcd-user needs the password in CHUNKMASTER_ETCD_PASSWORD")
    if args.endpoints.strip() and args.store:
        raise CliError("--store and --endpoints exclude each other: the state lives in one place")
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port} is not a TCP port")
    setup_logging(args.log_level)
    from chunkmaster.master.runner import run_master

    return asyncio.run(run_master(args, _install_stop_signals))


def _install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
