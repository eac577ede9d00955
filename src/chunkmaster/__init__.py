"""chunkmaster: a fault-tolerant data-dispatch master for distributed training.

The names most users need are here; the layers live in subpackages:
`core` (pure state machine), `store` (journal persistence), `master` (service and server),
`client` (the trainer's side), `recordio` (the file format).
"""

from chunkmaster.client.client import Client, EndOfPass, TaskReadError
from chunkmaster.client.options import Connection, Reading, Session
from chunkmaster.core.errors import (
    AllTaskFailedError,
    DatasetError,
    DatasetMismatchError,
    JobStoppedError,
    MasterError,
    NoMoreAvailableError,
    NotReadyError,
    PassAfterError,
    PassBeforeError,
    UnavailableError,
)
from chunkmaster.core.model import Chunk, FailedPolicy, Task, TaskMeta
from chunkmaster.master.service import Service
from chunkmaster.store.memory import InMemStore
from chunkmaster.store.sqlite import SqliteStore

__version__ = "0.1.0"

__all__ = [
    "AllTaskFailedError",
    "Chunk",
    "Client",
    "Connection",
    "DatasetError",
    "DatasetMismatchError",
    "EndOfPass",
    "FailedPolicy",
    "InMemStore",
    "JobStoppedError",
    "MasterError",
    "NoMoreAvailableError",
    "NotReadyError",
    "PassAfterError",
    "PassBeforeError",
    "Reading",
    "Service",
    "Session",
    "SqliteStore",
    "Task",
    "TaskMeta",
    "TaskReadError",
    "UnavailableError",
    "__version__",
]
