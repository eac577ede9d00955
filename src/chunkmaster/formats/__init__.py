"""Dataset file formats: which one a file is in, and the table of those chunkmaster reads.

A format is chosen by the file name's ending (`format_for`), or named explicitly (the master's
`--format`). Files without a known ending are RecordIO, as every dataset was before formats
existed. Each format lives in its own module, imported when first used (pyarrow is heavy).
To add one: a module with a `FORMAT` object (formats/base.py's `Format`) and a line below.
"""

from __future__ import annotations

import importlib

from chunkmaster.formats.base import (
    ChunkLoader,
    FileIndex,
    Format,
    FormatError,
    Loaded,
    Storage,
)

__all__ = [
    "FORMATS",
    "SUFFIXES",
    "ChunkLoader",
    "FileIndex",
    "Format",
    "FormatError",
    "Loaded",
    "Storage",
    "format_for",
    "get_format",
    "register",
]

#: Format name -> the module that defines it (as `FORMAT`).
FORMATS: dict[str, str] = {
    "recordio": "chunkmaster.formats.recordio",
    "parquet": "chunkmaster.formats.parquet",
    "jsonl": "chunkmaster.formats.lines",
    "text": "chunkmaster.formats.lines",
    "tfrecord": "chunkmaster.formats.tfrecord",
    "webdataset": "chunkmaster.formats.webdataset",
}

#: File name ending -> format name; the longest matching ending wins (".jsonl.gz" over ".gz").
SUFFIXES: dict[str, str] = {
    ".rio": "recordio",
    ".recordio": "recordio",
    ".parquet": "parquet",
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl",
    ".jsonl.zst": "jsonl",
    ".ndjson": "jsonl",
    ".txt": "text",
    ".txt.gz": "text",
    ".txt.zst": "text",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tfrecord.gz": "tfrecord",
    ".tfrecords.gz": "tfrecord",
    ".tar": "webdataset",
}

_loaded: dict[str, Format] = {}


def register(name: str, module: str, suffixes: tuple[str, ...]) -> None:
    """Add a format: `module` defines `FORMAT`; file names ending in `suffixes` select it."""
    FORMATS[name] = module
    for suffix in suffixes:
        SUFFIXES[suffix] = name


def get_format(name: str) -> Format:
    """The format called `name`; ValueError naming the known ones if there is none."""
    fmt = _loaded.get(name)
    if fmt is not None:
        return fmt
    module = FORMATS.get(name)
    if module is None:
        raise ValueError(f"unknown dataset format {name!r} (known: {', '.join(sorted(FORMATS))})")
    mod = importlib.import_module(module)
    found: Format = getattr(mod, "FORMATS", {}).get(name) or mod.FORMAT
    _loaded[name] = found
    return found


def suffix_format(path: str) -> str | None:
    """The format the file name's ending names, or None (no known ending)."""
    name = path.rsplit("/", 1)[-1].lower()
    best: str | None = None
    best_len = 0
    for suffix, fmt in SUFFIXES.items():
        if len(suffix) > best_len and name.endswith(suffix):
            best, best_len = fmt, len(suffix)
    return best


def format_for(path: str, explicit: str | None = None) -> Format:
    """The format of `path`: `explicit` if given, else its name's ending, else RecordIO."""
    if explicit:
        return get_format(explicit)
    return get_format(suffix_format(path) or "recordio")
