"""A checked chunk whose records are already cut out, held in a list."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class ListedChunk:
    """`Loaded` for formats that check a chunk by walking all its records anyway (TFRecord's
    CRCs, tar headers, every line parsed): each record is built during the walk, so handing
    them out is a list iterator, whose `length_hint` is how many are not taken yet."""

    __slots__ = ("records",)

    def __init__(self, records: list[Any]) -> None:
        self.records = records

    @property
    def count(self) -> int:
        return len(self.records)

    def cut(self, a: int, b: int) -> tuple[Iterator[Any], Iterator[Any]]:
        it = iter(self.records[a:b])
        return it, it
