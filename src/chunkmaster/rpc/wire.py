"""Conversions between the wire (protobuf, gRPC status) and chunkmaster's own values/errors.

Shared by the server and the client so the two can never disagree on a mapping.
"""

from __future__ import annotations

import functools

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from chunkmaster.core import errors
from chunkmaster.core.model import Chunk, Task, TaskMeta
from chunkmaster.logs import printable
from chunkmaster.rpc import master_pb2 as pb

ERROR_KEY = "chunkmaster-error"
MAX_BATCH = 64
"""The most tasks one NextTask gets (a larger max_tasks gets this many): a message's size stays
bounded, whatever a client asks for."""

_CODES: dict[type[errors.MasterError], grpc.StatusCode] = {
    errors.PassBeforeError: grpc.StatusCode.OUT_OF_RANGE,
    errors.PassAfterError: grpc.StatusCode.OUT_OF_RANGE,
    errors.NoMoreAvailableError: grpc.StatusCode.NOT_FOUND,
    errors.AllTaskFailedError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.NotReadyError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.NoDatasetError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.DatasetError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.DatasetMismatchError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.NotAMixtureError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.TrainerIdEmptyError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.UnavailableError: grpc.StatusCode.UNAVAILABLE,
    errors.SessionExpiredError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.CheckpointRefusedError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    errors.JobStoppedError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.RanksMissingError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.WorldMismatchError: grpc.StatusCode.FAILED_PRECONDITION,
}
_BY_NAME: dict[str, type[errors.MasterError]] = {cls.__name__: cls for cls in _CODES}

MAX_TEXT = 1000
"""Bytes (UTF-8) kept of a free-text field of a request (FREE_TEXT: a trainer's name and host,
a worker ID, a failure reason): the master keeps, journals, logs and shows these, so each is
cut here, once, with its control characters escaped (`logs.printable`). A status holds a few
thousand of them at most, well within a gRPC message. A source's name (Source.name,
SourceWeight.name) is no free text: it names what it names, and a name that is not one is
refused as it was sent (core/mixture.py `name_problem`), never escaped or cut into another."""
FREE_TEXT = frozenset({"name", "host", "worker", "reason"})
_NAMES = frozenset({"Source", "SourceWeight"})  # messages whose `name` is a source's
MAX_STRING = 4096
"""Bytes of any other string of a request (a dataset pattern, a request, session or trainer
ID): one that is longer is refused (INVALID_ARGUMENT): cutting it would change what it names."""


def tidy_request(msg: Message) -> str | None:
    """Cut and escape the free text of a request (in place); the problem with a string that is
    too long to take, if there is one."""
    for field in _string_fields(msg.DESCRIPTOR):
        name = field.name
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.is_repeated:
                items = getattr(msg, name)
            elif msg.HasField(name):
                items = [getattr(msg, name)]
            else:
                continue
            for item in items:
                problem = tidy_request(item)
                if problem is not None:
                    return problem
        elif name in FREE_TEXT and not field.is_repeated and msg.DESCRIPTOR.name not in _NAMES:
            text = getattr(msg, name)
            if text:
                setattr(msg, name, clip_text(text))
        else:
            for item in getattr(msg, name) if field.is_repeated else [getattr(msg, name)]:
                size = len(item.encode())
                if size > MAX_STRING:
                    return (
                        f"{msg.DESCRIPTOR.name}.{name} is {size} bytes long, more than the "
                        f"{MAX_STRING} a master takes"
                    )
    return None


@functools.cache
def _string_fields(descriptor: Descriptor) -> tuple[FieldDescriptor, ...]:
    """The fields of a message type that are strings or may hold one (at any depth)."""
    return tuple(
        f
        for f in descriptor.fields
        if f.type == FieldDescriptor.TYPE_STRING
        or (f.type == FieldDescriptor.TYPE_MESSAGE and _string_fields(f.message_type))
    )


def clip_text(text: str) -> str:
    """`text` escaped (`logs.printable`) and cut to at most MAX_TEXT bytes of UTF-8, saying
    how much was cut."""
    text = printable(text)
    data = text.encode()
    if len(data) <= MAX_TEXT:
        return text
    note = f"... ({len(data)} bytes, cut)"
    return data[: MAX_TEXT - len(note)].decode(errors="ignore") + note


def status_code_of(exc: errors.MasterError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in _CODES:
            return _CODES[cls]
    return grpc.StatusCode.UNKNOWN


def error_from_name(name: str, message: str) -> errors.MasterError | None:
    """The master error named `name` (a session stream's SessionError), or None if unknown."""
    cls = _BY_NAME.get(name)
    return None if cls is None else cls(message or None)


def error_from_rpc(exc: grpc.RpcError) -> errors.MasterError | None:
    """The master's error carried by a failed call, or None for a transport failure."""
    if not isinstance(exc, grpc.Call):
        return None
    name = ""
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_KEY:
            name = value if isinstance(value, str) else value.decode()
    cls = _BY_NAME.get(name)
    if cls is None:
        return None
    return cls(exc.details() or None)


def task_to_pb(task: Task) -> pb.Task:
    return pb.Task(
        meta=pb.TaskMeta(id=task.meta.id, epoch=task.meta.epoch),
        chunks=[
            pb.Chunk(
                path=c.path,
                offset=c.offset,
                num_records=c.num_records,
                length=c.length,
                file_size=c.file_size,
                file_mtime_ns=c.file_mtime_ns,
            )
            for c in task.chunks
        ],
        pass_id=task.pass_id,
        start=task.start,
        end=task.end,
        format="" if task.format == "recordio" else task.format,
        failures=task.failures,
        source=task.source,
        order_key=task.order_key,
        shuffle_window=task.shuffle_window,
    )


def task_from_pb(msg: pb.Task) -> Task:
    return Task(
        TaskMeta(msg.meta.id, msg.meta.epoch),
        tuple(
            Chunk(c.path, c.offset, c.num_records, c.length, c.file_size, c.file_mtime_ns)
            for c in msg.chunks
        ),
        msg.pass_id,
        msg.start,
        msg.end,
        msg.format or "recordio",
        msg.failures,
        msg.source,
        msg.order_key,
        msg.shuffle_window,
    )
