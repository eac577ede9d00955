"""WebDataset tar shards (`.tar`): a record is a sample, a chunk a run of whole samples.

A sample is the run of consecutive regular-file members whose paths share a key: the path up to
the first dot of its basename (`a/b/x01.seg.png` has key `a/b/x01` and extension `seg.png`). It
is handed out as `{"__key__": key, extension: bytes, ...}`.

What a shard may hold: regular files with an extension, and directory entries (skipped: they
carry no data). Anything else is refused when the dataset is set, naming the file and the
member's offset rather than skipping it: a member without an extension (it cannot be named in a
sample), two members of one sample with the same extension (one would be lost), links, devices,
FIFOs, sparse files, and pax global headers other than a comment (a chunk read from its own
start would not see them). A key that comes back after another sample makes two samples, as in
WebDataset itself.

The master reads the tar headers only (`tarheaders`: ustar, GNU long names, pax; member data is
seeked over), each checked, and the walk must stop at an end-of-archive block followed by
nothing but zeros: not at a damaged header, a cut at a member boundary, or a second tar
appended. A trainer parses its chunk's headers again and checks that they tile the chunk
exactly and give the sample count the master found. Tar has no checksum over member data:
damage inside a member's bytes cannot be seen, only damage to headers and framing.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import IO, Any, Final, NamedTuple

from chunkmaster.core.model import Chunk
from chunkmaster.formats.base import ByteBounded, FileIndex, FormatError, Storage
from chunkmaster.formats.listed import ListedChunk
from chunkmaster.formats.tarheaders import entries, padded
from chunkmaster.inflate import DEFAULT_MAX_INFLATED

DEFAULT_MAX_BYTES: Final = 4 << 20
"""Default bound on a chunk's bytes (a sample larger than it is a chunk of its own; the master's
--chunk-size sets another): samples are often images, read slowly one chunk each (as TFRecord)."""
DEFAULT_MAX_SAMPLES: Final = 65536
LARGE_SAMPLE: Final = 32 << 10
"""Average sample size from which a trainer reads a chunk member by member."""


class Member(NamedTuple):
    key: str
    ext: str
    start: int  # its first header (extended headers included)
    data: int  # its data
    size: int  # data bytes

    @property
    def end(self) -> int:
        """Where the next header starts: the data padded to a whole block."""
        return self.data + padded(self.size)


class WebDatasetFormat(ByteBounded):
    """WebDataset tar shards: chunk boundaries from the tar headers; records are sample dicts."""

    name = "webdataset"
    suffixes = (".tar",)
    ranged = True

    def __init__(
        self, max_bytes: int = DEFAULT_MAX_BYTES, max_samples: int = DEFAULT_MAX_SAMPLES
    ) -> None:
        super().__init__(max_bytes, max_samples, "max_samples")
        self.max_samples = max_samples

    def read_index(
        self, path: str, storage: Storage, chunk_size: int | None, max_inflated: int
    ) -> FileIndex:
        """The tar headers (shards are not compressed: nothing is inflated)."""
        max_bytes = chunk_size or self.max_bytes
        size = storage.size(path)
        offsets: list[int] = []
        counts: list[int] = []
        lengths: list[int] = []
        if size == 0:
            return FileIndex(offsets, counts, lengths, 0)
        first = end = n = 0  # the open chunk: its start, the end of its last sample, samples
        with storage.open(path) as f:
            for sample in _samples(_members(f, path, 0, size, None)):
                start, stop = sample[0].start, sample[-1].end
                if n and (stop - first > max_bytes or n >= self.max_samples):
                    offsets.append(first)
                    counts.append(n)
                    lengths.append(end - first)
                    n = 0
                if n == 0:
                    first = start
                n += 1
                end = stop
        if n:
            offsets.append(first)
            counts.append(n)
            lengths.append(end - first)
        return FileIndex(offsets, counts, lengths, size)

    def loader(self, *, max_inflated: int = DEFAULT_MAX_INFLATED) -> WebDatasetLoader:
        return WebDatasetLoader()


class WebDatasetLoader:
    """Reads one chunk of samples, checking its tar headers.

    A chunk of small samples is fetched whole (one ranged read) and its members sliced out. A
    chunk of large samples (`LARGE_SAMPLE` bytes and more on average) is read from the file
    member by member, each straight into its own `bytes`: one copy instead of two, and no fresh
    chunk-sized buffer to fault in.
    """

    def load(self, chunk: Chunk, storage: Storage, data: bytes | None = None) -> ListedChunk:
        where = _Where(chunk.path, 0, chunk.offset)
        end = chunk.offset + chunk.length
        if data is None and chunk.length >= LARGE_SAMPLE * max(chunk.num_records, 1):
            with storage.open(chunk.path) as f:
                f.seek(chunk.offset)
                records = _read_samples(f, chunk.offset, end, where, None)
        else:
            if data is None:
                (data,) = storage.read_ranges(chunk.path, [(chunk.offset, chunk.length)])
            if len(data) < chunk.length:
                raise where.error(
                    f"the file ends {chunk.length - len(data)} bytes before the chunk's end "
                    "(truncated since the dataset was set)",
                    chunk.offset + len(data),
                )
            records = _read_samples(io.BytesIO(data), 0, chunk.length, where, data)
        if len(records) != chunk.num_records:
            raise where.error(
                f"{len(records)} samples where the dataset's index has {chunk.num_records}",
                chunk.offset,
            )
        return ListedChunk(records)


def _read_samples(
    f: IO[bytes], start: int, end: int, where: _Where, data: bytes | None
) -> list[dict[str, Any]]:
    """The samples of the tar members in f's bytes [start, end): sliced out of `data` (all of
    f, the chunk's bytes) when given, else read from `f` (the file)."""
    records: list[dict[str, Any]] = []
    shift = 0 if data is None else where.offset
    for sample in _samples(_members(f, where.path, start, end, where, shift)):
        record: dict[str, Any] = {"__key__": sample[0].key}
        for m in sample:
            if data is not None:
                record[m.ext] = data[m.data : m.data + m.size]
                continue
            f.seek(m.data)
            record[m.ext] = got = f.read(m.size)
            if len(got) < m.size:
                raise where.error(
                    "the file ends inside a member's data (truncated since the dataset was set)",
                    shift + m.data + len(got),
                )
        records.append(record)
    return records


class _Where(NamedTuple):
    """A chunk's file, number and offset, for errors found while reading it."""

    path: str
    chunk: int
    offset: int

    def error(self, what: str, at: int) -> FormatError:
        return FormatError(
            f"{what} (at byte {at})", path=self.path, chunk=self.chunk, offset=self.offset
        )


def _samples(members: Iterator[Member]) -> Iterator[list[Member]]:
    """Consecutive members sharing a key, grouped (the caller checked extensions are unique)."""
    sample: list[Member] = []
    for m in members:
        if sample and m.key != sample[0].key:
            yield sample
            sample = []
        sample.append(m)
    if sample:
        yield sample


def _members(
    f: IO[bytes], path: str, start: int, end: int, where: _Where | None, shift: int = 0
) -> Iterator[Member]:
    """The regular-file members of the tar in f's bytes [start, end), checked.

    `where` None: a whole file, which must end with an end-of-archive block and zeros; else a
    chunk, whose headers must tile exactly [start, end). Offsets are f's; errors name the
    file's (f's offset 0 is the file's offset `shift`).
    """

    def error(what: str, at: int) -> FormatError:
        if where is None:
            return FormatError(f"{what} (at byte {at})", path=path)
        return where.error(what, shift + at)

    key = ""
    exts: set[str] = set()
    for e in entries(f, start, end, where is None, error):
        if e.is_dir:
            continue
        name = e.name
        slash = name.rfind("/") + 1
        dot = name.find(".", slash)
        if dot < 0 or dot == len(name) - 1:
            raise error("member without an extension (cannot be named in a sample)", e.start)
        k, ext = name[:dot], name[dot + 1 :]
        if k != key:
            key = k
            exts.clear()
        elif ext in exts:
            raise error("a second member with the same key and extension", e.start)
        exts.add(ext)
        yield Member(k, ext, e.start, e.data, e.size)


FORMAT = WebDatasetFormat()
