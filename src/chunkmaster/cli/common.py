"""Helpers shared by the command modules: errors, durations, and how to reach a master."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from chunkmaster.master.config import parse_duration

if TYPE_CHECKING:
    from chunkmaster.client.connection import ChannelSecurity, MasterConnection

T = TypeVar("T")

__all__ = [
    "CliError",
    "add_master_location",
    "add_security_flags",
    "ask_master",
    "channel_security",
    "duration_text",
    "etcd_credentials",
    "parse_duration",
    "security_kwargs",
]


class CliError(Exception):
    """A user-facing error: printed as one line, exits non-zero."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def duration_text(seconds: float) -> str:
    """A time for people, to the precision an estimate deserves: "8 s", "3 min", "1 h 5 min"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h" + (f" {minutes} min" if minutes else "")


def add_master_location(
    p: argparse.ArgumentParser, *, follows: str = "", positionals: bool = False
) -> None:
    """Where the master is: --addr, or etcd's --endpoints (the leader's address, which the
    command looks up; `follows`: what else it does with it) and --job. A command with
    positional arguments takes the endpoints as one comma-separated value (repeatable), so
    that they do not swallow its positionals."""
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--addr", help="the master's HOST:PORT")
    found = "ask the master whose address is at /master/addr (the leader's)" + follows
    if positionals:
        where.add_argument(
            "--endpoints",
            action="append",
            metavar="URL[,URL...]",
            help=f"etcd endpoints, comma-separated: {found}",
        )
    else:
        where.add_argument("--endpoints", nargs="+", metavar="URL", help=f"etcd endpoints: {found}")
    p.add_argument("--job", help="etcd key namespace of the job (with --endpoints)")
    for flag, dest, env, text in ETCD_FLAGS:
        p.add_argument(
            flag,
            dest=dest,
            metavar="FILE" if "user" not in dest else "NAME",
            help=f"{text} (with --endpoints; default: ${env})",
        )


#: The etcd credentials an operator command or a trainer shows etcd: the master's flags and
#: variables (`chunkmaster master --help`), the password only from the environment.
ETCD_FLAGS = (
    ("--etcd-ca", "etcd_ca", "CHUNKMASTER_ETCD_CA", "CA certificate file to verify etcd's TLS"),
    ("--etcd-cert", "etcd_cert", "CHUNKMASTER_ETCD_CERT", "client certificate file for etcd"),
    ("--etcd-key", "etcd_key", "CHUNKMASTER_ETCD_KEY", "the key of --etcd-cert"),
    (
        "--etcd-user",
        "etcd_user",
        "CHUNKMASTER_ETCD_USER",
        "etcd user name; the password comes from $CHUNKMASTER_ETCD_PASSWORD",
    ),
)


def etcd_credentials(args: argparse.Namespace) -> dict[str, str]:
    """`EtcdOptions.parse`'s credentials from the etcd flags, else their variables; a flag
    given without --endpoints, or a user without its password, is a CliError. The variables
    are the environment's, read only with --endpoints (a command with --addr asks no etcd)."""
    given = [flag for flag, dest, _, _ in ETCD_FLAGS if getattr(args, dest) is not None]
    if given and not args.endpoints:
        raise CliError(f"{given[0]} is for etcd: give --endpoints too (or leave it out)", 2)
    if not args.endpoints:
        return {}  # the variables serve commands that ask etcd; --addr asks none
    found = {dest: getattr(args, dest) or os.environ.get(env) for _, dest, env, _ in ETCD_FLAGS}
    out = {
        key: value
        for key, value in (
            ("ca_cert", found["etcd_ca"]),
            ("cert_cert", found["etcd_cert"]),
            ("cert_key", found["etcd_key"]),
            ("user", found["etcd_user"]),
        )
        if value
    }
    if "user" in out:
        password = os.environ.get("CHUNKMASTER_ETCD_PASSWORD")
        if not password:
            raise CliError(
                f"--etcd-user {out['user']}: its password comes from CHUNKMASTER_ETCD_PASSWORD, "
                "which is not set",
                2,
            )
        out["password"] = password
    return out


def add_security_flags(p: argparse.ArgumentParser) -> None:
    """The flags that say what a command shows a protected master (docs/security.md)."""
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="file holding the master's token (default: the file CHUNKMASTER_TOKEN_FILE "
        "names, or the CHUNKMASTER_TOKEN variable)",
    )
    p.add_argument(
        "--tls-ca", metavar="FILE", help="talk TLS; this CA (PEM) signs the master's certificate"
    )
    p.add_argument("--tls-cert", metavar="FILE", help="this client's certificate (mutual TLS)")
    p.add_argument("--tls-key", metavar="FILE", help="the key of --tls-cert")


def channel_security(args: argparse.Namespace) -> ChannelSecurity:
    """What the flags of `add_security_flags` ask for, or a CliError naming the bad one."""
    from chunkmaster.client.connection import ChannelSecurity

    try:
        return ChannelSecurity.load(_token(args), args.tls_ca, args.tls_cert, args.tls_key)
    except ValueError as exc:
        raise CliError(str(exc), 2) from None


def security_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The same, as `Client` keyword arguments (paths, the token read from its file, or the
    environment's: a bad variable is a CliError here, not an error of the Client's)."""
    from chunkmaster.tokens import environment_token

    token = _token(args)
    if token is None:
        try:
            token = environment_token()
        except ValueError as exc:
            raise CliError(str(exc), 2) from None
    return {
        "token": token,
        "tls_ca": args.tls_ca,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
    }


def _token(args: argparse.Namespace) -> str | None:
    """The token in the --token-file file, None without the flag; a CliError naming it."""
    from chunkmaster.tokens import read_token

    try:
        return None if args.token_file is None else read_token(args.token_file)
    except ValueError as exc:
        raise CliError(f"--token-file: {exc}", 2) from None


def ask_master(args: argparse.Namespace, call: Callable[[MasterConnection], T]) -> T:
    """One call to the master at --addr, or to the leader etcd names (--endpoints, --job), with
    the command's security flags; its errors (the master's, an unreachable master, no leader)
    become one CliError line. A leader that cannot be reached is looked up again once: it may
    have just handed over."""
    from chunkmaster.client.connection import TransportError

    if args.job and not args.endpoints:
        raise CliError("--job names a job in etcd: give --endpoints too", 2)
    if not args.endpoints:
        etcd_credentials(args)  # an etcd flag with --addr is refused
        return _ask(args, args.addr, call)
    from chunkmaster.etcd.discovery import MasterLocator
    from chunkmaster.etcd.options import EtcdOptions

    try:
        etcd = EtcdOptions.parse(
            [u for e in args.endpoints for u in e.split(",")], **etcd_credentials(args)
        )
    except ValueError as exc:
        raise CliError(f"--endpoints: {exc}", 2) from None
    with MasterLocator(etcd, job=args.job, timeout=args.timeout) as locator:
        addr = locator.wait_for_address(args.timeout)
        if addr is None:
            raise CliError(_no_leader(locator.key.decode(), args, etcd_error=locator.error))
        try:
            return _ask(args, addr, call, raw=True)
        except TransportError:
            again = locator.wait_change(addr, args.timeout)
            if again is None or again == addr:
                raise CliError(_no_leader(locator.key.decode(), args, addr)) from None
            return _ask(args, again, call)


def _no_leader(
    key: str,
    args: argparse.Namespace,
    unreachable: str | None = None,
    *,
    etcd_error: str | None = None,
) -> str:
    where = f"etcd ({' '.join(args.endpoints)})"
    if etcd_error is not None:
        return (
            f"cannot read {key} from {where} within {args.timeout:g}s ({etcd_error}): an etcd "
            "with TLS or users needs --etcd-ca, --etcd-cert/--etcd-key, --etcd-user"
        )
    if unreachable is not None:
        return (
            f"the master at {unreachable}, whose address {key} in {where} holds, cannot be "
            f"reached, and no other took its place within {args.timeout:g}s"
        )
    return (
        f"no master address at {key} in {where} within {args.timeout:g}s: is a master of "
        f"{'job ' + repr(args.job) if args.job else 'the default job'} running (--job)?"
    )


def _ask(
    args: argparse.Namespace, addr: str, call: Callable[[MasterConnection], T], *, raw: bool = False
) -> T:
    """The call to the master at `addr` (`raw`: its transport error raised as it is)."""
    from chunkmaster.client.connection import (
        UNREACHABLE_ADVICE,
        MasterConnection,
        TransportError,
    )
    from chunkmaster.core.errors import MasterError

    security = channel_security(args)
    with MasterConnection(addr, timeout=args.timeout, security=security) as conn:
        try:
            return call(conn)
        except TransportError as exc:
            if raw:
                raise
            raise CliError(
                f"cannot reach the master at {addr} ({exc.cause}): {UNREACHABLE_ADVICE}"
            ) from None
        except MasterError as exc:
            raise CliError(str(exc)) from None
