"""What a trainer's calls raise, besides the master's own errors (chunkmaster.core.errors)."""

from __future__ import annotations

from chunkmaster.client.connection import UNREACHABLE_ADVICE, TransportError
from chunkmaster.core.model import Chunk, Task
from chunkmaster.formats.changed import FileChangedError
from chunkmaster.recordio.errors import RecordIOError


class EndOfPass(Exception):
    """The master has moved past this pass: every task of it is done."""

    def __init__(self, pass_id: int) -> None:
        super().__init__(f"end of pass {pass_id}")
        self.pass_id = pass_id


class StartupTimeoutError(TimeoutError):
    """The client did not get started within Connection(startup_timeout): the master answered
    but has no dataset (no trainer called set_dataset). The message names the address, the
    wait and what to do. (A master never reached raises NeverConnectedError.)"""


class ClientClosedError(RuntimeError):
    """The client was closed."""


class TaskReadError(Exception):
    """A chunk of a task could not be opened or read; the master was told (TaskFailed).

    The records of the task before the bad chunk were delivered; the rest of the task is not.
    The pass goes on: call next_record() again to continue it.
    """

    def __init__(self, task: Task, chunk: Chunk, cause: BaseException) -> None:
        self.task = task
        self.chunk = chunk
        self.cause = cause
        self.reason = describe_read_error(chunk, cause)
        super().__init__(
            f"task {task.meta.id} (epoch {task.meta.epoch}, pass {task.pass_id}): {self.reason}"
        )


def describe_read_error(chunk: Chunk, cause: BaseException) -> str:
    """The failure reason sent to the master: file, chunk offset and size, and the error (a
    changed file: its own reason, which the master knows by its beginning)."""
    if isinstance(cause, FileChangedError):
        return cause.reason
    what = cause.reason if isinstance(cause, RecordIOError) else str(cause)
    return (
        f"cannot read {chunk.path} chunk at offset {chunk.offset} "
        f"({chunk.num_records} records): {type(cause).__name__}: {what}"
    )


def duration(seconds: float) -> str:
    """`seconds` as a person reads them: seconds, or minutes past two."""
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f} min"


class NeverConnectedError(TransportError):
    """A master that never answered at all since the client started: most likely a wrong
    address, or a master that wants TLS or a token. The message says what to check."""

    def __init__(self, last: TransportError, waited: float, bound: float | None = None) -> None:
        gave_up = (
            ""
            if bound is None
            else f"; gave up after Connection(startup_timeout={bound:g}) (None: wait for ever)"
        )
        Exception.__init__(
            self,
            f"never connected to {last.addr} in {duration(waited)} ({last.cause}): "
            + UNREACHABLE_ADVICE
            + gave_up,
        )
        self.addr, self.code, self.details = last.addr, last.code, last.details
