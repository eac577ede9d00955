"""Order-independent dataset digest: sum over records of the first 8 bytes of SHA-256, mod 2^64.

Being a sum, it can be computed per chunk or per trainer and merged, so a whole training run can
check that every record was delivered exactly once, whatever the order and the task split.
"""

from __future__ import annotations

from hashlib import sha256

from chunkmaster.recordio.scanner import scan
from chunkmaster.recordio.source import Source

_MASK = (1 << 64) - 1


def record_digest(record: bytes) -> int:
    """The first 8 bytes of the record's SHA-256, read big-endian."""
    return int.from_bytes(sha256(record).digest()[:8], "big")


class Digest:
    """Accumulates the digest of a multiset of records."""

    __slots__ = ("count", "value")

    def __init__(self, value: int = 0, count: int = 0) -> None:
        self.value = value & _MASK
        self.count = count

    def add(self, record: bytes) -> None:
        self.value = (self.value + int.from_bytes(sha256(record).digest()[:8], "big")) & _MASK
        self.count += 1

    def merge(self, other: Digest) -> None:
        """Fold in another digest (e.g. from another chunk or trainer)."""
        self.value = (self.value + other.value) & _MASK
        self.count += other.count

    def hex(self) -> str:
        return f"{self.value:016x}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Digest):
            return NotImplemented
        return (self.value, self.count) == (other.value, other.count)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Digest({self.hex()}, count={self.count})"


def file_digest(source: Source) -> Digest:
    """Digest of every record of a RecordIO file (checksums verified on the way)."""
    d = Digest()
    total = 0
    n = 0
    for record in scan(source):
        total += int.from_bytes(sha256(record).digest()[:8], "big")
        n += 1
    d.value = total & _MASK
    d.count = n
    return d
