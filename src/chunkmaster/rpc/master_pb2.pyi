from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Chunk(_message.Message):
    __slots__ = ("path", "offset", "num_records", "length", "file_size", "file_mtime_ns")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    FILE_MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    path: str
    offset: int
    num_records: int
    length: int
    file_size: int
    file_mtime_ns: int
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., num_records: _Optional[int] = ..., length: _Optional[int] = ..., file_size: _Optional[int] = ..., file_mtime_ns: _Optional[int] = ...) -> None: ...

class TaskMeta(_message.Message):
    __slots__ = ("id", "epoch")
    ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    id: int
    epoch: int
    def __init__(self, id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("meta", "chunks", "pass_id", "start", "end", "format", "failures", "source", "order_key", "shuffle_window")
    META_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ORDER_KEY_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_WINDOW_FIELD_NUMBER: _ClassVar[int]
    meta: TaskMeta
    chunks: _containers.RepeatedCompositeFieldContainer[Chunk]
    pass_id: int
    start: int
    end: int
    format: str
    failures: int
    source: str
    order_key: int
    shuffle_window: int
    def __init__(self, meta: _Optional[_Union[TaskMeta, _Mapping]] = ..., chunks: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., pass_id: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., format: _Optional[str] = ..., failures: _Optional[int] = ..., source: _Optional[str] = ..., order_key: _Optional[int] = ..., shuffle_window: _Optional[int] = ...) -> None: ...

class SetDatasetRequest(_message.Message):
    __slots__ = ("globs", "sources")
    GLOBS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    globs: _containers.RepeatedScalarFieldContainer[str]
    sources: _containers.RepeatedCompositeFieldContainer[Source]
    def __init__(self, globs: _Optional[_Iterable[str]] = ..., sources: _Optional[_Iterable[_Union[Source, _Mapping]]] = ...) -> None: ...

class Source(_message.Message):
    __slots__ = ("name", "globs", "weight", "format")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GLOBS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    name: str
    globs: _containers.RepeatedScalarFieldContainer[str]
    weight: float
    format: str
    def __init__(self, name: _Optional[str] = ..., globs: _Optional[_Iterable[str]] = ..., weight: _Optional[float] = ..., format: _Optional[str] = ...) -> None: ...

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

class TaskPosition(_message.Message):
    __slots__ = ("task_id", "epoch", "pass_id", "records")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    epoch: int
    pass_id: int
    records: int
    def __init__(self, task_id: _Optional[int] = ..., epoch: _Optional[int] = ..., pass_id: _Optional[int] = ..., records: _Optional[int] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("seq", "hello", "next", "failed", "keep_alive", "commit", "goodbye", "returned")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    hello: Hello
    next: NextTask
    failed: TaskFailedRequest
    keep_alive: KeepAlive
    commit: Commit
    goodbye: Goodbye
    returned: Return
    def __init__(self, seq: _Optional[int] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., next: _Optional[_Union[NextTask, _Mapping]] = ..., failed: _Optional[_Union[TaskFailedRequest, _Mapping]] = ..., keep_alive: _Optional[_Union[KeepAlive, _Mapping]] = ..., commit: _Optional[_Union[Commit, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ..., returned: _Optional[_Union[Return, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("session_id", "name", "host", "pid", "report_every", "world_size", "rank")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    REPORT_EVERY_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    name: str
    host: str
    pid: int
    report_every: int
    world_size: int
    rank: int
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., report_every: _Optional[int] = ..., world_size: _Optional[int] = ..., rank: _Optional[int] = ...) -> None: ...

class NextTask(_message.Message):
    __slots__ = ("finished", "want_task", "pass_id", "wait_seconds", "request_id", "max_tasks")
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    WANT_TASK_FIELD_NUMBER: _ClassVar[int]
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    finished: _containers.RepeatedCompositeFieldContainer[TaskPosition]
    want_task: bool
    pass_id: int
    wait_seconds: float
    request_id: str
    max_tasks: int
    def __init__(self, finished: _Optional[_Iterable[_Union[TaskPosition, _Mapping]]] = ..., want_task: _Optional[bool] = ..., pass_id: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., request_id: _Optional[str] = ..., max_tasks: _Optional[int] = ...) -> None: ...

class KeepAlive(_message.Message):
    __slots__ = ("progress", "data_wait")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_WAIT_FIELD_NUMBER: _ClassVar[int]
    progress: _containers.RepeatedCompositeFieldContainer[TaskPosition]
    data_wait: DataWait
    def __init__(self, progress: _Optional[_Iterable[_Union[TaskPosition, _Mapping]]] = ..., data_wait: _Optional[_Union[DataWait, _Mapping]] = ...) -> None: ...

class DataWait(_message.Message):
    __slots__ = ("p50_seconds", "p99_seconds", "share", "batches", "window_seconds")
    P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    p50_seconds: float
    p99_seconds: float
    share: float
    batches: int
    window_seconds: float
    def __init__(self, p50_seconds: _Optional[float] = ..., p99_seconds: _Optional[float] = ..., share: _Optional[float] = ..., batches: _Optional[int] = ..., window_seconds: _Optional[float] = ...) -> None: ...

class Commit(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[TaskPosition]
    def __init__(self, positions: _Optional[_Iterable[_Union[TaskPosition, _Mapping]]] = ...) -> None: ...

class Return(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[TaskPosition]
    def __init__(self, positions: _Optional[_Iterable[_Union[TaskPosition, _Mapping]]] = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ("progress",)
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    progress: _containers.RepeatedCompositeFieldContainer[TaskPosition]
    def __init__(self, progress: _Optional[_Iterable[_Union[TaskPosition, _Mapping]]] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("seq", "welcome", "task", "error", "ack", "tasks")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    welcome: Welcome
    task: Task
    error: SessionError
    ack: Ack
    tasks: TaskBatch
    def __init__(self, seq: _Optional[int] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., error: _Optional[_Union[SessionError, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., tasks: _Optional[_Union[TaskBatch, _Mapping]] = ...) -> None: ...

class TaskBatch(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("session_id", "ttl_seconds", "keep_alive_seconds")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    ttl_seconds: float
    keep_alive_seconds: float
    def __init__(self, session_id: _Optional[str] = ..., ttl_seconds: _Optional[float] = ..., keep_alive_seconds: _Optional[float] = ...) -> None: ...

class SessionError(_message.Message):
    __slots__ = ("code", "error", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    error: str
    message: str
    def __init__(self, code: _Optional[int] = ..., error: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("applied",)
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    applied: int
    def __init__(self, applied: _Optional[int] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("checkpoint", "key", "rank", "other_job")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    OTHER_JOB_FIELD_NUMBER: _ClassVar[int]
    checkpoint: bytes
    key: str
    rank: int
    other_job: bool
    def __init__(self, checkpoint: _Optional[bytes] = ..., key: _Optional[str] = ..., rank: _Optional[int] = ..., other_job: _Optional[bool] = ...) -> None: ...

class RestoreResponse(_message.Message):
    __slots__ = ("applied", "pass_id")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    pass_id: int
    def __init__(self, applied: _Optional[bool] = ..., pass_id: _Optional[int] = ...) -> None: ...

class WeightPoint(_message.Message):
    __slots__ = ("records", "weights")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    records: int
    weights: _containers.RepeatedCompositeFieldContainer[SourceWeight]
    def __init__(self, records: _Optional[int] = ..., weights: _Optional[_Iterable[_Union[SourceWeight, _Mapping]]] = ...) -> None: ...

class SourceWeight(_message.Message):
    __slots__ = ("name", "weight")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    name: str
    weight: float
    def __init__(self, name: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class SetWeightsRequest(_message.Message):
    __slots__ = ("points", "mode", "add")
    POINTS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[WeightPoint]
    mode: str
    add: _containers.RepeatedCompositeFieldContainer[Source]
    def __init__(self, points: _Optional[_Iterable[_Union[WeightPoint, _Mapping]]] = ..., mode: _Optional[str] = ..., add: _Optional[_Iterable[_Union[Source, _Mapping]]] = ...) -> None: ...

class SetWeightsResponse(_message.Message):
    __slots__ = ("pass_id", "unit", "records")
    PASS_ID_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    pass_id: int
    unit: int
    records: int
    def __init__(self, pass_id: _Optional[int] = ..., unit: _Optional[int] = ..., records: _Optional[int] = ...) -> None: ...

class DataCheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DataCheckpointResponse(_message.Message):
    __slots__ = ("checkpoint",)
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    checkpoint: bytes
    def __init__(self, checkpoint: _Optional[bytes] = ...) -> None: ...
