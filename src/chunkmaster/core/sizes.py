"""Byte counts as people write them: `--chunk-size 4MiB` read, "32KiB" shown."""

from __future__ import annotations

import re

_SIZE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def size_text(n: int) -> str:
    """A byte count as the master's --chunk-size reads it: "32KiB", "4MiB", "700B"."""
    for unit, scale in _SIZE_UNITS:
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


_SIZE = re.compile(r"(\d+)\s*(b|k|kib|m|mib|g|gib|t|tib)?", re.IGNORECASE)
_SIZE_SCALE = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """A byte count of 1 or more as size_text writes it, and as --chunk-size and
    --max-inflated-bytes read it: "65536", "64KiB", "64k", "4MiB", "1G" (K, M, G, T are powers
    of 1024; "4MB" is refused rather than read one way or the other)."""
    m = _SIZE.fullmatch(text.strip())
    value = 0 if m is None else int(m.group(1)) * _SIZE_SCALE[(m.group(2) or "")[:1].lower()]
    if value < 1:
        raise ValueError(
            f"{text!r} is not a byte count of 1 or more (examples: 32KiB, 4MiB, 65536)"
        )
    return value
