"""Where a job's master keeps its keys in etcd (see docs/etcd.md for the whole layout).

``P`` is ``""`` without a job and ``/chunkmaster/<job>`` with one, so jobs sharing an etcd
never see each other's keys. The master writes these keys; trainers read the address key.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_LOCK_PATH = "/master/lock"
DEFAULT_ADDR_PATH = "/master/addr"
DEFAULT_STATE_PATH = "/master/state"
JOB_ROOT = "/chunkmaster"


@dataclass(frozen=True)
class KeyLayout:
    """Every key the master touches, derived from the job name and the three paths."""

    root: str
    lock_prefix: bytes
    addr: bytes
    state: bytes

    @classmethod
    def build(
        cls,
        job: str | None,
        lock_path: str = DEFAULT_LOCK_PATH,
        addr_path: str = DEFAULT_ADDR_PATH,
        state_path: str = DEFAULT_STATE_PATH,
    ) -> KeyLayout:
        if job is not None and (not job or "/" in job):
            raise ValueError(f"bad job name {job!r}: must be non-empty without '/'")
        root = f"{JOB_ROOT}/{job}" if job else ""
        for path in (lock_path, addr_path, state_path):
            if not path.startswith("/") or path.endswith("/"):
                raise ValueError(f"etcd path {path!r} must start and not end with '/'")
        return cls(
            root=root,
            lock_prefix=(root + lock_path + "/").encode(),
            addr=(root + addr_path).encode(),
            state=(root + state_path).encode(),
        )

    @property
    def journal(self) -> bytes:
        return self.state + b"/j/"

    @property
    def journal_parts(self) -> bytes:
        return self.state + b"/p/"

    @property
    def snap_manifest(self) -> bytes:
        return self.state + b"/snap"

    @property
    def snap_parts(self) -> bytes:
        return self.state + b"/s/"

    def journal_key(self, seq: int) -> bytes:
        return self.journal + b"%020d" % seq
