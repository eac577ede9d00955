"""JSON Lines and plain text: a chunk is a byte range of whole lines, at most `chunk_size` long.

The master finds the chunks in one pass over the file (its worker threads): it reads big
blocks, cuts each chunk at the last newline before the bound (`bytes.rfind`) and counts its
records (`bytes.count(b"\\n")`), so the count is known when the dataset is set. A line longer
than the bound is a chunk of its own. The trainer reads a chunk with one ranged read, checks
its line count against the index, and parses it whole before handing out any record.

Lines are separated by b"\\n"; a final line without one is a record; a "\\r" before the "\\n" is
part of the separator (as Python's text mode reads it). Text records are `str` (UTF-8), JSON
Lines records are parsed JSON values; a line that is not UTF-8, or not JSON, fails its chunk at
read time with its line number in the chunk (an empty line is not JSON). Parsing is not done
when indexing: that pass only counts.

A compressed file (`.gz`, `.zst`) cannot be cut into ranges: it is one chunk, its records
counted by decompressing it once at indexing, and decompressed whole by the trainer. Both
sides stop at `max_inflated` bytes (chunkmaster.inflate): the master counts a gzip file's lines
a block at a time without keeping them, and refuses a file that inflates past its limit; a
trainer refuses such a chunk while decoding it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO, Any

from chunkmaster import inflate
from chunkmaster.core.model import Chunk
from chunkmaster.formats.base import FileIndex, FormatError, Indexed, Storage
from chunkmaster.formats.listed import ListedChunk
from chunkmaster.inflate import (
    DEFAULT_MAX_INFLATED,
    MASTER_SETTING,
    TRAINER_SETTING,
    check_limit,
)

CHUNK_SIZE = 32 << 10
"""Default bound on a chunk's bytes (a line longer than it is a chunk of its own; the master's
--chunk-size sets another). Small enough that a 1 MB file makes 31 chunks, so several tasks
even at 10 chunks a task (trainers share even a small dataset); large enough that indexing
and a trainer's per-chunk costs stay small (bench/formats_bench.py --chunk-sizes: JSON Lines
reads as fast as at 4 MiB; text lines, a few microseconds of work each, pay for the dispatch
of 100 times more tasks)."""

_BLOCK = 4 << 20  # bytes read at a time while indexing


def _compression(path: str) -> str | None:
    name = path.lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith(".zst"):
        return "zstd"
    return None


def _decompress(data: bytes, how: str, path: str, limit: int, chunk: int | None = None) -> bytes:
    """`data` (the whole file) inflated; FormatError naming the file (and the chunk) when it
    does not decompress or inflates past `limit`."""
    where: dict[str, Any] = {"path": path, "chunk": chunk, "offset": None if chunk is None else 0}
    setting = MASTER_SETTING if chunk is None else TRAINER_SETTING
    try:
        if how == "gzip":
            # Zero bytes after a member are accepted, as Python's gzip module does.
            return inflate.gunzip(data, limit, zero_padding=True)
        return inflate.unzstd(data, limit)
    except inflate.TooLarge as exc:
        raise FormatError(exc.reason(len(data), setting), **where) from None
    except inflate.Damaged as exc:
        raise FormatError(f"cannot decompress it as {how} ({_why(exc)})", **where) from None


def _why(exc: inflate.Damaged) -> str:
    return exc.kind if exc.cause is None else type(exc.cause).__name__


def _count_compressed(f: IO[bytes], how: str, path: str, size: int, limit: int) -> int:
    """The lines of a compressed file of `size` bytes, counted as it is inflated (gzip: a
    block at a time, never held whole); FormatError naming it when it inflates past `limit`."""
    if how != "gzip":  # zstd cannot be decoded a block at a time: whole, bounded first
        return _count_lines(_decompress(f.read(), how, path, limit))
    count = 0
    last = 10
    try:
        for piece in inflate.iter_gunzip(
            lambda: f.read(_BLOCK), limit, zero_padding=True, block=_BLOCK
        ):
            count += piece.count(b"\n")
            last = piece[-1]
    except inflate.TooLarge as exc:
        raise FormatError(exc.reason(size, MASTER_SETTING), path=path) from None
    except inflate.Damaged as exc:
        raise FormatError(f"cannot decompress it as {how} ({_why(exc)})", path=path) from None
    return count + (last != 10)


def _fill(f: IO[bytes], view: memoryview) -> int:
    """Read into `view` until it is full or the file ends; the bytes read."""
    readinto = getattr(f, "readinto", None)
    got = 0
    while got < len(view):
        if readinto is not None:
            n = readinto(view[got:])
        else:
            data = f.read(len(view) - got)
            n = len(data)
            view[got : got + n] = data
        if not n:
            break
        got += n
    return got


def index_lines(
    f: IO[bytes], chunk_size: int = CHUNK_SIZE
) -> tuple[list[int], list[int], list[int]]:
    """(offsets, records, lengths) of the chunks of a file of lines, read from its start.

    Blocks are read into one reused buffer (a fresh 4 MiB object per block costs more in page
    faults than the read); what follows the last cut is moved to its front before the next.
    """
    offsets: list[int] = []
    records: list[int] = []
    lengths: list[int] = []
    block = max(_BLOCK, chunk_size)
    buf = bytearray(2 * block)
    n = 0  # bytes of buf that hold the file, from `base` on
    base = 0  # file offset of buf[0]
    p = 0  # where the next chunk starts in buf
    eof = False
    while not eof:
        if p:
            with memoryview(buf) as view:
                view[: n - p] = view[p:n]
            base += p
            n -= p
            p = 0
        if len(buf) < n + block:  # a line longer than the buffer is being read
            buf.extend(bytes(n + block - len(buf)))
        with memoryview(buf) as view:
            got = _fill(f, view[n : n + block])
        n += got
        eof = got < block
        while n - p >= chunk_size or (eof and p < n):
            limit = p + chunk_size
            if eof and n <= limit:
                end = n
            else:
                cut = buf.rfind(b"\n", p, limit)
                if cut < 0:  # a line longer than the bound: up to its end
                    cut = buf.find(b"\n", limit, n)
                    if cut < 0 and not eof:
                        break  # its end is in blocks not read yet
                end = n if cut < 0 else cut + 1
            count = buf.count(b"\n", p, end)
            if buf[end - 1] != 10:  # the last line, without its newline
                count += 1
            offsets.append(base + p)
            records.append(count)
            lengths.append(end - p)
            p = end
    return offsets, records, lengths


def _count_lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and data[-1] != 10 else 0)


class LinesLoader:
    """Reads a chunk's bytes, checks its line count, and parses its lines with `parse`; a
    compressed file is inflated up to `max_inflated` bytes."""

    __slots__ = ("_fmt", "_max_inflated")

    def __init__(self, fmt: LinesFormat, max_inflated: int = DEFAULT_MAX_INFLATED) -> None:
        self._fmt = fmt
        self._max_inflated = check_limit(max_inflated)

    def load(self, chunk: Chunk, storage: Storage, data: bytes | None = None) -> ListedChunk:
        path = chunk.path
        where: dict[str, Any] = {"path": path, "chunk": 0, "offset": chunk.offset}
        if data is None:
            if chunk.length > 0:
                data = storage.read_ranges(path, [(chunk.offset, chunk.length)])[0]
            else:
                with storage.open(path) as f:
                    f.seek(chunk.offset)
                    data = f.read()
        if len(data) < chunk.length:
            raise FormatError(
                f"the chunk is {chunk.length} bytes but the file ends after {len(data)} "
                "(truncated since the dataset was set)",
                **where,
            )
        how = _compression(path)
        if how is not None:
            data = _decompress(data, how, path, self._max_inflated, 0)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _line_error("is not UTF-8", data.count(b"\n", 0, exc.start), where) from None
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()  # the empty piece after a final newline (or of an empty chunk)
        if len(lines) != chunk.num_records:
            raise FormatError(
                f"the chunk holds {len(lines)} lines but the index says {chunk.num_records} "
                "(the file changed since the dataset was set)",
                **where,
            )
        return ListedChunk(self._fmt.parse(lines, "\r" in text, where))


class LinesFormat(Indexed):
    """One line, one record; `parse` turns a chunk's lines into records (FormatError naming
    the line)."""

    ranged = True

    def __init__(
        self,
        name: str,
        suffixes: tuple[str, ...],
        parse: Callable[[list[str], bool, dict[str, Any]], list[Any]],
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        self.name = name
        self.suffixes = suffixes
        self.parse = parse
        self.chunk_size: int | None = chunk_size

    def read_index(
        self, path: str, storage: Storage, chunk_size: int | None, max_inflated: int
    ) -> FileIndex:
        how = _compression(path)
        size = storage.size(path)
        if how is not None:
            if not size:
                return FileIndex([], [], [], 0)
            with storage.open(path) as f:
                n = _count_compressed(f, how, path, size, max_inflated)
            return FileIndex([0], [n], [size], size) if n else FileIndex([], [], [], size)
        bound = chunk_size or self.chunk_size or CHUNK_SIZE
        with storage.open(path) as f:
            offsets, records, lengths = index_lines(f, bound)
        if sum(lengths) != size:
            raise FormatError(
                f"read {sum(lengths)} bytes of its {size} (it changed while being indexed)",
                path=path,
            )
        return FileIndex(offsets, records, lengths, size)

    def loader(self, *, max_inflated: int = DEFAULT_MAX_INFLATED) -> LinesLoader:
        return LinesLoader(self, max_inflated)


def _line_error(what: str, line: int, where: dict[str, Any]) -> FormatError:
    return FormatError(f"line {line + 1} of the chunk {what}", **where)


def _strip_cr(line: str) -> str:
    return line[:-1] if line.endswith("\r") else line


def parse_text(lines: list[str], cr: bool, where: dict[str, Any]) -> list[Any]:
    """Each line as str, without its "\\n" (or "\\r\\n"; `cr`: some line may end in "\\r")."""
    return list(map(_strip_cr, lines)) if cr else lines


def parse_jsonl(lines: list[str], cr: bool, where: dict[str, Any]) -> list[Any]:
    """Each line as the JSON value it holds (a "\\r" before the "\\n" is JSON whitespace)."""
    try:
        return list(map(json.loads, lines))
    except (ValueError, RecursionError):
        pass
    for i, line in enumerate(lines):  # find the line, for the message
        try:
            json.loads(line)
        except ValueError as exc:
            why = (
                f"{exc.msg} at column {exc.colno}"
                if isinstance(exc, json.JSONDecodeError)
                else type(exc).__name__
            )
            raise _line_error(f"is not JSON ({why})", i, where) from None
        except RecursionError:
            raise _line_error("nests too deep", i, where) from None
    raise AssertionError("a line failed to parse, then parsed")  # pragma: no cover


JSONL = LinesFormat("jsonl", (".jsonl", ".ndjson", ".jsonl.gz", ".jsonl.zst"), parse_jsonl)
TEXT = LinesFormat("text", (".txt", ".txt.gz", ".txt.zst"), parse_text)
FORMATS = {"jsonl": JSONL, "text": TEXT}
