"""Order-independent dataset digest: sum over records of the first 8 bytes of SHA-256, mod 2^64.

Being a sum, it can be computed per chunk or per trainer and merged, so a whole training run can
check that every record was delivered exactly once, whatever the order and the task split.

A bytes record (RecordIO, TFRecord) is hashed as it is. Any other record (a JSON value, a text
line, a Parquet row, a WebDataset sample) is hashed as its `canonical` encoding: compact JSON
with sorted keys, UTF-8, and tagged objects for what JSON lacks (docs/formats.md).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
from collections.abc import Mapping
from hashlib import sha256
from typing import Any

from chunkmaster.recordio.scanner import scan
from chunkmaster.recordio.source import Source

_MASK = (1 << 64) - 1


_string = json.JSONEncoder(ensure_ascii=False).encode  # a str as a JSON string literal


def canonical(record: Any) -> bytes:
    """The bytes a record's digest is taken of: bytes as they are, anything else as canonical
    JSON (`encode_value`) in UTF-8."""
    if type(record) is bytes:
        return record
    if isinstance(record, bytes | bytearray | memoryview):
        return bytes(record)
    return "".join(encode_value(record, [])).encode("utf-8")


def encode_value(v: Any, out: list[str]) -> list[str]:
    """Append the canonical JSON of `v` to `out`: no spaces, object keys sorted by code point,
    strings with non-ASCII kept as is, integers in decimal, finite floats as Python's repr
    (the shortest that reads back the same), and tagged objects for the rest:
    {"$b64": base64} bytes, {"$float": "nan"|"inf"|"-inf"}, {"$decimal": str},
    {"$date": iso}, {"$time": iso}, {"$datetime": iso (with its UTC offset if aware)},
    {"$timedelta": [days, seconds, microseconds]}. Tuples are arrays. Anything else is a
    TypeError naming its type."""
    t = type(v)
    if t is str:
        out.append(_string(v))
    elif v is None:
        out.append("null")
    elif t is bool:
        out.append("true" if v else "false")
    elif t is int:
        out.append(str(v))
    elif t is float:
        out.append(repr(v) if math.isfinite(v) else f'{{"$float":"{_nonfinite(v)}"}}')
    elif isinstance(v, Mapping):
        out.append("{")
        items = sorted(v.items(), key=_key)
        for i, (k, item) in enumerate(items):
            if i:
                out.append(",")
            out.append(_string(k))
            out.append(":")
            encode_value(item, out)
        out.append("}")
    elif t is list or t is tuple:
        out.append("[")
        for i, item in enumerate(v):
            if i:
                out.append(",")
            encode_value(item, out)
        out.append("]")
    elif isinstance(v, bytes | bytearray | memoryview):
        out.append('{"$b64":"' + base64.b64encode(bytes(v)).decode("ascii") + '"}')
    elif isinstance(v, decimal.Decimal):
        out.append('{"$decimal":' + _string(str(v)) + "}")
    elif isinstance(v, datetime.datetime):  # before date: a datetime is a date
        out.append('{"$datetime":' + _string(v.isoformat()) + "}")
    elif isinstance(v, datetime.date):
        out.append('{"$date":' + _string(v.isoformat()) + "}")
    elif isinstance(v, datetime.time):
        out.append('{"$time":' + _string(v.isoformat()) + "}")
    elif isinstance(v, datetime.timedelta):
        out.append(f'{{"$timedelta":[{v.days},{v.seconds},{v.microseconds}]}}')
    elif isinstance(v, bool | int | float | str | list | tuple):  # subclasses: as their base
        base: Any = next(b for b in (bool, int, float, str, list, tuple) if isinstance(v, b))
        encode_value(base(v), out)
    else:
        raise TypeError(f"a record holds a {t.__name__}, which has no canonical encoding")
    return out


def _key(item: tuple[Any, Any]) -> str:
    k = item[0]
    if type(k) is not str:
        raise TypeError(f"a record's object key is a {type(k).__name__}, not a str")
    return str(k)


def _nonfinite(v: float) -> str:
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def record_digest(record: Any) -> int:
    """The first 8 bytes of the SHA-256 of the record's canonical bytes, read big-endian."""
    return int.from_bytes(sha256(canonical(record)).digest()[:8], "big")


class Digest:
    """Accumulates the digest of a multiset of records."""

    __slots__ = ("count", "value")

    def __init__(self, value: int = 0, count: int = 0) -> None:
        self.value = value & _MASK
        self.count = count

    def add(self, record: Any) -> None:
        if type(record) is not bytes:
            record = canonical(record)
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
