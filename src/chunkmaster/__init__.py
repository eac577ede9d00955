"""chunkmaster: a fault-tolerant data-dispatch master for distributed training.

The names most users need are here; the layers live in subpackages:
`core` (pure state machine), `store` (journal persistence), `master` (service and server),
`client` (the trainer's side), `recordio` (the file format).

A trainer's `import chunkmaster` loads the client and nothing of the master: `Service` and
the stores are imported on first use (`chunkmaster.Service`), for a master in the same process.
"""

from typing import TYPE_CHECKING, Any

from chunkmaster.client.client import Client, EndOfPass, TaskReadError
from chunkmaster.client.mixture import Source, WeightChange
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

if TYPE_CHECKING:
    from chunkmaster.master.service import Service
    from chunkmaster.store.memory import InMemStore
    from chunkmaster.store.sqlite import SqliteStore

#: The master's names, each imported on first use.
_MASTER = {
    "Service": "chunkmaster.master.service",
    "InMemStore": "chunkmaster.store.memory",
    "SqliteStore": "chunkmaster.store.sqlite",
}

#: The release: the one place it is written. pyproject.toml reads it (a dynamic version, read
#: from this file without importing it), so the wheel, `chunkmaster --version` and this agree.
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
    "Source",
    "SqliteStore",
    "Task",
    "TaskMeta",
    "TaskReadError",
    "UnavailableError",
    "WeightChange",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _MASTER.get(name)
    if module is None:
        raise AttributeError(f"module 'chunkmaster' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
