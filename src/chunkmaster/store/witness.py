"""A store's witness: the record, beside its SQLite database, of which store this is and how
far it got, so that a truncated, replaced or rolled-back database cannot pass for a sound one."""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WitnessRecord:
    store_id: str  # 32 hex digits, the same as the database's meta.store_id
    seq: int  # the store had made entries up to this one durable


class Witness:
    """The record, outside the database, of which store this is and how far it got.

    Two fixed 64-byte slots written in turn, each with its own CRC: a torn write spoils at
    most the slot being written, and the other still holds the previous record. After each
    commit one slot is rewritten in place without fsync (a few microseconds next to the
    commit's own fsync); it may lag the database after a power cut, never lead it, since
    it is written after the commit is durable. Opening, accepting and closing fsync it.
    """

    _SLOT = struct.Struct("<8sQQ16sI")  # magic, write counter, seq, store id, crc32
    _MAGIC = b"CMWITNS1"
    _SLOT_SIZE = 64

    def __init__(self, path: Path, fd: int, record: WitnessRecord, counter: int) -> None:
        self.path = path
        self._fd = fd
        self._store_id = record.store_id
        self.seq = record.seq
        self._counter = counter

    @classmethod
    def read(cls, path: Path) -> tuple[WitnessRecord, int] | None:
        """The newest intact record and its write counter; None if there is no witness.
        Raises ValueError if the file exists but holds no intact record."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        best: tuple[int, int, bytes] | None = None
        for i in (0, 1):
            raw = data[i * cls._SLOT_SIZE : i * cls._SLOT_SIZE + cls._SLOT.size]
            if len(raw) < cls._SLOT.size:
                continue
            magic, counter, seq, sid, crc = cls._SLOT.unpack(raw)
            if magic != cls._MAGIC or zlib.crc32(raw[:-4]) != crc:
                continue
            if best is None or counter > best[0]:
                best = (counter, seq, sid)
        if best is None:
            raise ValueError(f"neither of its two records is intact ({len(data)} bytes)")
        counter, seq, sid = best
        return WitnessRecord(sid.hex(), seq), counter

    @classmethod
    def create(cls, path: Path, record: WitnessRecord) -> Witness:
        """Write a fresh witness atomically (temporary file, fsync, rename, fsync the folder)."""
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            body = cls._slot(0, record) + cls._slot(1, record)
            os.pwrite(fd, body, 0)
            os.fsync(fd)
            os.rename(tmp, path)
            fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, record, 1)

    @classmethod
    def open(cls, path: Path, record: WitnessRecord, counter: int) -> Witness:
        return cls(path, os.open(path, os.O_RDWR | os.O_CLOEXEC), record, counter)

    @classmethod
    def _slot(cls, counter: int, record: WitnessRecord) -> bytes:
        head = cls._SLOT.pack(cls._MAGIC, counter, record.seq, bytes.fromhex(record.store_id), 0)
        raw = head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))
        return raw.ljust(cls._SLOT_SIZE, b"\0")

    def update(self, seq: int, *, sync: bool) -> None:
        self._counter += 1
        slot = self._slot(self._counter, WitnessRecord(self._store_id, seq))
        os.pwrite(self._fd, slot, (self._counter % 2) * self._SLOT_SIZE)
        if sync:
            os.fsync(self._fd)
        self.seq = seq

    def close(self) -> None:
        os.close(self._fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
