"""Where the master's journal lives: memory, an embedded SQLite file, or etcd."""

from chunkmaster.store.base import NotLeaderError, Recovered, Store, StoreError
from chunkmaster.store.memory import InMemStore
from chunkmaster.store.sqlite import SqliteStore

__all__ = ["InMemStore", "NotLeaderError", "Recovered", "SqliteStore", "Store", "StoreError"]
