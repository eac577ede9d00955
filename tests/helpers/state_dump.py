"""A canonical form of the master's state, to compare two states field by field.

Every dataclass is taken field by field, by name (fields whose name starts with `_`, caches,
are left out), so a field added to `MasterState` or to anything it holds is compared without
a change here. Sequences keep their order, and so do the dicts whose order the state relies
on; the others are sorted, as their order means nothing.
"""

from __future__ import annotations

import dataclasses
import enum
from array import array
from collections import deque
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from chunkmaster.core.state import MasterState

#: Dicts whose order is state: `pending` is in dispatch order (a lost session is charged for
#: the first task it holds) and `sessions` in the order they opened (the newest world size
#: wins, core/steps.py).
ORDERED = frozenset({"pending", "sessions"})


def dump(state: MasterState) -> Any:
    """`state` as nested tuples of plain values: equal states give equal dumps."""
    return _canonical(state, "")


def _canonical(value: object, name: str) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple(
                (f.name, _canonical(getattr(value, f.name), f.name))
                for f in dataclasses.fields(value)
                if not f.name.startswith("_")
            ),
        )
    if isinstance(value, Mapping):
        items = [(_canonical(k, ""), _canonical(v, "")) for k, v in value.items()]
        return (
            "ordered" if name in ORDERED else "dict",
            tuple(items if name in ORDERED else sorted(items, key=repr)),
        )
    if isinstance(value, array):
        return ("array", value.typecode, tuple(value))
    if isinstance(value, list | tuple | deque):
        return tuple(_canonical(v, "") for v in value)
    if isinstance(value, set | frozenset):
        return ("set", tuple(sorted(_canonical(v, "") for v in value)))
    if isinstance(value, enum.Enum):
        return (type(value).__name__, value.value)
    if value is None or isinstance(value, bool | int | float | str | Fraction):
        return value
    raise TypeError(f"no canonical form for {type(value).__name__} (in {name or 'the state'})")


def differences(a: MasterState, b: MasterState) -> list[str]:
    """The top-level fields in which two states differ, each with both values (for messages)."""
    out = []
    for f in dataclasses.fields(a):
        x, y = _canonical(getattr(a, f.name), f.name), _canonical(getattr(b, f.name), f.name)
        if x != y:
            out.append(f"{f.name}: {x!r} != {y!r}")
    return out
