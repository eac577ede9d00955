"""A Client's options, in three groups, the way httpx groups its own (`Timeout`, `Limits`):
`Connection` (reaching the master: token, TLS, deadlines, retries, etcd), `Session` (progress
reports, the rank) and `Reading` (tasks in hand, shuffle buffer, object stores, decompression
limit), each checking its values when made, naming the field; every field in docs/client.md.
`Client(addr)` stays simple. The flat keyword arguments of before (`report_every=`, ...) still
work, each with a DeprecationWarning naming its replacement (`legacy`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from chunkmaster.client.connection import DEFAULT_TIMEOUT
from chunkmaster.client.link import DEFAULT_STARTUP_TIMEOUT
from chunkmaster.client.readahead import DEFAULT_BUDGET as DEFAULT_READ_AHEAD_BYTES
from chunkmaster.client.readahead import DEFAULT_CHUNKS as DEFAULT_READ_AHEAD
from chunkmaster.core.model import Task
from chunkmaster.inflate import DEFAULT_MAX_INFLATED, check_limit


@dataclass(frozen=True)
class Connection:
    """How the trainer reaches its master, and proves who it is (docs/client.md).

    `token` (default: CHUNKMASTER_TOKEN_FILE's, or CHUNKMASTER_TOKEN), TLS files (`tls_ca`
    turns TLS on; `tls_cert` and `tls_key` for mutual TLS), each call's `rpc_timeout` (plus
    `poll_wait` for a long poll), `retry_timeout` (a master lost mid-run; None: for ever),
    `startup_timeout` (the bound on getting started: a master that answers, with a dataset;
    None: for ever) and, with `etcd_endpoints`, `etcd_timeout`, `etcd_job`, `etcd_options`.
    """

    token: str | None = field(default=None, repr=False)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    rpc_timeout: float = DEFAULT_TIMEOUT
    poll_wait: float = 2.0
    retry_timeout: float | None = None
    startup_timeout: float | None = DEFAULT_STARTUP_TIMEOUT
    etcd_timeout: float = 5.0
    etcd_job: str | None = None
    etcd_options: Mapping[str, str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("rpc_timeout", "poll_wait", "etcd_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"Connection({name}={value!r}): must be more than 0 seconds")
        for name, none in (("retry_timeout", "retry"), ("startup_timeout", "wait")):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(
                    f"Connection({name}={value!r}): must be more than 0 seconds "
                    f"(None: {none} for ever)"
                )


@dataclass(frozen=True)
class Session:
    """The trainer's session with the master (docs/sessions.md): progress reports every
    `report_every` records (0: with the keep-alive only, every `report_interval` s at most), and
    the rank (default WORLD_SIZE and RANK; `world_size=0`: none; docs/equal-steps.md).
    """

    report_every: int = 1000
    report_interval: float = 5.0
    world_size: int | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        if self.report_every < 0 or not self.report_interval > 0:
            raise ValueError(
                f"Session(report_every={self.report_every}, report_interval="
                f"{self.report_interval}): report_every must be >= 0 and report_interval > 0"
            )


@dataclass(frozen=True)
class Reading:
    """How the trainer reads its tasks' records (docs/client.md): `prefetch_tasks` held ahead
    (None: as many as the trainer's pace needs, client/pace.py), a `shuffle_buffer` of records
    seeded by `shuffle_seed` (docs/shuffle.md), the fsspec `storage_options` (never sent to the
    master), `read_ahead` chunks in flight within `read_ahead_bytes` (docs/object-stores.md),
    and `max_inflated_bytes` one chunk may decompress to (docs/failures.md).
    """

    prefetch_tasks: int | None = None
    shuffle_buffer: int = 0
    shuffle_seed: int | None = None
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False)
    read_ahead: int = DEFAULT_READ_AHEAD
    read_ahead_bytes: int = DEFAULT_READ_AHEAD_BYTES
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED

    def __post_init__(self) -> None:
        if self.prefetch_tasks is not None and self.prefetch_tasks < 0:
            raise ValueError(f"prefetch_tasks must be 0 or more, not {self.prefetch_tasks}")
        if self.shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be 0 (off) or more, not {self.shuffle_buffer}")
        if self.read_ahead < 0:
            raise ValueError(f"read_ahead must be 0 (off) or more chunks, not {self.read_ahead}")
        if self.read_ahead and self.read_ahead_bytes < 1:
            raise ValueError(f"read_ahead_bytes must be 1 or more, not {self.read_ahead_bytes}")
        check_limit(self.max_inflated_bytes)


#: The flat keyword arguments of the Client before its options were grouped: old name ->
#: (group, field); None: it did nothing, and goes.
LEGACY: dict[str, tuple[str, str] | None] = {
    **{f.name: ("connection", f.name) for f in fields(Connection) if f.name != "token"},
    **{f.name: ("session", f.name) for f in fields(Session)},
    **{f.name: ("reading", f.name) for f in fields(Reading)},
    "buffer_size": None,
    "worker": ("", "name"),
}

#: The Client's own keyword arguments besides the address (what `resolve` takes by name).
GROUPED = ("token", "name", "session", "connection", "reading", "on_task_done")

_GROUP_NAMES = {"connection": "Connection", "session": "Session", "reading": "Reading"}


@dataclass(frozen=True)
class Options:
    """Everything a Client is made with, its groups resolved (`resolve`)."""

    addr: str | None
    etcd_endpoints: Sequence[str] | str | None
    name: str | None
    session: bool
    connection: Connection
    session_options: Session
    reading: Reading
    on_task_done: Callable[[Task], None] | None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that make a Client of these options (no legacy ones)."""
        return {
            "addr": self.addr,
            "etcd_endpoints": self.etcd_endpoints,
            "name": self.name,
            "session": self.session_options if self.session else False,
            "connection": self.connection,
            "reading": self.reading,
            "on_task_done": self.on_task_done,
        }


def resolve(
    *,
    addr: str | None = None,
    etcd_endpoints: Sequence[str] | str | None = None,
    token: str | None = None,
    name: str | None = None,
    session: bool | Session = True,
    connection: Connection | None = None,
    reading: Reading | None = None,
    on_task_done: Callable[[Task], None] | None = None,
    legacy: Mapping[str, Any] | None = None,
    stacklevel: int = 2,
) -> Options:
    """The Client's options from its keyword arguments. `legacy`: old flat ones, each moved
    into its group with a DeprecationWarning naming the replacement, pointed at the code
    `stacklevel` frames up from the caller of this function (2: whoever called the caller).
    TypeError for an unknown one or one given two ways; ValueError for a bad value or
    address."""
    if (addr is None) == (etcd_endpoints is None):
        raise ValueError("give exactly one of addr and etcd_endpoints")
    if not isinstance(session, bool | Session):
        raise TypeError(f"session must be True, False or a chunkmaster.Session, not {session!r}")
    groups: dict[str, Any] = {
        "connection": connection or Connection(),
        "session": session if isinstance(session, Session) else Session(),
        "reading": reading or Reading(),
    }
    given = {"connection": connection, "session": session, "reading": reading}
    moved, name = _move_legacy(legacy or {}, given, name, stacklevel + 2)
    for group, values in moved.items():
        if values:
            groups[group] = replace(groups[group], **values)
    conn: Connection = groups["connection"]
    if token is not None:
        if conn.token is not None:
            raise TypeError("Client() got both token= and Connection(token=...)")
        conn = replace(conn, token=token)
    return Options(
        addr=addr,
        etcd_endpoints=etcd_endpoints,
        name=name,
        session=session is not False,
        connection=conn,
        session_options=groups["session"],
        reading=groups["reading"],
        on_task_done=on_task_done,
    )


def _move_legacy(
    legacy: Mapping[str, Any], given: Mapping[str, object], name: str | None, stacklevel: int
) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The flat options of before, moved into their groups ({group: {field: value}}), and the
    trainer's name (`worker=`, once); a DeprecationWarning each, `stacklevel` frames up."""
    moved: dict[str, dict[str, Any]] = {g: {} for g in given}
    for old, value in legacy.items():
        if old not in LEGACY:
            raise TypeError(f"Client() got an unexpected keyword argument {old!r}")
        target = LEGACY[old]
        if target is None:
            warnings.warn(
                f"Client({old}=...) does nothing and is deprecated: remove it (no records "
                "are read ahead; tasks are, as many as the trainer's pace needs, or "
                "Reading(prefetch_tasks=...))",
                DeprecationWarning,
                stacklevel=stacklevel,
            )
            continue
        group, attr = target
        if not group:  # worker: the trainer's name
            warnings.warn(
                f"Client({old}=...) is deprecated: use Client(name=...)",
                DeprecationWarning,
                stacklevel=stacklevel,
            )
            if name is not None:
                raise TypeError(f"Client() got both {old}= and name=")
            name = value
            continue
        if isinstance(given[group], Connection | Session | Reading):
            raise TypeError(
                f"Client() got both {old}= and {group}=: give {attr} in {_GROUP_NAMES[group]}(...)"
            )
        warnings.warn(
            f"Client({old}=...) is deprecated: use Client({group}="
            f"chunkmaster.{_GROUP_NAMES[group]}({attr}=...))",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        moved[group][attr] = value
    return moved, name
