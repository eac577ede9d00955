"""`chunkmaster master`: run the master, with the original's flags and environment variables.

Each flag can also come from the environment: CHUNKMASTER_<NAME>, or the original's bare
<NAME> (PORT, TTL, ENDPOINTS, TASK_TIMOUT_DUR, ...). The command line wins over the
environment, which wins over the default. Flags and variables are read as text here and turned
into a `MasterConfig`, whose errors are reported naming the flag or the variable at fault.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import errno
import logging
import os
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chunkmaster.cli.common import CliError
from chunkmaster.core.checkpoint import CheckpointError
from chunkmaster.core.codec import CodecError
from chunkmaster.core.errors import MasterError
from chunkmaster.core.mixture import MixtureError
from chunkmaster.core.shuffle import MAX_WINDOW, ShuffleSeedError, ShuffleWindowError
from chunkmaster.master.config import ConfigError, MasterConfig
from chunkmaster.store.base import StoreError
from chunkmaster.tokens import TOKEN_ENV, TOKEN_FILE_ENV

log = logging.getLogger("chunkmaster.cli.master")

LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "crit": logging.CRITICAL,
}

#: Exit code of a command line or environment the master cannot run with (as argparse's).
USAGE_EXIT = 2


@dataclass(frozen=True)
class Setting:
    """One flag: the config field it fills, its spellings and its environment variables."""

    field: str
    flags: tuple[str, ...]
    env: tuple[str, ...]
    help: str
    metavar: str | None = None
    const: str | None = None  # a flag that may be given bare means this
    append: bool = False  # the flag may be repeated; its values are joined with `joiner`
    joiner: str = ","

    @property
    def flag(self) -> str:
        return self.flags[0]


def _env(name: str) -> tuple[str, ...]:
    return (f"CHUNKMASTER_{name}", name)


SETTINGS = (
    Setting(
        "port",
        ("--port",),
        _env("PORT"),
        "RPC port; 0 picks a free one (default 8080). A port in use stops the master at once, "
        "in one line",
    ),
    Setting(
        "host",
        ("--host",),
        _env("HOST"),
        "interface to listen on (default 127.0.0.1 with the embedded store; "
        "with --endpoints, this host's first non-loopback IPv4 address). "
        "Use 0.0.0.0 to accept trainers from every interface. A non-loopback address "
        "needs TLS or a token, or --insecure",
    ),
    Setting(
        "tls_cert",
        ("--tls-cert",),
        _env("TLS_CERT"),
        "serve gRPC over TLS with this certificate file (PEM; with --tls-key)",
        "FILE",
    ),
    Setting(
        "tls_key",
        ("--tls-key",),
        _env("TLS_KEY"),
        "the TLS certificate's private key file (PEM; with --tls-cert)",
        "FILE",
    ),
    Setting(
        "tls_client_ca",
        ("--tls-client-ca",),
        _env("TLS_CLIENT_CA"),
        "mutual TLS: every client must present a certificate signed by this CA (PEM)",
        "FILE",
    ),
    Setting(
        "token_file",
        ("--token-file",),
        (TOKEN_FILE_ENV,),
        "every call must carry the token held in this file (as 'authorization: Bearer "
        "TOKEN'; one line of printable ASCII); or set CHUNKMASTER_TOKEN. Never a "
        "command-line value: other users could read it",
        "PATH",
    ),
    Setting(
        "insecure",
        ("--insecure",),
        _env("INSECURE"),
        "listen on a non-loopback address without TLS or a token (anyone who can reach "
        "the master can drive it)",
        "yes|no",
        const="yes",
    ),
    Setting(
        "data_roots",
        ("--data-root",),
        _env("DATA_ROOT"),
        "a directory or URL prefix (s3://bucket/data/) datasets must lie in; repeat it for "
        "several (comma-separated in the variable). Only the URL schemes of the roots are "
        "allowed; without it, datasets are local paths only",
        "ROOT",
        append=True,
    ),
    Setting(
        "storage_option",
        ("--storage-option",),
        ("CHUNKMASTER_STORAGE_OPTION",),
        "an option of the fsspec filesystem that reads URL datasets (s3fs: endpoint_url=URL, "
        "anon=true, client_kwargs.region_name=eu-west-1); repeat it for several (one per line "
        "in the variable). true/false/numbers are read as such. Credentials are better left "
        "to the library's own places (AWS_* variables, ~/.aws) or --storage-options-file: "
        "other users can read a command line. Never logged",
        "KEY=VALUE",
        append=True,
        joiner="\n",
    ),
    Setting(
        "storage_options_file",
        ("--storage-options-file",),
        _env("STORAGE_OPTIONS_FILE"),
        "a JSON object of fsspec storage options for URL datasets (--storage-option entries "
        "override its keys). Never logged",
        "FILE",
    ),
    Setting(
        "endpoints",
        ("--endpoints",),
        _env("ENDPOINTS"),
        "comma-separated etcd endpoints; empty (default) uses the embedded store",
    ),
    Setting(
        "ttl_sec",
        ("--ttl",),
        _env("TTL"),
        "etcd lease TTL in seconds: bounds failover after a crash (default 60)",
    ),
    Setting(
        "job",
        ("--job",),
        _env("JOB"),
        "job name: namespaces the etcd keys and names the default store file",
    ),
    Setting(
        "etcd_ca",
        ("--etcd-ca",),
        _env("ETCD_CA"),
        "CA certificate file to verify etcd's TLS certificate",
    ),
    Setting(
        "etcd_cert",
        ("--etcd-cert",),
        _env("ETCD_CERT"),
        "client certificate file for etcd (with --etcd-key)",
    ),
    Setting(
        "etcd_key",
        ("--etcd-key",),
        _env("ETCD_KEY"),
        "client private key file for etcd (with --etcd-cert)",
    ),
    Setting(
        "etcd_user",
        ("--etcd-user",),
        _env("ETCD_USER"),
        "etcd user name; the password comes from CHUNKMASTER_ETCD_PASSWORD "
        "(never from the command line, where other users could read it)",
    ),
    Setting(
        "task_timeout",
        ("--task-timeout-dur", "--task-timout-dur"),
        ("CHUNKMASTER_TASK_TIMEOUT_DUR", "TASK_TIMEOUT_DUR", "TASK_TIMOUT_DUR"),
        "when a held task is handed out again: for a trainer with a session, once it has "
        "made no progress for this long (stuck, not slow); for one without, this long after "
        "the task was handed to it (Go-style duration: 20m, 90s, 1.5h; default 20m). "
        "--task-timout-dur is the original's spelling",
    ),
    Setting(
        "task_timeout_max",
        ("--task-timeout-max",),
        _env("TASK_TIMEOUT_MAX"),
        "failures a task may have before it is quarantined (default 3)",
    ),
    Setting(
        "trainer_ttl",
        ("--trainer-ttl",),
        _env("TRAINER_TTL"),
        "how long a trainer with a session may stay silent before its session ends and the "
        "tasks it holds go back to the queue (Go-style duration or seconds; default 10s)",
    ),
    Setting(
        "rank_wait",
        ("--rank-wait",),
        _env("RANK_WAIT"),
        "with --equal-steps and trainers that declare a world size (WORLD_SIZE, RANK): how "
        "long a pass waits for every rank before refusing with the missing ones named "
        "(default 5m)",
    ),
    Setting(
        "index_timeout",
        ("--index-timeout",),
        _env("INDEX_TIMEOUT"),
        "longest time reading one file's chunk index may take before set_dataset fails "
        "naming the file (a hung file system); default 2m",
    ),
    Setting(
        "max_inflated_bytes",
        ("--max-inflated-bytes",),
        _env("MAX_INFLATED_BYTES"),
        "the most a compressed dataset file (.jsonl.gz, .txt.zst, .tfrecord.gz) may inflate to "
        "when set_dataset counts its records (default 1GiB; 512MiB, 4GiB...): a file that "
        "would inflate to more is refused, naming it. Trainers have their own limit "
        "(Reading(max_inflated_bytes=...), read --max-inflated-bytes)",
        "BYTES",
    ),
    Setting(
        "restore",
        ("--restore",),
        _env("RESTORE"),
        "start from this data checkpoint (`chunkmaster checkpoint save`): the store must be "
        "empty, unless --restore-replace; the dataset is indexed again and must match",
        "FILE",
    ),
    Setting(
        "restore_replace",
        ("--restore-replace",),
        _env("RESTORE_REPLACE"),
        "with --restore: replace the state a store already holds (default: refuse)",
        "yes|no",
        const="yes",
    ),
    Setting(
        "restore_other_job",
        ("--restore-other-job",),
        _env("RESTORE_OTHER_JOB"),
        "with --restore: accept a data checkpoint another job (--job) saved (default: refuse "
        "it, naming both jobs)",
        "yes|no",
        const="yes",
    ),
    Setting(
        "chunks_per_task",
        ("--chunk-per-task",),
        _env("CHUNK_PER_TASK"),
        "chunks per task (RecordIO/TFRecord chunks, Parquet row groups, JSON Lines/text "
        "byte ranges); 0 or less means 1. Default: the master chooses when it indexes the "
        "dataset: the most chunks, up to 10, that still cut it into at least 64 tasks, else 1 "
        "(a mixture: for its smallest source)",
    ),
    Setting(
        "chunk_size",
        ("--chunk-size",),
        ("CHUNKMASTER_CHUNK_SIZE",),  # a bare CHUNK_SIZE variable means too many things
        "the most bytes of a chunk the master cuts itself: whole lines of JSON Lines and text "
        "files (default 32KiB: a 1 MB file makes several tasks), whole frames of TFRecord and "
        "samples of WebDataset files (default 4MiB); a longer line, frame or sample is a chunk "
        "of its own. RecordIO chunks and Parquet row groups are the files' own. Sizes: 65536, "
        "64KiB, 4MiB",
        "SIZE",
    ),
    Setting(
        "format",
        ("--format",),
        ("CHUNKMASTER_FORMAT",),  # a bare FORMAT variable means too many things
        "the dataset files' format: recordio, parquet, jsonl, text, ... (see docs/formats.md); "
        "default: by each file's name (.rio/.recordio, .parquet, .jsonl, .txt, ...; no known "
        "ending: recordio). A dataset holds files of one format",
        "NAME",
    ),
    Setting(
        "failed_policy",
        ("--failed-policy",),
        _env("FAILED_POLICY"),
        "at a pass rollover, 'retry' puts quarantined tasks back with a fresh count; "
        "'keep' keeps them out of every later pass (their records count against each "
        "pass's --max-failed-records) and reports them (default retry)",
        "{retry,keep}",
    ),
    Setting(
        "max_failed_records",
        ("--max-failed-records",),
        _env("MAX_FAILED_RECORDS"),
        "error budget: the records one pass may lose to quarantined tasks (tasks that failed "
        "more than --task-timeout-max times), as a count (10) or a percentage of the "
        "dataset's records (0.1%%). Over it the job stops and trainers get an error naming "
        "the tasks, files and reasons; within it the pass goes on without them. Default "
        "unlimited (quarantined tasks are reported, the job never stops); see docs/failures.md",
        "N|P%|unlimited",
    ),
    Setting(
        "shuffle_seed",
        ("--shuffle-seed",),
        _env("SHUFFLE_SEED"),
        "shuffle every pass by this seed (0 to 2**64-1): the order tasks are handed out in, "
        "and which chunks form each task, differ every pass and are the same on every run, "
        "restart and failover. Fixed for the job once its dataset is set (default: off, "
        "tasks are runs of consecutive chunks in file order); see docs/shuffle.md",
        "S",
    ),
    Setting(
        "shuffle_window",
        ("--shuffle-window",),
        _env("SHUFFLE_WINDOW"),
        "trainers read each task's records in windows of this many records, each window "
        f"permuted by --shuffle-seed (needed), 0 to {MAX_WINDOW:,} (a trainer holds a window "
        "in memory). Fixed for the job once its dataset is set, as the seed (default 0: off, "
        "each task's records in file order); see docs/shuffle.md",
        "RECORDS",
    ),
    Setting(
        "equal_steps",
        ("--equal-steps",),
        _env("EQUAL_STEPS"),
        "for synchronous training: every trainer (session) of a pass gets the same number "
        "of records; the remainder is dropped for the pass ('drop') or short trainers get "
        "repeated records ('pad'). 'auto' (the default): 'drop' for trainers that declare a "
        "world size (torchrun's WORLD_SIZE, which DDP needs), 'off' for the others, and a "
        "job's trainers all of one kind; docs/equal-steps.md",
        "{auto,off,drop,pad}",
    ),
    Setting(
        "store",
        ("--store",),
        _env("STORE"),
        "embedded store file (default ~/.local/state/chunkmaster/<job>.db; missing folders "
        "are made, a folder that is a file or not writable stops the master at start); "
        "':memory:' keeps state in memory only",
    ),
    Setting(
        "store_sync",
        ("--store-sync",),
        _env("STORE_SYNC"),
        "SQLite synchronous mode: full survives power loss, normal only a "
        "killed process (default full)",
        "{full,normal}",
    ),
    Setting(
        "store_on_damage",
        ("--store-on-damage",),
        _env("STORE_ON_DAMAGE"),
        "a damaged embedded store: 'refuse' to start (default), 'move-aside' (rename its "
        "files to <name>.damaged-<time>* and start empty; nothing is deleted), or "
        "'accept-older' (continue from a sound but older database); a sound store opens as is",
        "{refuse,move-aside,accept-older}",
    ),
    Setting(
        "ready_file",
        ("--ready-file",),
        _env("READY_FILE"),
        "once the master serves (on etcd: leads and has published its address), atomically "
        'write {"addr": "HOST:PORT", "pid": N, "store": "sqlite"|"memory"|"etcd"} as JSON '
        "to this file; removed at a clean exit",
        "PATH",
    ),
    Setting(
        "metrics_port",
        ("--metrics-port",),
        _env("METRICS_PORT"),
        "serve Prometheus metrics (/metrics), the status as JSON (/status.json) and a live "
        "dashboard (/) over HTTP on this port, on the same interface as the RPC port; "
        "0 picks a free one (default: off)",
        "PORT",
    ),
    Setting(
        "log_format",
        ("--log-format",),
        _env("LOG_FORMAT"),
        "text (default) or json: one JSON object per line, with the pass, task and trainer "
        "it concerns",
        "{text,json}",
    ),
    Setting(
        "log_level",
        ("--log-level",),
        _env("LOG_LEVEL"),
        "debug, info, warn, error or crit (default info)",
        "LEVEL",
    ),
)

#: Variables that set what a flag sets now: a master started with one refuses to run rather
#: than ignore it.
RETIRED_ENV = {
    "CHUNKMASTER_LINES_CHUNK_BYTES": "--chunk-size (CHUNKMASTER_CHUNK_SIZE)",
    "CHUNKMASTER_TFRECORD_CHUNK_BYTES": "--chunk-size (CHUNKMASTER_CHUNK_SIZE)",
    "CHUNKMASTER_WEBDATASET_CHUNK_BYTES": "--chunk-size (CHUNKMASTER_CHUNK_SIZE)",
}

#: Settings that come only from the environment.
ENV_ONLY = {"etcd_password": ("CHUNKMASTER_ETCD_PASSWORD",), "token": (TOKEN_ENV,)}


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "master",
        help="run the master that hands tasks to trainers",
        description=(
            "Run the master. Without --endpoints it keeps its state in an embedded SQLite "
            "store (--store); with --endpoints it runs as a leader or hot standby on etcd. "
            "Every flag can be set from the environment as CHUNKMASTER_<FLAG> or the "
            "original's <FLAG> (e.g. PORT, TASK_TIMOUT_DUR); a CHUNKMASTER_* variable that "
            "is none of these is warned about, naming the closest one (save the Slurm "
            "recipe's own: CHUNKMASTER_SLURM_* and CHUNKMASTER_ADDR)."
        ),
    )
    for s in SETTINGS:
        # Text only, no default: the value and where it came from are settled in `gather`.
        metavar = s.metavar or s.flag.removeprefix("--").upper().replace("-", "_")
        extra: dict[str, Any] = {} if s.const is None else {"nargs": "?", "const": s.const}
        if s.append:
            extra["action"] = "append"
        p.add_argument(*s.flags, dest=s.field, default=None, metavar=metavar, help=s.help, **extra)
    p.set_defaults(func=run)


def gather(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """The text of every setting given, and where each came from (a flag or a variable).

    A setting that was not given is named by its flag, so errors about it still read well.
    """
    texts: dict[str, str] = {}
    sources: dict[str, str] = {}
    for s in SETTINGS:
        sources[s.field] = s.flag
        value = getattr(args, s.field)
        if isinstance(value, list):
            value = s.joiner.join(value)
        if value is not None:
            texts[s.field] = value
            continue
        for name in s.env:
            if environ.get(name):
                texts[s.field], sources[s.field] = environ[name], name
                break
    for field, names in ENV_ONLY.items():
        sources[field] = names[0]
        for name in names:
            if environ.get(name):
                texts[field] = environ[name]
                break
    return texts, sources


@dataclass(frozen=True)
class Logging:
    level: str = "info"
    format: str = "text"


def config_from(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> tuple[MasterConfig, Logging]:
    """The master's config and how to log, or a CliError naming the flag or variable."""
    for name, instead in RETIRED_ENV.items():
        if environ.get(name):
            raise CliError(f"{name}: no longer read: use {instead}", USAGE_EXIT)
    texts, sources = gather(args, environ)
    level = texts.pop("log_level", "info")
    log_format = texts.pop("log_format", "text")
    if log_format not in ("text", "json"):
        raise CliError(f"{sources['log_format']}: {log_format!r} is not text or json", USAGE_EXIT)
    if level not in LOG_LEVELS:
        raise CliError(
            f"{sources['log_level']}: {level!r} is not one of {', '.join(sorted(LOG_LEVELS))}",
            USAGE_EXIT,
        )
    try:
        return MasterConfig.from_text(texts), Logging(level, log_format)
    except ConfigError as exc:
        named = " and ".join(sources.get(f, f) for f in exc.fields)
        raise CliError(f"{named}: {exc.message}", USAGE_EXIT) from None


def setup_logging(level: str, fmt: str = "text") -> None:
    from chunkmaster import logs

    logs.setup(LOG_LEVELS[level], fmt)


def run(args: argparse.Namespace) -> int:
    config, logging_ = config_from(args, os.environ)
    check_ports(config, gather(args, os.environ)[1])
    setup_logging(logging_.level, logging_.format)
    for warning in unknown_variables(os.environ):
        log.warning("%s", warning)
    from chunkmaster.master.runner import run_master

    try:
        return asyncio.run(run_master(config, _install_stop_signals))
    except StoreError as exc:  # a damaged or shared store: the message says what to do
        raise CliError(str(exc)) from None
    except CodecError as exc:  # a snapshot or entry of a newer version: the text names both
        raise CliError(f"cannot read the job's state in {_state_place(config)}: {exc}") from None
    except ShuffleWindowError as exc:  # the store's job has another shuffle window
        raise CliError(f"--shuffle-window: {exc}", USAGE_EXIT) from None
    except ShuffleSeedError as exc:  # the store's job has another seed
        raise CliError(f"--shuffle-seed: {exc}", USAGE_EXIT) from None
    except MixtureError as exc:  # the store's job is a mixture: no --failed-policy keep
        raise CliError(f"--failed-policy: {exc}", USAGE_EXIT) from None
    except (CheckpointError, MasterError) as exc:  # --restore refused: the text says why
        raise CliError(f"--restore {config.restore}: {exc}") from None


def _state_place(config: MasterConfig) -> str:
    """Where the master keeps the job's state, for a message."""
    if config.etcd is not None:
        return f"etcd (job {config.job or 'default'!r})"
    from chunkmaster.master.runner import default_store_path

    return f"the store {config.store or default_store_path(config.job or 'default')}"


#: Every CHUNKMASTER_* variable chunkmaster reads (the master's settings, and the token that
#: `read`, `status` and the Client take too).
KNOWN_VARIABLES = frozenset(
    name
    for names in (*(s.env for s in SETTINGS), *ENV_ONLY.values(), tuple(RETIRED_ENV))
    for name in names
    if name.startswith("CHUNKMASTER_")
)


#: What the Slurm recipe (deploy/slurm/chunkmaster.sbatch) sets or reads for itself and its
#: trainer steps: its own namespace, and the master's address it hands the steps. Not
#: chunkmaster's settings, but not misspelt ones either.
RECIPE_PREFIX = "CHUNKMASTER_SLURM_"
RECIPE_VARIABLES = frozenset({"CHUNKMASTER_ADDR"})


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each CHUNKMASTER_* variable chunkmaster does not read (a misspelt one
    would otherwise be ignored without a word), naming the closest known one; the Slurm
    recipe's own (RECIPE_PREFIX, RECIPE_VARIABLES) are not warned about."""
    warnings = []
    for name in sorted(environ):
        if not name.startswith("CHUNKMASTER_") or name in KNOWN_VARIABLES:
            continue
        if name.startswith(RECIPE_PREFIX) or name in RECIPE_VARIABLES:
            continue
        # Alike after the prefix they all share: CHUNKMASTER_XYZZY is like none of them.
        known = {v.removeprefix("CHUNKMASTER_"): v for v in KNOWN_VARIABLES}
        mine = name.removeprefix("CHUNKMASTER_")
        close = difflib.get_close_matches(mine, sorted(known), n=3, cutoff=0.6)
        best = [known[c] for c in close if _likeness(mine, c) >= _likeness(mine, close[0]) - 0.02]
        hint = (
            f"did you mean {' or '.join(best)}?" if best else "no chunkmaster setting has that name"
        )
        warnings.append(f"{name} is not a chunkmaster variable ({hint}): ignored")
    return warnings


def _likeness(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def check_ports(config: MasterConfig, sources: Mapping[str, str]) -> None:
    """Stop with one line if a port the master is to listen on is taken (or not this user's
    to take), before the store is opened; gRPC would otherwise print its own lines and a
    traceback. The server's own bind still decides (a port taken in between fails there)."""
    if config.host is not None:
        host = config.host
    elif config.etcd is None:
        host = "127.0.0.1"
    else:
        from chunkmaster.master.runner import external_ip

        try:
            host = external_ip()
        except OSError:
            return  # the runner says so, in its own words
    for field, port in (("port", config.port), ("metrics_port", config.metrics_port)):
        if not port:
            continue  # 0 picks a free one
        source = sources.get(field, "--" + field.replace("_", "-"))
        named = f"{source} {port}" if source.startswith("-") else f"{source}={port}"
        why = _bind_problem(host, port)
        if why == errno.EADDRINUSE:
            raise CliError(
                f"{named}: {host}:{port} is in use (another master or program: `ss -ltnp "
                f"'sport = :{port}'` shows which); stop it, or give another port (0 picks a "
                "free one)"
            )
        if why == errno.EACCES:
            raise CliError(
                f"{named}: not allowed to listen on {host}:{port} (ports below 1024 need "
                "privileges); give another port (0 picks a free one)"
            )


def _bind_problem(host: str, port: int) -> int | None:
    """The errno of binding `host:port` as the master's servers would, or None if it binds."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return None  # a host that does not resolve: the server's bind says so
    for family, kind, proto, _, where in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
            try:
                s.bind(where)
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    return exc.errno
    return None


def _install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
