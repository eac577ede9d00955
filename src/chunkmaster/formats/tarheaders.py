"""Tar headers, read one block at a time, member data seeked over: the entries of a tar file
(or of a byte range of one), with every header checked.

The stdlib's `tarfile` reads the same headers but costs ~10x more per member (it builds a
TarInfo with every field decoded), and it stops quietly at a damaged header past the first one,
which would end a shard early without a word. Here every stop is either a real end or an
error. Formats understood: ustar (its name prefix), GNU (long names `L`, long link names `K`),
pax (per-member `x` headers: `path`, `size`; global `g` headers, which only may carry a
`comment`). Base-256 sizes (members over 8 GiB) are read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Final, NamedTuple

from chunkmaster.formats.base import FormatError

BLOCK: Final = 512
_ZERO: Final = bytes(BLOCK)
_TAIL_READ: Final = 64 << 10
_REGULAR: Final = (b"0", b"\x00", b"7")  # a file; a file (pre-POSIX); a contiguous file
_DIR: Final = b"5"

Error = Callable[[str, int], FormatError]


class Entry(NamedTuple):
    start: int  # its first header (long-name and pax headers included)
    data: int  # its data
    size: int  # data bytes
    name: str
    is_dir: bool

    @property
    def end(self) -> int:
        """Where the next header starts: the data padded to a whole block."""
        return self.data + padded(self.size)


def padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def entries(f: IO[bytes], start: int, end: int, whole: bool, error: Error) -> Iterator[Entry]:
    """The files and directories of the tar in f's bytes [start, end).

    `whole`: [start, end) is a whole file, which must end with an end-of-archive block followed
    by zeros only. Else it is a run of members, whose headers must tile it exactly. Anything
    that is neither a file nor a directory (links, devices, FIFOs, sparse files) is an error.
    """
    read, seek = f.read, f.seek
    pos = start
    ext = _Extensions()
    while True:
        if not whole and pos >= end:
            if ext.first >= 0:
                raise error(
                    "the chunk ends after an extended header, without its member", ext.first
                )
            return
        if not whole and pos + BLOCK > end:
            raise error("the chunk ends inside a tar header", pos)
        seek(pos)
        block = read(BLOCK)
        if len(block) < BLOCK:
            raise _short(block, pos, start, whole, error)
        if block == _ZERO:
            if not whole or ext.first >= 0:
                raise error("bad tar header (an end-of-archive block among members)", pos)
            _check_tail(f, pos + BLOCK, end, error)
            return
        header = _parse(block)
        if header is None:
            what = "bad tar header (checksum or fields)"
            if pos == start and whole:
                what = "not a tar file (no valid tar header at its start)"
            raise error(what, pos)
        name, size, kind = header
        data = pos + BLOCK
        if data + size > end:
            raise error(f"member data runs {data + size - end} bytes past the end", pos)
        if ext.first < 0:
            ext.first = pos
        if kind in (b"L", b"K", b"x", b"g"):
            seek(data)
            extension = read(size)
            if len(extension) < size:
                raise error("the file ends inside an extended header", pos)
            ext.add(kind, extension, pos, error)
            pos = data + padded(size)
            continue
        named = ext.long_name if ext.long_name is not None else name
        entry = _member(ext.first, data, end, (named, size, kind), ext.pax, error)
        yield entry
        pos = entry.end
        ext = _Extensions()


@dataclass
class _Extensions:
    """The extended headers read before a member: where the first of them starts (-1: none
    read), the member's long name (GNU `L`) and its pax records (`x`)."""

    first: int = -1
    long_name: bytes | None = None
    pax: dict[str, str] = field(default_factory=dict)

    def add(self, kind: bytes, extension: bytes, pos: int, error: Error) -> None:
        """The extended header of `kind` at `pos`, whose data is `extension`."""
        if kind == b"L":
            self.long_name = extension.split(b"\x00", 1)[0]
        elif kind == b"x":
            records = _pax_records(extension)
            if records is None:
                raise error("bad pax header", pos)
            self.pax.update(records)
        elif kind == b"g":
            records = _pax_records(extension)
            if records is None or records.keys() - {"comment"}:
                raise error("pax global header (unsupported: a chunk could not see it)", pos)
            self.first = -1  # it belongs to no member


def _short(block: bytes, pos: int, start: int, whole: bool, error: Error) -> FormatError:
    """The error for a header block the file ends inside (or before)."""
    if whole and not block:
        return error("no end-of-archive block: truncated at a member boundary", pos)
    if whole and block.count(0) == len(block):
        return error("the file ends inside the end-of-archive block", pos)
    if whole and pos == start:
        return error("not a tar file (shorter than one tar header)", pos)
    return error("the file ends inside a tar header", pos)


def _member(
    first: int,
    data: int,
    end: int,
    header: tuple[bytes, int, bytes],
    pax: dict[str, str],
    error: Error,
) -> Entry:
    """A file or directory member from its header (name, size, type flag) and the pax
    records before it, which override its size and name."""
    name, size, kind = header
    if "size" in pax:
        try:
            size = int(pax["size"])
        except ValueError:
            raise error("bad pax header (size)", first) from None
        if data + size > end:
            raise error(f"member data runs {data + size - end} bytes past the end", first)
    if any(k.startswith("GNU.sparse") for k in pax) or kind not in (*_REGULAR, _DIR):
        raise error(f"member is not a regular file (tar type {kind!r})", first)
    text = pax.get("path")
    if text is None:
        text = name.decode("utf-8", "surrogateescape")
    is_dir = kind == _DIR or (kind == b"\x00" and text.endswith("/"))
    return Entry(first, data, size, text, is_dir)


def _parse(block: bytes) -> tuple[bytes, int, bytes] | None:
    """(name, size, type flag) of a header block, or None when its checksum or fields are bad."""
    try:
        chksum = int(block[148:156].split(b"\x00", 1)[0].strip() or b"0", 8)
        if block[124] & 0x80:  # base-256 (GNU): members of 8 GiB and more
            if block[124] != 0x80:
                return None
            size = int.from_bytes(block[125:136], "big")
        else:
            size = int(block[124:136].split(b"\x00", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None
    unsigned = sum(block) - sum(block[148:156]) + 256  # the checksum field counts as spaces
    if chksum != unsigned and chksum != _signed_sum(block):
        return None
    name = block[:100].split(b"\x00", 1)[0]
    if block[257:263] == b"ustar\x00":  # POSIX ustar: a path prefix
        prefix = block[345:500].split(b"\x00", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name, size, block[156:157]


def _signed_sum(block: bytes) -> int:
    """The checksum as some old tars computed it, with bytes as signed chars."""
    high = sum(1 for b in block[:148] + block[156:] if b >= 128)
    return sum(block) - sum(block[148:156]) + 256 - 256 * high


def _pax_records(data: bytes) -> dict[str, str] | None:
    """The "LEN key=value\\n" records of a pax header; None when they do not parse."""
    out: dict[str, str] = {}
    pos = 0
    n = len(data)
    while pos < n and data[pos] != 0:
        space = data.find(b" ", pos)
        if space < 0:
            return None
        try:
            length = int(data[pos:space])
        except ValueError:
            return None
        stop = pos + length
        if length <= 0 or stop > n or data[stop - 1] != 0x0A:
            return None
        key, eq, value = data[space + 1 : stop - 1].partition(b"=")
        if not eq:
            return None
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = stop
    return out


def _check_tail(f: IO[bytes], pos: int, end: int, error: Error) -> None:
    """After the end-of-archive block, only zeros (a second tar appended would be lost)."""
    f.seek(pos)
    while pos < end:
        tail = f.read(min(_TAIL_READ, end - pos))
        if not tail:
            return
        if tail.count(0) != len(tail):
            raise error("data after the end-of-archive block (concatenated tars?)", pos)
        pos += len(tail)
