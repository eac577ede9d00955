"""`chunkmaster recordio`: inspect, cat, write and digest RecordIO files."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

from chunkmaster.cli.common import CliError
from chunkmaster.digest import Digest
from chunkmaster.recordio import (
    Compressor,
    Index,
    RecordIOError,
    Writer,
    read_chunk_headers,
    scan,
)
from chunkmaster.recordio.source import open_source

_COMPRESSORS = {"none": Compressor.NONE, "snappy": Compressor.SNAPPY, "gzip": Compressor.GZIP}


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "recordio", help="inspect, read, write and digest RecordIO files"
    )

    def usage(args: argparse.Namespace) -> int:
        p.print_help(sys.stderr)
        return 2

    p.set_defaults(func=usage)
    cmds = p.add_subparsers(dest="recordio_command", metavar="SUBCOMMAND")

    q = cmds.add_parser("inspect", help="chunks, records, compressors and sizes per file")
    q.add_argument("files", nargs="+", metavar="FILE")
    q.add_argument("--verify", action="store_true", help="decode every chunk, check checksums")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.set_defaults(func=_inspect)

    c = cmds.add_parser("cat", help="print records, one per line (or length-prefixed with --raw)")
    c.add_argument("file", metavar="FILE")
    c.add_argument("--range", metavar="START:LEN", help="global record range (LEN -1: to end)")
    c.add_argument("--raw", action="store_true", help="4-byte little-endian length + bytes")
    c.set_defaults(func=_cat)

    w = cmds.add_parser("write", help="write records from lines (stdin/files) or whole files")
    _write_options(w, argparse.SUPPRESS)
    w.add_argument("out", metavar="OUT")
    # Options may also follow OUT (`write out.rio --from files a b`); plain argparse cannot
    # resume positionals after an option, so the rest is parsed intermixed in _write.
    w.add_argument("rest", nargs=argparse.REMAINDER, metavar="[INPUT ...]")
    w.set_defaults(func=_write)

    d = cmds.add_parser("digest", help="record count and order-independent digest per file")
    d.add_argument("files", nargs="+", metavar="FILE")
    d.set_defaults(func=_digest)


def _fail(exc: Exception, what: str) -> CliError:
    """One line for the user: corrupt data names file/chunk/offset; I/O errors name the file."""
    if isinstance(exc, RecordIOError):
        return CliError(f"corrupt RecordIO file: {exc}")
    if isinstance(exc, FileNotFoundError):
        return CliError(f"{what}: no such file")
    if isinstance(exc, IsADirectoryError):
        return CliError(f"{what}: is a directory")
    if isinstance(exc, OSError):
        return CliError(f"{what}: {exc.strerror or exc}")
    return CliError(f"{what}: {exc}")


def _raw_size(f: Any, offset: int, compressor: int, size: int) -> int | None:
    """Uncompressed size without decompressing: trailer (gzip) or frame headers (snappy)."""
    if compressor == Compressor.NONE:
        return size
    f.seek(offset + 20)
    payload = f.read(size)
    if compressor == Compressor.GZIP:
        return int.from_bytes(payload[-4:], "little") if len(payload) >= 18 else None
    if compressor != Compressor.SNAPPY:
        return None
    import cramjam

    total, pos = 0, 0
    while pos + 4 <= len(payload):
        kind = payload[pos]
        n = int.from_bytes(payload[pos + 1 : pos + 4], "little")
        body = payload[pos + 8 : pos + 4 + n]
        if kind == 0x00:
            total += int(cramjam.snappy.decompress_raw_len(bytes(body)))
        elif kind == 0x01:
            total += len(body)
        pos += 4 + n
    return total


def _inspect_one(path: str, verify: bool) -> dict[str, Any]:
    headers = read_chunk_headers(path)
    chunks: list[dict[str, Any]] = []
    with open_source(path) as src:
        f = src.file
        for info in headers:
            h = info.header
            raw = _raw_size(f, info.offset, h.compressor, h.compressed_size)
            chunks.append(
                {
                    "chunk": info.chunk,
                    "offset": info.offset,
                    "records": h.num_records,
                    "compressor": _name(h.compressor),
                    "stored_size": h.compressed_size,
                    "raw_size": raw,
                }
            )
    if verify:
        for entry in chunks:
            one = Index([entry["offset"]], [entry["records"]])
            # Exact raw size from the decoded records; raises on any damage.
            try:
                entry["raw_size"] = sum(4 + len(r) for r in scan(path, one, -1, -1))
            except RecordIOError as exc:  # renumber: the one-chunk index calls it chunk 0
                raise type(exc)(
                    exc.reason, path=exc.path, chunk=entry["chunk"], offset=exc.offset
                ) from None
    raw_sizes = [c["raw_size"] for c in chunks]
    return {
        "file": path,
        "file_size": sum(c["stored_size"] + 20 for c in chunks),
        "chunks": len(chunks),
        "records": sum(c["records"] for c in chunks),
        "compressors": sorted({c["compressor"] for c in chunks}),
        "stored_size": sum(c["stored_size"] for c in chunks),
        "raw_size": None if None in raw_sizes else sum(raw_sizes),
        "verified": verify,
        "chunk_list": chunks,
    }


def _name(compressor: int) -> str:
    try:
        return Compressor(compressor).name.lower()
    except ValueError:
        return f"unknown({compressor})"


def _inspect(args: argparse.Namespace) -> int:
    reports = []
    for path in args.files:
        try:
            reports.append(_inspect_one(path, args.verify))
        except (RecordIOError, OSError) as exc:
            raise _fail(exc, path) from None
    if args.json:
        json.dump(reports if len(reports) > 1 else reports[0], sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    for r in reports:
        raw = "?" if r["raw_size"] is None else r["raw_size"]
        print(
            f"{r['file']}: {r['chunks']} chunks, {r['records']} records, "
            f"compressor {','.join(r['compressors']) or '-'}, stored {r['stored_size']} bytes, "
            f"raw {raw} bytes{', verified OK' if r['verified'] else ''}"
        )
    return 0


def _parse_range(text: str | None) -> tuple[int, int]:
    if text is None:
        return 0, -1
    start, sep, length = text.partition(":")
    try:
        return int(start or 0), int(length) if sep and length else -1
    except ValueError:
        raise CliError(f"--range: expected START:LEN (integers), got {text!r}", 2) from None


def _cat(args: argparse.Namespace) -> int:
    start, length = _parse_range(args.range)
    out = sys.stdout.buffer
    try:
        if args.raw:
            for r in scan(args.file, None, start, length):
                out.write(len(r).to_bytes(4, "little"))
                out.write(r)
        else:
            for r in scan(args.file, None, start, length):
                out.write(r)
                out.write(b"\n")
    except (RecordIOError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            raise
        raise _fail(exc, args.file) from None
    out.flush()
    return 0


def _lines(streams: Iterable[IO[bytes]]) -> Iterator[bytes]:
    for s in streams:
        for line in s:
            yield line[:-1] if line.endswith(b"\n") else line


def _write_options(p: argparse.ArgumentParser, default: Any) -> None:
    p.add_argument("--compressor", choices=sorted(_COMPRESSORS), default=default)
    p.add_argument("--max-chunk-size", type=int, default=default, metavar="N")
    p.add_argument(
        "--from",
        dest="source",
        choices=["lines", "files"],
        default=default,
        help="lines: one record per line (no newline kept); files: one record per file",
    )


def _write_args(args: argparse.Namespace) -> None:
    """Merge options given after OUT, then fill defaults."""
    rest = argparse.ArgumentParser(prog="chunkmaster recordio write OUT", add_help=False)
    _write_options(rest, argparse.SUPPRESS)
    rest.add_argument("inputs", nargs="*")
    for key, value in vars(rest.parse_intermixed_args(args.rest)).items():
        setattr(args, key, value)
    defaults = {"compressor": "snappy", "max_chunk_size": 32 * 1024 * 1024, "source": "lines"}
    for key, value in defaults.items():
        if not hasattr(args, key):
            setattr(args, key, value)


def _write(args: argparse.Namespace) -> int:
    _write_args(args)
    if args.source == "files" and not args.inputs:
        raise CliError("--from files needs at least one INPUT file", 2)
    records: Iterator[bytes]
    opened: list[IO[bytes]] = []
    try:
        if args.source == "files":
            records = (_read_file(p) for p in args.inputs)
        elif args.inputs:
            opened = [open(p, "rb") for p in args.inputs]  # noqa: SIM115 - closed below
            records = _lines(opened)
        else:
            records = _lines([sys.stdin.buffer])
        with Writer(args.out, args.max_chunk_size, _COMPRESSORS[args.compressor]) as w:
            for r in _progress(records):
                w.write(r)
        print(f"{args.out}: {w.num_records} records in {w.num_chunks} chunks", file=sys.stderr)
    except OSError as exc:
        raise _fail(exc, exc.filename or args.out) from None
    finally:
        for f in opened:
            f.close()
    return 0


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _progress(records: Iterator[bytes]) -> Iterator[bytes]:
    """A tqdm bar only for a person watching (stderr is a terminal)."""
    if not sys.stderr.isatty():
        return records
    from tqdm import tqdm

    return iter(tqdm(records, unit=" records", file=sys.stderr))


def _digest(args: argparse.Namespace) -> int:
    total = Digest()
    for path in args.files:
        d = Digest()
        try:
            for r in scan(path):
                d.add(r)
        except (RecordIOError, OSError) as exc:
            raise _fail(exc, path) from None
        print(f"{path}\t{d.count} records\t{d.hex()}")
        total.merge(d)
    print(f"total\t{total.count} records\t{total.hex()}")
    return 0
