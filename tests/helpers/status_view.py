"""The master's status as its typed view (chunkmaster.master.status.Status), from the JSON a
master sends (`status --json`, MasterConnection.status()): tests look at fields, not keys."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

from chunkmaster.client.connection import MasterConnection
from chunkmaster.master.status import Status

T = TypeVar("T")


def status_view(wire: dict[str, Any]) -> Status:
    """The typed view of a status as JSON values."""
    return _build(Status, wire)


def _build(cls: type[T], wire: dict[str, Any]) -> T:
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = f.metadata.get("json", f.name)
        if key in wire:
            values[f.name] = _value(hints[f.name], wire[key])
    return cls(**values)


def _value(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _value(hint, value)
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_value(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(hint)
        return {k: _value(item, v) for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return _build(hint, value)  # type: ignore[arg-type]
    return value


def master_status(addr: str) -> dict[str, Any]:
    """The status of the master at `addr` as JSON values, over a connection of its own."""
    with MasterConnection(addr) as c:
        return c.status()


def master_status_view(addr: str) -> Status:
    """The typed view of the status of the master at `addr`."""
    return status_view(master_status(addr))
