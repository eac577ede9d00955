"""The etcd v3 protocol: aetcd's generated messages and stubs, plus tiny request builders.

The generated code is untyped, so it stays behind `Any` here and everything else imports it
from this module.
"""

from __future__ import annotations

from typing import Any

from aetcd import rpc as _aetcd_rpc

aetcd_rpc: Any = _aetcd_rpc

SORT_ASCEND: int = aetcd_rpc.RangeRequest.ASCEND
SORT_DESCEND: int = aetcd_rpc.RangeRequest.DESCEND
SORT_BY_KEY: int = aetcd_rpc.RangeRequest.KEY
SORT_BY_CREATE: int = aetcd_rpc.RangeRequest.CREATE
EVENT_PUT: int = aetcd_rpc.Event.PUT
EVENT_DELETE: int = aetcd_rpc.Event.DELETE


def prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with `prefix` (etcd's convention)."""
    buf = bytearray(prefix)
    while buf:
        if buf[-1] < 0xFF:
            buf[-1] += 1
            return bytes(buf)
        buf.pop()
    return b"\0"


def op_put(key: bytes, value: bytes, lease: int = 0) -> Any:
    return aetcd_rpc.RequestOp(request_put=aetcd_rpc.PutRequest(key=key, value=value, lease=lease))


def op_delete(key: bytes, range_end: bytes = b"") -> Any:
    req = aetcd_rpc.DeleteRangeRequest(key=key, range_end=range_end)
    return aetcd_rpc.RequestOp(request_delete_range=req)


def op_range(key: bytes, range_end: bytes = b"", **kw: Any) -> Any:
    req = aetcd_rpc.RangeRequest(key=key, range_end=range_end, **kw)
    return aetcd_rpc.RequestOp(request_range=req)


def cmp_create_revision(key: bytes, revision: int) -> Any:
    """True while `key` exists with exactly this create revision (0: the key must be absent)."""
    return aetcd_rpc.Compare(
        key=key,
        result=aetcd_rpc.Compare.EQUAL,
        target=aetcd_rpc.Compare.CREATE,
        create_revision=revision,
    )
