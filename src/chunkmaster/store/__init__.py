"""Where the master's journal lives: memory (`store.memory`) or an embedded SQLite file
(`store.sqlite`); on etcd, `chunkmaster.etcd.journal`. `store.base` is what they share.

This module imports only `store.base`: a module that needs the protocol or its errors (the
etcd layers) does not load SQLite.
"""

from chunkmaster.store.base import NotLeaderError, Recovered, Store, StoreError

__all__ = ["NotLeaderError", "Recovered", "Store", "StoreError"]
