"""`chunkmaster read`: a reference trainer that reads passes and prints what it got.

Per pass it prints the record count and the order-independent digest (chunkmaster.digest), so
the outputs of several trainers can be added up and compared with the dataset's own digest; for
a mixture (`--source`, docs/mixtures.md) the same per source, from the tasks' sources.
With --task-lines it also prints each task it completed (its last record taken), which is what
counts for a trainer that may be killed: its completed tasks are not handed out again.
A chunk that cannot be read stops it (exit 1), unless --continue-on-read-error: then the error
is printed, the master hands the task out again or quarantines it (docs/failures.md), and the
pass goes on. A job stopped by its error budget exits 1 printing the master's error.
However it ends (the last pass read, an error, SIGTERM or Ctrl-C), it closes its client: the
session's Goodbye hands the tasks it holds back at once, and no thread of the client is left
when the process exits. SIGTERM exits 143, Ctrl-C 130; a second one while the client closes
ends the process at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from chunkmaster import logs
from chunkmaster.cli.common import (
    CliError,
    add_master_location,
    add_security_flags,
    etcd_credentials,
    security_kwargs,
)
from chunkmaster.core.sizes import parse_size
from chunkmaster.inflate import DEFAULT_MAX_INFLATED
from chunkmaster.logs import plural

if TYPE_CHECKING:
    from chunkmaster.client import Client, Source, TaskReadError
    from chunkmaster.core.model import Task
    from chunkmaster.digest import Digest

log = logging.getLogger("chunkmaster.cli.read")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "read",
        help="read passes from a master like a trainer, printing counts and digests",
        description=(
            "A reference trainer: sets the dataset (the first trainer's call wins), reads N "
            "passes through the master and prints, per pass, the records it got and their "
            "digest (sum mod 2^64 of the first 8 bytes of each record's SHA-256; a record that "
            "is not bytes, as JSON Lines, text and Parquet datasets give, is hashed as its "
            "canonical JSON encoding: docs/formats.md). On a terminal it shows a progress bar "
            "of the pass in records (every trainer's, as the master counts them) with the rate "
            "and the time left; never with --json or when its output is redirected. Relative "
            "dataset patterns are this trainer's: it says what each one becomes."
        ),
    )
    _add_master_flags(p)
    _add_output_flags(p)
    _add_reading_flags(p)
    _add_storage_flags(p)
    _add_waiting_flags(p)
    p.add_argument("--log-level", default="warning", help="debug, info, warning, error")
    add_security_flags(p)
    p.set_defaults(func=run)


def _add_master_flags(p: argparse.ArgumentParser) -> None:
    """Where the master is, and the dataset this trainer sets."""
    add_master_location(p, follows=", and follow it when it moves")
    p.add_argument(
        "--dataset",
        nargs="+",
        metavar="GLOB",
        help="dataset file patterns to set (omit when another trainer sets them)",
    )
    p.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="NAME=PATTERN@WEIGHT",
        help="instead of --dataset, a mixture: one source's pattern and weight (@WEIGHT may "
        "be left out: 1); repeat it for every source, or for more patterns of one. With "
        "--json each pass line also has each source's records and digest (docs/mixtures.md)",
    )


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    """What the reference trainer reads and prints."""
    p.add_argument("--passes", type=int, required=True, help="number of passes to read")
    p.add_argument("--first-pass", type=int, default=0, help="pass number to start at")
    p.add_argument("--json", action="store_true", help="one JSON object per line per pass")
    p.add_argument(
        "--task-lines",
        action="store_true",
        help="with --json, also one line per completed task (task, epoch, records, digest)",
    )
    p.add_argument(
        "--step-time",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sleep after each record (stands in for training)",
    )
    p.add_argument(
        "--continue-on-read-error",
        action="store_true",
        help="a chunk that cannot be read is printed (with --json as a line with read_error) "
        "and the pass goes on; the master, told of it, hands the task out again or "
        "quarantines it. Each pass line then also says how many read errors this trainer met "
        "and how many records the master quarantined in that pass (unknown, JSON null, for a "
        "pass its status no longer shows: it shows the last two)",
    )


def _add_reading_flags(p: argparse.ArgumentParser) -> None:
    """How the trainer reads: its rank, prefetch and shuffle."""
    p.add_argument(  # a flag without effect: hidden from --help, warned about (run)
        "--buffer-size", type=int, default=None, help=argparse.SUPPRESS
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        metavar="N",
        help="this trainer is one of N ranks (with --rank); default: the WORLD_SIZE and RANK "
        "variables when set. With --equal-steps on the master, each pass is shared among "
        "exactly the N ranks, once all are there",
    )
    p.add_argument("--rank", type=int, default=None, help="this trainer's rank, 0 to N-1")
    p.add_argument(
        "--prefetch-tasks",
        type=int,
        default=None,
        metavar="N",
        help="tasks held ahead of the one being read (default: as many as cover a round trip "
        "to the master at the pace the trainer reads them, 1 for slow tasks; docs/client.md). "
        "The master's task timeout runs for every task held",
    )
    p.add_argument(
        "--shuffle-buffer",
        type=int,
        default=0,
        metavar="N",
        help="hand records out in a random order drawn from a buffer of N records, across "
        "the tasks held (default 0: off; not with --task-lines); a job whose master has "
        "--shuffle-window is read in its shuffled order anyway; see docs/shuffle.md",
    )
    p.add_argument(
        "--shuffle-seed",
        type=int,
        default=None,
        metavar="S",
        help="seed of the shuffle buffer's draw, with the pass and the trainer's name "
        "(default: the master's --shuffle-seed, or 0)",
    )


def _add_storage_flags(p: argparse.ArgumentParser) -> None:
    """How the trainer reads its files: fsspec's options, read-ahead, the inflation bound."""
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the fsspec filesystem that reads URL datasets (s3fs: "
        "endpoint_url=URL, anon=true); repeat it for several. This trainer's own: never sent "
        "to the master. Credentials are better left in the library's usual places (AWS_* "
        "variables, ~/.aws)",
    )
    p.add_argument(
        "--read-ahead",
        type=int,
        default=8,
        metavar="CHUNKS",
        help="ranged reads of the next chunks kept in flight for object-store datasets "
        "(0: none; default 8)",
    )
    p.add_argument(
        "--max-inflated-bytes",
        type=_size,
        default=DEFAULT_MAX_INFLATED,
        metavar="BYTES",
        help="the most one chunk may decompress to (default 1GiB; 512MiB, 4GiB...): a chunk "
        "that would inflate to more is refused while it is decoded and reported failed, like "
        "any chunk that cannot be read (docs/failures.md)",
    )


def _add_waiting_flags(p: argparse.ArgumentParser) -> None:
    """How long a trainer waits for a master: to get started, and once reading."""
    p.add_argument(
        "--retry-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up after the master has been unreachable this long (default: never); "
        "an address that never answered is warned about once, saying what to check, then "
        "less and less often",
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="give up getting started after this long (default: %(default)g; 0: never): a "
        "master never reached, or one with no dataset (no --dataset here, none set by another "
        "trainer), ends the read naming the address and what it waited for; once reading, "
        "--retry-timeout bounds a master lost mid-run",
    )


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    logs.setup(getattr(logging, str(args.log_level).upper(), logging.WARNING))
    if args.passes < 0:
        raise CliError("--passes must be 0 or more")
    if args.shuffle_buffer < 0:
        raise CliError("--shuffle-buffer must be 0 (off) or more")
    if args.prefetch_tasks is not None and args.prefetch_tasks < 0:
        raise CliError(f"--prefetch-tasks must be 0 or more, not {args.prefetch_tasks}")
    if args.shuffle_buffer and args.task_lines:
        raise CliError("--task-lines and --shuffle-buffer do not go together (tasks get mixed)")
    if args.source and args.dataset:
        raise CliError("--dataset and --source do not go together: one list, or a mixture")
    sources = parse_sources(args.source)
    if args.buffer_size is not None:
        log.warning("--buffer-size does nothing and is deprecated: remove it")
    out = sys.stdout
    done: list[Task] = []
    stop = _Stop()
    with stop.installed():
        client = _make_client(args, done)
        try:
            with stop.raising():
                _read_all(client, args, sources, done, out)
        except _Terminated:
            pass  # the exit status says why it stopped
        finally:
            client.close()  # on every way out; a signal meanwhile is only noted
    return stop.status


def _read_all(
    client: Client,
    args: argparse.Namespace,
    sources: dict[str, Source],
    done: list[Task],
    out: IO[str],
) -> None:
    """Set the dataset if asked, then read the passes, printing a line per pass."""
    from chunkmaster.client import TaskReadError, TransportError
    from chunkmaster.client.errors import StartupTimeoutError
    from chunkmaster.core.errors import MasterError

    try:
        if args.dataset:
            _say_relative(args.dataset)
            client.set_dataset(args.dataset)
        elif sources:
            _say_relative([g for src in sources.values() for g in src.globs])
            client.set_dataset(sources)
        for p in range(args.first_pass, args.first_pass + args.passes):
            errors: list[TaskReadError] = []
            digests = _read_pass(client, p, args, done, out, errors)
            total = digests.total
            line: dict[str, Any] = {"pass": p, "records": total.count, "digest": total.hex()}
            if args.json and digests.sources:
                line["sources"] = digests.by_source()
            if args.continue_on_read_error:
                line["read_errors"] = len(errors)
                line["quarantined"] = _quarantined(client, p)
            if args.json:
                out.write(json.dumps(line) + "\n")
            else:
                extra = (
                    f", {plural(line['read_errors'], 'read error')}, "
                    + _quarantined_text(line["quarantined"], p)
                    if args.continue_on_read_error
                    else ""
                )
                out.write(f"pass {p}: {total.count} records, digest {total.hex()}{extra}\n")
            out.flush()
    except TaskReadError as exc:
        raise CliError(f"read error (reported to the master): {exc}") from None
    except (TransportError, StartupTimeoutError) as exc:  # they name the address, what to check
        raise CliError(str(exc)) from None
    except MasterError as exc:
        raise CliError(f"{type(exc).__name__}: {exc}") from None


class _Terminated(BaseException):
    """SIGTERM while reading: leaves the reading as an error would (not an Exception, so that
    nothing on the way takes it for one)."""


class _Stop:
    """SIGTERM and SIGINT for `read`: while reading (`raising()`) they raise (_Terminated,
    KeyboardInterrupt) where the reading is, so that it stops and the client closes; at any
    other time (the client closing) they are only noted, so that they do not cut close()
    short, and a second one ends the process at once, as if unhandled."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self._raise = False

    @property
    def status(self) -> int:
        """The exit status: 128 + the signal that stopped the trainer, 0 without one."""
        return 0 if self.received is None else 128 + self.received

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._raise:
            self._raise = False
            self.received = signum
            raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated()
        if self.received is not None:  # the second one: as if unhandled
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.received = signum

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers, in the main thread only (elsewhere the signals keep theirs)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = {sig: signal.signal(sig, self._on_signal) for sig in self.SIGNALS}
        try:
            yield
        finally:
            for sig, handler in before.items():
                if handler is not None:
                    signal.signal(sig, handler)

    @contextmanager
    def raising(self) -> Iterator[None]:
        """Signals raise inside (one that came before is raised now)."""
        if self.received == signal.SIGINT:
            raise KeyboardInterrupt
        if self.received is not None:
            raise _Terminated()
        self._raise = True
        try:
            yield
        finally:
            self._raise = False


def parse_sources(flags: list[str], flag_name: str = "--source") -> dict[str, Source]:
    """`--source NAME=PATTERN@WEIGHT` flags (or `weights --add`'s) as a mixture (a name
    repeated adds a pattern; its weights must agree); CliError naming the flag that is
    wrong."""
    from chunkmaster.client import Source

    patterns: dict[str, list[str]] = {}
    weights: dict[str, float] = {}
    for flag in flags:
        name, eq, rest = flag.partition("=")
        pattern, at, weight_text = rest.rpartition("@")
        if not at:
            pattern, weight_text = rest, "1"
        try:
            weight = float(weight_text)
        except ValueError:
            weight = math.nan
        if not eq or not name or not pattern or not math.isfinite(weight) or weight < 0:
            raise CliError(
                f"{flag_name} {flag!r}: expected NAME=PATTERN@WEIGHT (a weight >= 0; @WEIGHT may "
                "be left out)"
            )
        if weights.setdefault(name, weight) != weight:
            raise CliError(f"{flag_name} {flag!r}: source {name!r} has weight {weights[name]:g}")
        patterns.setdefault(name, []).append(pattern)
    return {name: Source(globs, weights[name]) for name, globs in patterns.items()}


def _make_client(args: argparse.Namespace, done: list[Task]) -> Client:
    """The trainer's client from the flags; a bad flag is a CliError."""
    from chunkmaster.client import Client, Connection, Reading, Session
    from chunkmaster.formats.options import parse_settings

    try:
        storage_options = parse_settings(args.storage_option)
    except ValueError as exc:
        raise CliError(f"--storage-option: {exc}") from None
    try:
        client = Client(
            args.addr,
            etcd_endpoints=args.endpoints,
            on_task_done=done.append,
            connection=Connection(
                etcd_job=args.job,
                etcd_options=etcd_credentials(args) or None,
                retry_timeout=args.retry_timeout,
                startup_timeout=args.startup_timeout or None,
                **security_kwargs(args),
            ),
            session=Session(world_size=args.world_size, rank=args.rank),
            reading=Reading(
                prefetch_tasks=args.prefetch_tasks,
                storage_options=storage_options,
                read_ahead=args.read_ahead,
                shuffle_buffer=args.shuffle_buffer,
                shuffle_seed=args.shuffle_seed,
                max_inflated_bytes=args.max_inflated_bytes,
            ),
        )
    except (RuntimeError, ValueError) as exc:
        raise CliError(str(exc)) from None
    return client


def _say_relative(patterns: list[str]) -> None:
    """Relative patterns are this trainer's (sent absolute): say once what they became."""
    for pattern in patterns:
        if pattern and "://" not in pattern and not os.path.isabs(pattern):
            print(
                f"dataset pattern {pattern!r} is relative: read as {os.path.abspath(pattern)!r} "
                "(this trainer's working directory)",
                file=sys.stderr,
                flush=True,
            )


def _quarantined(client: Client, p: int) -> int | None:
    """Records of pass `p` the master quarantined; None if its status no longer lists the pass
    (it shows the last two: a trainer that reached `p` after the others had read past it)."""
    ledger = client.status().get("ledger")
    for led in ledger if isinstance(ledger, list) else ():
        if isinstance(led, dict) and led.get("pass") == p:
            return int(led.get("quarantined", 0))
    return None


def _quarantined_text(records: int | None, p: int) -> str:
    if records is None:
        return f"records quarantined by the master unknown (its status no longer shows pass {p})"
    return f"{records} records quarantined by the master"


def _records_past_errors(client: Client, p: int, errors: list[TaskReadError]) -> Iterator[bytes]:
    """The records of pass `p`, going on past chunks that cannot be read (kept in `errors`;
    the client has reported each to the master)."""
    from chunkmaster.client import EndOfPass, TaskReadError

    client.start_get_records(p)
    while True:
        try:
            yield client.next_record()
        except EndOfPass:
            return
        except TaskReadError as exc:
            errors.append(exc)
            print(f"read error (reported to the master): {exc}", file=sys.stderr, flush=True)


class PassDigests:
    """A pass's digests: all its records, the task being read, and (for a mixture) each
    source's, from the tasks' sources. Records of a task come in order, one task after the
    other (no shuffle buffer), so the records since the last task completed are the next
    task's; a task that ended in a read error gives its source the records read of it. Each
    record is hashed once: per task, added to the whole at each task's end."""

    def __init__(self, per_task: bool) -> None:
        from chunkmaster.digest import Digest

        self.whole = Digest()
        self.task = Digest()
        self.per_task = per_task
        self.count = 0
        self.sources: dict[str, Digest] = {}

    @property
    def total(self) -> Digest:
        """Every record of the pass read so far."""
        from chunkmaster.digest import Digest

        out = Digest(self.whole.value, self.whole.count)
        out.merge(self.task)
        return out

    def add(self, record: Any) -> None:
        self.count += 1
        (self.task if self.per_task else self.whole).add(record)

    def read_error(self, exc: TaskReadError) -> None:
        """The task being read ended in a read error: its records so far are its source's."""
        self._close(exc.task.source, self.task)

    def tasks_done(self, done: list[Task], out: IO[str] | None) -> None:
        """Tasks completed by the last take: the records since the last one are the first's
        with records (printed with --task-lines, to `out`)."""
        from chunkmaster.digest import Digest

        for task in done:
            d = self.task if task.num_records else Digest()
            if out is not None:
                _emit_task(task, d, out)
            if task.num_records or d.count:
                self._close(task.source, d)
        if out is not None:
            out.flush()

    def _close(self, source: str, d: Digest) -> None:
        """The records of a task end: they join the whole, and their source's."""
        from chunkmaster.digest import Digest

        if not self.per_task:
            return
        self.whole.merge(d)
        if source:
            self.sources.setdefault(source, Digest()).merge(d)
        self.task = Digest()

    def by_source(self) -> dict[str, dict[str, Any]]:
        return {n: {"records": d.count, "digest": d.hex()} for n, d in sorted(self.sources.items())}


def _read_pass(
    client: Client,
    p: int,
    args: argparse.Namespace,
    done: list[Task],
    out: IO[str],
    errors: list[TaskReadError],
) -> PassDigests:
    """Read pass `p` to its end; with --task-lines print each task as it completes.

    `done` is filled by the client's on_task_done callback, during the call that returns the
    task's last record, so after adding that record the task digest is exactly the task's.
    """
    step = args.step_time
    tasks = bool(args.json and args.task_lines)
    digests = PassDigests(per_task=tasks or (args.json and not args.shuffle_buffer))
    bar = PassBar(client, p) if _show_bar(args) else None
    done.clear()
    seen = 0
    records = (
        _records_past_errors(client, p, errors)
        if args.continue_on_read_error
        else client.records(p)
    )
    try:
        for record in records:
            if len(errors) != seen:  # a task ended in a read error: its digest starts over
                digests.read_error(errors[-1])
                seen = _emit_errors(errors, seen, p, args.json, out)
            digests.add(record)
            if done:
                digests.tasks_done(done, out if tasks else None)
                done.clear()
            if bar is not None:
                bar.tick(digests.count)
            if step:
                time.sleep(step)
        if len(errors) != seen:
            digests.read_error(errors[-1])
        _emit_errors(errors, seen, p, args.json, out)
        if done:  # tasks without records, finished at the very end
            digests.tasks_done(done, out if tasks else None)
        done.clear()
    finally:
        if bar is not None:
            bar.close()
    return digests


def _show_bar(args: argparse.Namespace) -> bool:
    """A progress bar only for a person: on a terminal (stdout and stderr), never in --json."""
    return not args.json and sys.stdout.isatty() and sys.stderr.isatty()


class PassBar:
    """A progress bar of pass `p` in records, for the whole job as the master counts them
    (every trainer's reports), with tqdm's rate and time left and this trainer's own count
    beside it. Asks the master at most every REFRESH seconds, from the reading loop."""

    REFRESH = 1.0

    def __init__(self, client: Client, p: int) -> None:
        from tqdm import tqdm

        self.client = client
        self.p = p
        done, total = self._figures()
        self.bar = tqdm(
            desc=f"pass {p}",
            unit="rec",
            total=total,
            initial=done or 0,
            file=sys.stderr,
            leave=False,
            dynamic_ncols=True,
        )
        self.next = time.monotonic() + self.REFRESH

    def _figures(self) -> tuple[int | None, int | None]:
        """(records done, records in the pass) of pass `p`; None when the master does not say."""
        st = self.client.status()
        prog = st.get("progress")
        if not isinstance(prog, dict) or prog.get("records_total") is None:
            return None, None
        total = int(prog["records_total"])
        cur = int(prog["pass"])
        if cur == self.p:
            return int(prog["records_done"]), total
        return (total if cur > self.p else 0), total

    def tick(self, mine: int) -> None:
        """A record was read (`mine` so far by this trainer): refresh the bar when it is time."""
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + self.REFRESH
        done, total = self._figures()
        if total is not None and self.bar.total != total:
            self.bar.total = total
        self.bar.set_postfix_str(f"this trainer {mine:,}", refresh=False)
        if done is not None and done > self.bar.n:
            self.bar.update(done - self.bar.n)
        else:
            self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _emit_errors(errors: list[TaskReadError], seen: int, p: int, js: bool, out: IO[str]) -> int:
    """With --json, a line per read error from `seen` on; returns how many are shown."""
    if js:
        for exc in errors[seen:]:
            line = {"pass": p, "failed_task": exc.task.meta.id, "read_error": exc.reason}
            out.write(json.dumps(line) + "\n")
    return len(errors)


def _emit_task(task: Task, d: Digest, out: IO[str]) -> None:
    """A --task-lines line: the task completed and the digest of the records read of it."""
    line: dict[str, Any] = {
        "task": task.meta.id,
        "epoch": task.meta.epoch,
        "pass": task.pass_id,
        "start": task.start,  # records before it were consumed by an earlier holder
        "records": d.count,
        "digest": d.hex(),
    }
    if task.source:
        line["source"] = task.source
    out.write(json.dumps(line) + "\n")
