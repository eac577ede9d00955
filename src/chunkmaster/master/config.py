"""The master's configuration: one typed, validated value between the command line and the runner.

`MasterConfig.from_text` turns the texts a user wrote (flags or environment variables, keyed
by field name) into a config; the constructor checks every value. Both raise `ConfigError`
naming the fields at fault, so the caller can name the flag or the variable they came from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from chunkmaster.core.budget import ErrorBudget
from chunkmaster.core.model import FailedPolicy
from chunkmaster.core.shuffle import MAX_SEED, MAX_WINDOW
from chunkmaster.core.sizes import parse_size
from chunkmaster.etcd.options import EtcdOptions
from chunkmaster.formats import options as storage_opts
from chunkmaster.master.auth import is_loopback
from chunkmaster.master.roots import DataRoots
from chunkmaster.master.settings import (
    DEFAULTS,
    MAX_CHUNK_SIZE,
    SettingError,
    Settings,
    StepsSetting,
)
from chunkmaster.store.directory import folder_problem
from chunkmaster.tokens import given_token, read_token

__all__ = [
    "ETCD_FIELDS",
    "STORAGE_FIELDS",
    "TEXT_FIELDS",
    "ConfigError",
    "MasterConfig",
    "parse_duration",
    "parse_size",
]

STORE_SYNC_MODES = ("full", "normal")
EQUAL_STEPS_MODES = tuple(m.value for m in StepsSetting)
STORE_ON_DAMAGE = ("refuse", "move-aside", "accept-older")


#: MasterConfig's field for each Settings field it names otherwise (the flags' names).
_FIELD_OF = {
    "timeout_dur": "task_timeout",
    "failure_max": "task_timeout_max",
    "error_budget": "max_failed_records",
    "max_inflated": "max_inflated_bytes",
    "dataset_format": "format",
}


class ConfigError(ValueError):
    """A configuration value is wrong; `fields` names the fields at fault."""

    def __init__(self, fields: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.fields = fields
        self.message = message


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse a Go-style duration ("20m", "1.5s", "1h2m3s", "300ms") into seconds.

    A bare number is taken as seconds, which Go would reject; users type it.
    """
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    sign = 1.0
    if s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    try:
        return sign * float(s)
    except ValueError:
        pass
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r} (examples: 20m, 1.5s, 1h30m, 500ms)")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def _chunk_size(text: str) -> int | None:
    if not text.strip():
        return None
    value = parse_size(text)
    if not 1 <= value <= MAX_CHUNK_SIZE:
        raise ValueError(f"{text!r} is not a chunk size from 1 byte to 1GiB")
    return value


def _integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def _optional(text: str) -> str | None:
    return text or None


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a yes/no value (true, false, 1, 0)")


def _roots(text: str) -> tuple[str, ...]:
    roots = tuple(part.strip() for part in text.split(",") if part.strip())
    DataRoots(roots)  # BadRoot (a ValueError) names a root in no one spelling
    return roots


def _seed(text: str) -> int | None:
    if not text.strip():
        return None
    value = _integer(text)
    if not 0 <= value <= MAX_SEED:
        raise ValueError(f"{value} is not a shuffle seed (0 to 2**64-1)")
    return value


def _window(text: str) -> int:
    if not text.strip():
        return 0
    value = _integer(text)
    if not 0 <= value <= MAX_WINDOW:
        raise ValueError(
            f"{value} is not a shuffle window: 0 (off) to {MAX_WINDOW:,} records (a trainer "
            "holds a whole window's records in memory)"
        )
    return value


def _policy(text: str) -> FailedPolicy:
    try:
        return FailedPolicy(text)
    except ValueError:
        names = ", ".join(p.value for p in FailedPolicy)
        raise ValueError(f"{text!r} is not one of {names}") from None


def _equal_steps(text: str) -> str:
    if text not in EQUAL_STEPS_MODES:
        raise ValueError(f"{text!r} is not one of {', '.join(EQUAL_STEPS_MODES)}")
    return text


def _store_sync(text: str) -> str:
    if text not in STORE_SYNC_MODES:
        raise ValueError(f"{text!r} is not one of {', '.join(STORE_SYNC_MODES)}")
    return text


def _store_on_damage(text: str) -> str:
    if text not in STORE_ON_DAMAGE:
        raise ValueError(f"{text!r} is not one of {', '.join(STORE_ON_DAMAGE)}")
    return text


#: How each plain field is read from text.
TEXT_FIELDS: dict[str, Callable[[str], Any]] = {
    "port": _integer,
    "host": _optional,
    "ttl_sec": _integer,
    "job": _optional,
    "task_timeout": parse_duration,
    "task_timeout_max": _integer,
    "trainer_ttl": parse_duration,
    "rank_wait": parse_duration,
    "index_timeout": parse_duration,
    "max_inflated_bytes": parse_size,
    "restore": _optional,
    "restore_replace": _flag,
    "restore_other_job": _flag,
    "chunks_per_task": _integer,
    "chunk_size": _chunk_size,
    "format": _optional,
    "failed_policy": _policy,
    "max_failed_records": ErrorBudget.parse,
    "shuffle_seed": _seed,
    "shuffle_window": _window,
    "equal_steps": _equal_steps,
    "store": _optional,
    "store_sync": _store_sync,
    "store_on_damage": _store_on_damage,
    "ready_file": _optional,
    "metrics_port": _integer,
    "tls_cert": _optional,
    "tls_key": _optional,
    "tls_client_ca": _optional,
    "insecure": _flag,
    "data_roots": _roots,
}

#: The texts that make up `MasterConfig.storage_options`: KEY=VALUE lines, a JSON file.
STORAGE_FIELDS = ("storage_option", "storage_options_file")

#: The texts that make up `MasterConfig.etcd` (empty `endpoints`: no etcd).
ETCD_FIELDS = ("endpoints", "etcd_ca", "etcd_cert", "etcd_key", "etcd_user", "etcd_password")


@dataclass(frozen=True)
class MasterConfig:
    """Everything a master process needs to run; see `chunkmaster master --help`."""

    port: int = 8080
    #: Interface to listen on; None means loopback, or with etcd the first external address.
    host: str | None = None
    #: Where the shared state and the lock live; None means the embedded store.
    etcd: EtcdOptions | None = None
    ttl_sec: int = 60
    job: str | None = None
    task_timeout: float = DEFAULTS.timeout_dur
    task_timeout_max: int = DEFAULTS.failure_max
    #: Seconds a silent trainer keeps its session (and the tasks it holds).
    trainer_ttl: float = DEFAULTS.trainer_ttl
    #: Seconds a pass with equal steps waits for every rank of a declared world size.
    rank_wait: float = DEFAULTS.rank_wait
    #: Seconds one file's chunk index may take to read before SetDataset fails naming it.
    index_timeout: float = DEFAULTS.index_timeout
    #: Bytes a compressed dataset file may inflate to when it is indexed (chunkmaster.inflate).
    max_inflated_bytes: int = DEFAULTS.max_inflated
    #: A data checkpoint file to start from (`chunkmaster checkpoint save`).
    restore: str | None = None
    #: With `restore`: replace a store that already holds state.
    restore_replace: bool = False
    #: With `restore`: accept a checkpoint another job (`--job`) saved.
    restore_other_job: bool = False
    #: None: the master chooses chunks per task for each dataset (core/task_size.py).
    chunks_per_task: int | None = DEFAULTS.chunks_per_task
    #: The most bytes of a chunk the master cuts (JSON Lines, text, TFRecord, WebDataset);
    #: None: each format's default (formats' `chunk_size`).
    chunk_size: int | None = None
    #: The dataset files' format (chunkmaster.formats); None: by the files' name endings.
    format: str | None = None
    failed_policy: FailedPolicy = DEFAULTS.failed_policy
    #: Records one pass may lose to quarantined tasks before the job stops (docs/failures.md).
    max_failed_records: ErrorBudget = field(default_factory=ErrorBudget)
    #: Shuffle each pass's task order and the chunks of each task by this seed; None: off.
    shuffle_seed: int | None = None
    #: Trainers read each task's records in windows of this many, each permuted by the seed;
    #: 0: off (file order).
    shuffle_window: int = 0
    #: Equal records per trainer in a pass: off, drop or pad (docs/equal-steps.md).
    equal_steps: str = DEFAULTS.equal_steps.value
    #: Embedded store file or ":memory:"; None means the default file of the job.
    store: str | None = None
    store_sync: str = "full"
    #: What to do with a damaged embedded store (see docs/store.md); a sound one opens as is.
    store_on_damage: str = "refuse"
    #: Where to write the ready file (see chunkmaster.master.readiness); None: none.
    ready_file: str | None = None
    #: Port of the metrics and dashboard HTTP server (0 picks a free one); None: no server.
    metrics_port: int | None = None
    #: TLS certificate and key files; both or neither.
    tls_cert: str | None = None
    tls_key: str | None = None
    #: With TLS: clients must present a certificate signed by this CA (mutual TLS).
    tls_client_ca: str | None = None
    #: The shared token every call must carry (never printed: repr=False).
    token: str | None = field(default=None, repr=False)
    #: Listen on a non-loopback address without TLS or a token.
    insecure: bool = False
    #: Directories or URL prefixes datasets must lie in; empty: local paths only, anywhere.
    data_roots: tuple[str, ...] = ()
    #: Handed to the fsspec filesystem of URL datasets; may hold credentials (never printed).
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def protected(self) -> bool:
        """Whether callers must prove something (a token, or a certificate under mTLS)."""
        return self.tls_cert is not None or self.token is not None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(("port",), f"{self.port} is not a TCP port (0 to 65535)")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(
                ("metrics_port",), f"{self.metrics_port} is not a TCP port (0 to 65535)"
            )
        if self.ttl_sec < 1:
            raise ConfigError(("ttl_sec",), f"{self.ttl_sec} is not a TTL: at least 1 second")
        self.settings()  # the job's settings: checked once, there
        for name in ("restore_replace", "restore_other_job"):
            if getattr(self, name) and self.restore is None:
                raise ConfigError((name,), "only means something with a restore file")
        if self.store_sync not in STORE_SYNC_MODES:
            raise ConfigError(("store_sync",), f"{self.store_sync!r} is not full or normal")
        if self.store_on_damage not in STORE_ON_DAMAGE:
            raise ConfigError(("store_on_damage",), f"{self.store_on_damage!r} is not valid")
        if self.ready_file is not None and not os.path.isdir(
            os.path.dirname(os.path.abspath(self.ready_file))
        ):
            raise ConfigError(("ready_file",), f"the folder of {self.ready_file} does not exist")
        if self.etcd is not None and self.store is not None:
            raise ConfigError(
                ("store", "endpoints"), "cannot both be set (the state lives in one place)"
            )
        if self.store not in (None, ":memory:"):
            problem = folder_problem(Path(self.store).expanduser().resolve())
            if problem is not None:
                raise ConfigError(("store",), f"cannot keep the store at {self.store}: {problem}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(("tls_cert", "tls_key"), "a certificate and its key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError(
                ("tls_client_ca",), "checks clients over TLS: give --tls-cert and --tls-key too"
            )
        for name in ("tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ConfigError((name,), f"{path} is not a file")
        self._check_exposure()

    def _check_exposure(self) -> None:
        """Refuse to listen beyond loopback with nothing to keep strangers out."""
        if self.protected or self.insecure:
            return
        advice = (
            "anyone who can reach it could drive the master; protect it with --tls-cert and "
            "--tls-key or --token-file (or CHUNKMASTER_TOKEN), or pass --insecure"
        )
        if self.host is not None and not is_loopback(self.host):
            raise ConfigError(
                ("host",),
                f"{self.host} is not a loopback address and there is no TLS or token: " + advice,
            )
        if self.host is None and self.etcd is not None:
            raise ConfigError(
                ("endpoints",),
                "with etcd the master listens on this host's external address, and there is "
                "no TLS or token: " + advice + " (or --host 127.0.0.1 for a single machine)",
            )

    def settings(self) -> Settings:
        """The service's settings from these flags; a wrong value raises ConfigError naming
        the field (the flag) it came from."""
        try:
            return Settings(
                job=DEFAULTS.job if self.job is None else self.job,
                chunks_per_task=self.chunks_per_task,
                chunk_size=self.chunk_size,
                timeout_dur=self.task_timeout,
                failure_max=self.task_timeout_max,
                failed_policy=self.failed_policy,
                error_budget=self.max_failed_records,
                equal_steps=cast(StepsSetting, self.equal_steps),  # Settings converts it
                shuffle_seed=self.shuffle_seed,
                shuffle_window=self.shuffle_window,
                trainer_ttl=self.trainer_ttl,
                rank_wait=self.rank_wait,
                index_timeout=self.index_timeout,
                max_inflated=self.max_inflated_bytes,
                dataset_format=self.format,
                storage_options=self.storage_options,
                data_roots=self.data_roots,
            )
        except SettingError as exc:
            raise ConfigError((_FIELD_OF.get(exc.name, exc.name),), exc.message) from None

    @property
    def store_name(self) -> str:
        """What keeps the state: "etcd", "memory" or "sqlite"."""
        if self.etcd is not None:
            return "etcd"
        return "memory" if self.store == ":memory:" else "sqlite"

    @classmethod
    def from_text(cls, texts: Mapping[str, str]) -> MasterConfig:
        """A config from user-written texts keyed by field name (and ETCD_FIELDS); fields
        not given keep their defaults."""
        values: dict[str, Any] = {}
        for name, text in texts.items():
            if name in ETCD_FIELDS or name in ("token", "token_file", *STORAGE_FIELDS):
                continue
            if name not in TEXT_FIELDS:
                raise KeyError(f"no master setting called {name!r}")
            try:
                values[name] = TEXT_FIELDS[name](text)
            except ValueError as exc:
                raise ConfigError((name,), str(exc)) from None
        values["etcd"] = _etcd_options(texts)
        values["token"] = _token(texts)
        values["storage_options"] = _storage_options(texts)
        return cls(**values)


def _storage_options(texts: Mapping[str, str]) -> dict[str, Any]:
    """The JSON file's options (`storage_options_file`), then the `KEY=VALUE` lines
    (`storage_option`) over them."""
    found: dict[str, Any] = {}
    path = texts.get("storage_options_file") or None
    if path is not None:
        try:
            found = storage_opts.read_file(path)
        except ValueError as exc:
            raise ConfigError(("storage_options_file",), str(exc)) from None
    lines = [line for line in texts.get("storage_option", "").split("\n") if line.strip()]
    try:
        return storage_opts.merge(found, storage_opts.parse_settings(lines))
    except ValueError as exc:
        raise ConfigError(("storage_option",), str(exc)) from None


def _token(texts: Mapping[str, str]) -> str | None:
    """The token from a file (`token_file`) or the environment (`token`), never both."""
    path, token = texts.get("token_file") or None, texts.get("token") or None
    if path is not None and token is not None:
        raise ConfigError(("token_file", "token"), "give the token one way, not both")
    if path is None and token is None:
        return None
    try:
        return read_token(path) if path is not None else given_token((token or "").strip())
    except ValueError as exc:
        raise ConfigError(("token_file" if path is not None else "token",), str(exc)) from None


def _etcd_options(texts: Mapping[str, str]) -> EtcdOptions | None:
    def get(name: str) -> str | None:
        return texts.get(name) or None

    cert, key = get("etcd_cert"), get("etcd_key")
    if (cert is None) != (key is None):
        raise ConfigError(("etcd_cert", "etcd_key"), "a client certificate and its key go together")
    user = get("etcd_user")
    password = get("etcd_password") if user is not None else None
    if user is not None and password is None:
        raise ConfigError(("etcd_user", "etcd_password"), "the etcd user needs its password")
    endpoints = texts.get("endpoints", "")
    if not endpoints.strip():
        return None
    try:
        return EtcdOptions.parse(
            endpoints,
            ca_cert=get("etcd_ca"),
            cert_cert=cert,
            cert_key=key,
            user=user,
            password=password,
        )
    except ValueError as exc:
        raise ConfigError(("endpoints",), str(exc)) from None
