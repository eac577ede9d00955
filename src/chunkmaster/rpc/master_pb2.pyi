from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Chunk(_message.Message):
    __slots__ = ("path", "offset", "num_records")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    path: str
    offset: int
    num_records: int
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., num_records: _Optional[int] = ...) -> None: ...

class TaskMeta(_message.Message):
    __slots__ = ("id", "epoch")
    ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    id: int
    epoch: int
    def __init__(self, id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("meta", "chunks", "pass_id")
    META_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    meta: TaskMeta
    chunks: _containers.RepeatedCompositeFieldContainer[Chunk]
    pass_id: int
    def __init__(self, meta: _Optional[_Union[TaskMeta, _Mapping]] = ..., chunks: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., pass_id: _Optional[int] = ...) -> None: ...

class SetDatasetRequest(_message.Message):
    __slots__ = ("globs",)
    GLOBS_FIELD_NUMBER: _ClassVar[int]
    globs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, globs: _Optional[_Iterable[str]] = ...) -> None: ...

class SetDatasetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("pass_id", "wait_seconds", "worker", "request_id")
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    pass_id: int
    wait_seconds: float
    worker: str
    request_id: str
    def __init__(self, pass_id: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., worker: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class TaskFinishedRequest(_message.Message):
    __slots__ = ("task_id", "epoch", "pass_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    epoch: int
    pass_id: int
    def __init__(self, task_id: _Optional[int] = ..., epoch: _Optional[int] = ..., pass_id: _Optional[int] = ...) -> None: ...

class TaskFailedRequest(_message.Message):
    __slots__ = ("meta", "reason")
    META_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    meta: TaskMeta
    reason: str
    def __init__(self, meta: _Optional[_Union[TaskMeta, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class TaskReportResponse(_message.Message):
    __slots__ = ("applied",)
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    def __init__(self, applied: _Optional[bool] = ...) -> None: ...

class SaveModelRequest(_message.Message):
    __slots__ = ("trainer_id", "block_seconds")
    TRAINER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    trainer_id: str
    block_seconds: float
    def __init__(self, trainer_id: _Optional[str] = ..., block_seconds: _Optional[float] = ...) -> None: ...

class SaveModelResponse(_message.Message):
    __slots__ = ("approved",)
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    approved: bool
    def __init__(self, approved: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...
