"""Data checkpoints as bytes, and the dataset fingerprint that guards restoring one.

A data checkpoint is the job's data position at the last commits; a fresh master restores it to
continue exactly there. The blob is versioned, checked end to end and compact: the wholly
committed tasks of a pass are a bitmap (1 bit a task, zlib), so a million tasks cost ~125 KB.
No pickle: reading a checkpoint must not mean running code. Layout (little-endian):

    header   magic  8s  b"\\x89CMCKP\\r\\n"   (the \\r\\n pair shows text-mode damage)
             version u32 (VERSION, or VERSION_SHUFFLED for a job with a shuffle seed, or
               VERSION_MIXTURE for a mixture, with or without one, or VERSION_WINDOWED for
               a job with a shuffle window, a mixture or not, or VERSION_RANGES for any of
               these with committed ranges beyond a task's prefix),
             body length u64
    body     JSON length u32, JSON (ASCII): job, created, num_tasks, floor,
               dataset {globs, cpt, files: [[path, size, chunks, records, index digest hex]],
                 format (absent: "recordio"), chunk_size (the bound the master cut the
                 chunks at, for the formats it cuts; absent: the files' own chunks, or a
                 checkpoint older than the setting: LEGACY_CHUNK_SIZE)},
               shuffle_seed (VERSION_SHUFFLED only: with it, task t covers other chunks
               every pass, so the commits mean something under this seed only; in a
               mixture it orders the sources' epochs),
               shuffle_window (VERSION_WINDOWED only, with a shuffle_seed: records per
                 window trainers read each task's records in, permuted; a task's partial
                 commit counts records in that order, so it means something under this
                 window only),
               mixture (VERSION_MIXTURE or VERSION_WINDOWED only: the dataset's files are
                 its sources', in order; num_tasks is the units of a pass, and the commits
                 name units):
                 sources [[name, globs, number of files, format, chunk_size, weight]],
                 weights (the schedule in force: [mode, [[records, weight, ...], ...]]),
                 passes [[pass_id, [cursors, weights, re-plans]]] from the floor to the
                   last pass with commits: how each was planned (core/mixture.py)
               passes [[pass_id, full count, bitmap bytes, partial count]], ascending,
               job_id (absent in checkpoints older than it: the job's identity, hex, which a
                 running job checks a checkpoint restored onto it against),
               ranges (VERSION_RANGES only: [[pass_id, task, start, end]], ascending, each a
                 task's records [start, end) committed beyond its committed prefix: equal
                 steps split the task in pieces and a later one was committed first; they lie
                 within the task, after its prefix, sorted and apart, in a pass of `passes`)
             then per pass, in order: bitmap (zlib of ceil(num_tasks/8) bytes, task t is bit
               t % 8 of byte t // 8, padding bits 0), partial task ids u32[n] ascending,
               partial records u64[n]
    trailer  blake2b-128 of header + body

A file's index digest is blake2b-128 of its chunk offsets (u64 each) then records (u32 each).

Every field has a range (`_check`: a name without control characters, a time before the year
10000, passes below 2**62 so that pass + 1 still fits the wire's int64, ...), and the file's
size follows from its header: the JSON is at most MAX_HEAD_SIZE bytes, and a pass of N tasks
adds at most zlib's bound for N bits plus 12 bytes a task. `check_prefix` and `check_head`
let a reader refuse a file from its first bytes, before reading a body it could not hold.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import sys
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress, pairwise
from typing import Any

from chunkmaster.core.dataset import Dataset, count_tasks
from chunkmaster.core.mixture import (
    MixtureError,
    MixtureState,
    PassPlan,
    Weights,
    name_problem,
    plan_from_json,
    plan_json,
    weights_from_json,
    weights_json,
    widen_plan,
)
from chunkmaster.core.shuffle import MAX_SEED, MAX_WINDOW
from chunkmaster.core.sizes import size_text

if sys.byteorder != "little":  # pragma: no cover - every platform we ship for is little-endian
    raise ImportError("chunkmaster's checkpoint format assumes a little-endian machine")

MAGIC = b"\x89CMCKP\r\n"
VERSION = 1
VERSION_SHUFFLED = 2
VERSION_MIXTURE = 3
VERSION_WINDOWED = 4
#: Any of the others with committed ranges beyond tasks' prefixes: a reader without them would
#: deliver those records again, so it must refuse the file.
VERSION_RANGES = 5
VERSIONS = (VERSION, VERSION_SHUFFLED, VERSION_MIXTURE, VERSION_WINDOWED, VERSION_RANGES)
_HEADER = struct.Struct("<8sIQ")
_JSON_LEN = struct.Struct("<I")
_DIGEST_SIZE = 16
_MAX_TASK_ID = 0xFFFFFFFF  # partial task ids are u32
_MAX_RECORDS = 0xFFFFFFFFFFFFFFFF  # partial records are u64
_MAX_I64 = 2**63 - 1  # file sizes, chunk counts, chunks per task
_MAX_PASS = 2**62  # far beyond any job; pass + 1 still fits the wire's int64
_MAX_CREATED = 253402300799.0  # 9999-12-31T23:59:59Z: what a calendar can show
_MAX_TEXT = 4096  # characters of a path or a glob
_MAX_NAME = 255  # characters of a job name
_FORMAT_NAME = re.compile(r"[a-z0-9_-]{1,32}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_JOB_ID = re.compile(r"[0-9a-f]{0,64}")
#: {mixture: {passes: [[p, [cursors, [mode, [[at, w]]], [[at, [mode, [[at, w]]]]]]]]}}: a
#: deeper header is no checkpoint's.
_HEAD_DEPTH = 10
#: The JSON header's limit in bytes: about 400,000 files of 100-character paths.
MAX_HEAD_SIZE = 64 << 20
#: The bytes `check_prefix` needs: the fixed header and the JSON header's length.
PREFIX_SIZE = 24
_RECORDIO_MAGIC = bytes.fromhex("04030201")
_STORE_MAGIC = b"CMB1"

_WHAT_TO_DO = "give the file a chunkmaster master wrote as its data checkpoint"

LEGACY_CHUNK_SIZE = 4 << 20
"""The chunk size of a checkpoint that records none, for a format the master cuts (JSON Lines,
text, TFRecord, WebDataset): the default of every such format before the size was a setting."""


class CheckpointError(ValueError):
    """A data checkpoint that cannot be written or restored (the text says what and why)."""


@dataclass(frozen=True)
class FileFingerprint:
    path: str
    size: int  # bytes, or -1 if unknown
    num_chunks: int
    num_records: int
    index_digest: bytes  # 16-byte blake2b of the file's chunk (offset, records) arrays


@dataclass(frozen=True)
class DatasetFingerprint:
    globs: tuple[str, ...]
    chunks_per_task: int
    files: tuple[FileFingerprint, ...]
    format: str = "recordio"  # the files' format (chunkmaster.formats)
    chunk_size: int | None = None  # the bound the chunks were cut at (Dataset.chunk_size)

    @property
    def num_chunks(self) -> int:
        return sum(f.num_chunks for f in self.files)


@dataclass(frozen=True)
class PassCommits:
    pass_id: int
    full: frozenset[int]  # tasks wholly committed in this pass
    partial: Mapping[int, int]  # task -> records committed, 0 < records < the task's records
    #: task -> [start, end) ranges committed beyond its prefix (the prefix: `partial`, or 0),
    #: ascending and apart: a task split by equal steps whose later pieces were committed first
    ranges: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class SourcePart:
    """One source of a mixture's checkpoint: its name, patterns, how many of the checkpoint's
    files are its own (in order, after the sources before it), their format and chunk bound,
    and the weight it was set with."""

    name: str
    globs: tuple[str, ...]
    num_files: int
    format: str = "recordio"
    chunk_size: int | None = None
    weight: float = 1.0


@dataclass(frozen=True)
class MixtureCheckpoint:
    """A mixture's position beside its commits: its sources, the weights in force, and how
    each pass from the floor to the last with commits was planned."""

    sources: tuple[SourcePart, ...]
    weights: Weights
    passes: tuple[tuple[int, PassPlan], ...]

    def source_fingerprints(self, ds: DatasetFingerprint) -> list[DatasetFingerprint]:
        """Each source's own fingerprint, cut from the checkpoint's dataset's."""
        out, first = [], 0
        for s in self.sources:
            files = ds.files[first : first + s.num_files]
            out.append(
                DatasetFingerprint(s.globs, ds.chunks_per_task, files, s.format, s.chunk_size)
            )
            first += s.num_files
        return out


@dataclass(frozen=True)
class DataCheckpoint:
    job: str
    created: float  # wall-clock seconds (informational only)
    dataset: DatasetFingerprint
    num_tasks: int
    floor: int  # the first pass not wholly committed; passes before it are done
    passes: tuple[PassCommits, ...]  # passes >= floor that have commits, ascending
    shuffle_seed: int | None = None  # the job's seed: the pass layouts the commits are in
    mixture: MixtureCheckpoint | None = None  # a mixture's sources and plans
    job_id: str = ""  # the job's identity ("": written before jobs had one)
    shuffle_window: int = 0  # the job's window: the order partial commits count records in


def _prefix_tasks(cp: DataCheckpoint) -> list[int]:
    """The tasks of a mixture checkpoint's first source, first two, ... all of them."""
    assert cp.mixture is not None
    out, total = [], 0
    for f in cp.mixture.source_fingerprints(cp.dataset):
        total += count_tasks(f.num_chunks, cp.dataset.chunks_per_task)
        out.append(total)
    return out


def set_with(cp: DataCheckpoint) -> int | None:
    """How many of a mixture checkpoint's sources its job's dataset was set with (the others
    were added while it ran, after them): its passes are their tasks in units. None: no number
    of them has that many tasks."""
    prefix = _prefix_tasks(cp)
    return prefix.index(cp.num_tasks) + 1 if cp.num_tasks in prefix else None


# --- fingerprint -------------------------------------------------------------------------------


def _typed(a: array[int], typecode: str) -> array[int]:
    return a if a.typecode == typecode else array(typecode, a)


def fingerprint(ds: Dataset, sizes: Sequence[int] | None = None) -> DatasetFingerprint:
    """What a checkpoint must find again to be restorable: the files, in order, and their chunks."""
    if sizes is None and ds.file_sizes is not None:
        sizes = ds.file_sizes
    if sizes is not None and len(sizes) != len(ds.files):
        raise ValueError(f"{len(sizes)} file sizes for {len(ds.files)} files")
    offsets, records, cf = (
        _typed(ds.chunk_offset, "Q"),
        _typed(ds.chunk_records, "I"),
        ds.chunk_file,
    )
    files: list[FileFingerprint] = []
    start = 0
    for file_no, path in enumerate(ds.files):
        end = bisect_left(cf, file_no + 1, start)
        if cf[start:end].count(file_no) != end - start:
            raise ValueError(f"chunks of {path} are not contiguous in the dataset")
        h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
        h.update(offsets[start:end].tobytes())
        h.update(records[start:end].tobytes())
        size = -1 if sizes is None else int(sizes[file_no])
        files.append(FileFingerprint(path, size, end - start, sum(records[start:end]), h.digest()))
        start = end
    if start != len(cf):
        raise ValueError(f"{len(cf) - start} chunks name a file beyond the dataset's files")
    return DatasetFingerprint(
        tuple(ds.globs), ds.chunks_per_task, tuple(files), ds.format, ds.chunk_size
    )


def mixture_parts(ds: Dataset) -> tuple[SourcePart, ...]:
    """A mixture dataset's sources as its data checkpoint holds them."""
    return tuple(
        SourcePart(s.name, s.globs, s.num_files, s.format, s.chunk_size, s.weight)
        for s in ds.sources
    )


def with_paths(cp: DataCheckpoint, resolve: Callable[[str], str]) -> DataCheckpoint:
    """`cp` with its dataset's patterns and file paths passed through `resolve`: a master
    reads relative ones (in checkpoints written before patterns were kept absolute) in its
    working directory, and compares what it indexes with that."""
    ds = cp.dataset
    files = tuple(replace(f, path=resolve(f.path)) for f in ds.files)
    globs = tuple(resolve(g) for g in ds.globs)
    mix = cp.mixture
    if mix is not None:
        sources = tuple(replace(s, globs=tuple(map(resolve, s.globs))) for s in mix.sources)
        mix = replace(mix, sources=sources)
    return replace(cp, dataset=replace(ds, globs=globs, files=files), mixture=mix)


def chunk_size_refusal(expected: DatasetFingerprint, chunk_size: int | None) -> str | None:
    """Why the checkpoint's dataset cannot be indexed again at `chunk_size` (the bound this
    master cuts its format's chunks at; None: the files' own chunks), or None. Known before
    any file is read: another bound cuts other chunks, so other tasks."""
    if chunk_size is None:
        return None
    recorded = expected.chunk_size
    theirs = LEGACY_CHUNK_SIZE if recorded is None else recorded
    if theirs == chunk_size:
        return None
    why = (
        " (it records none: it was written before --chunk-size, when every "
        f"{expected.format} dataset was cut at {size_text(LEGACY_CHUNK_SIZE)} unless "
        "CHUNKMASTER_*_CHUNK_BYTES said otherwise)"
        if recorded is None
        else ""
    )
    return (
        f"chunk size changed: the data checkpoint's {expected.format} chunks were cut at "
        f"{size_text(theirs)}{why}, this master cuts them at {size_text(chunk_size)}, which "
        f"makes other chunks and tasks. Start the master with --chunk-size {size_text(theirs)} "
        "to restore it"
    )


def differences(
    expected: DatasetFingerprint, actual: DatasetFingerprint, limit: int = 10
) -> list[str]:
    """What changed from `expected` to `actual`, one line each; empty means the same dataset.

    A size of -1 (unknown) on either side is not a difference."""
    lines: list[str] = []
    if expected.globs != actual.globs:
        lines.append(f"globs changed: {list(expected.globs)} -> {list(actual.globs)}")
    if expected.format != actual.format:
        lines.append(f"format changed: {expected.format} -> {actual.format}")
    if expected.chunks_per_task != actual.chunks_per_task:
        lines.append(
            f"chunks per task changed: {expected.chunks_per_task} -> {actual.chunks_per_task}"
        )
    if None not in (expected.chunk_size, actual.chunk_size) and (
        expected.chunk_size != actual.chunk_size
    ):
        lines.append(f"chunk size changed: {expected.chunk_size} -> {actual.chunk_size} bytes")
    old = {f.path: f for f in expected.files}
    new = {f.path: f for f in actual.files}
    lines.extend(f"file missing: {f.path}" for f in expected.files if f.path not in new)
    lines.extend(f"file added: {f.path}" for f in actual.files if f.path not in old)
    for e in expected.files:
        a = new.get(e.path)
        if a is None:
            continue
        before = len(lines)
        if e.size >= 0 and a.size >= 0 and e.size != a.size:
            lines.append(f"{e.path}: size changed: {e.size} -> {a.size} bytes")
        if e.num_chunks != a.num_chunks:
            lines.append(f"{e.path}: chunk count changed: {e.num_chunks} -> {a.num_chunks}")
        if e.num_records != a.num_records:
            lines.append(f"{e.path}: records changed: {e.num_records} -> {a.num_records}")
        if e.index_digest != a.index_digest and len(lines) == before:
            lines.append(f"{e.path}: chunk index changed (chunk offsets or records per chunk)")
    common_old = [f.path for f in expected.files if f.path in new]
    common_new = [f.path for f in actual.files if f.path in old]
    if common_old != common_new:
        at = next(
            (i for i, (x, y) in enumerate(zip(common_old, common_new, strict=False)) if x != y),
            None,
        )
        if at is not None:
            lines.append(
                f"file order changed: {common_new[at]} is where {common_old[at]} was "
                f"(task ids would move)"
            )
    if len(expected.files) != len(set(old)) or len(actual.files) != len(set(new)):
        lines.append("a file is listed twice in a dataset")
    if len(lines) > limit:
        lines[limit:] = [f"... and {len(lines) - limit} more"]
    return lines


# --- semantic checks (both directions) ---------------------------------------------------------


def _shown(value: object) -> str:
    """A value for an error line: never more than a few dozen characters of it."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:24]}... ({len(text)} characters)"


def _ranged(value: int, what: str, low: int, high: int, high_text: str = "") -> None:
    if not low <= value <= high:
        raise CheckpointError(
            f"{what} {_shown(value)} is out of range ({low} to {high_text or high})"
        )


def _text(value: str, what: str, limit: int = _MAX_TEXT) -> None:
    if len(value) > limit:
        raise CheckpointError(f"{what} is longer than {limit} characters")
    if "\x00" in value:
        raise CheckpointError(f"{what} holds a NUL character")


def _check(cp: DataCheckpoint) -> None:
    """Refuse a checkpoint whose content is out of range or contradicts itself, whichever side
    made it; each error names the field."""
    _check_job(cp)
    _ranged(cp.num_tasks, "num_tasks", 0, _MAX_TASK_ID + 1, "2**32")
    _check_dataset(cp.dataset)
    _check_units(cp)
    _check_passes(cp)


def _check_job(cp: DataCheckpoint) -> None:
    """The job's name, identity and the time the checkpoint was made."""
    if not isinstance(cp.job, str):
        raise CheckpointError("job must be a string")
    _text(cp.job, "job", _MAX_NAME)
    if _CONTROL.search(cp.job):
        raise CheckpointError("job holds control characters")
    if not isinstance(cp.job_id, str) or not _JOB_ID.fullmatch(cp.job_id):
        raise CheckpointError("job_id must be up to 64 lowercase hex digits")
    if not math.isfinite(cp.created):
        raise CheckpointError("created must be a finite time")
    if not 0 <= cp.created <= _MAX_CREATED:
        raise CheckpointError(
            f"created {_shown(cp.created)} is out of range (0 to {_MAX_CREATED:.0f}: the end of "
            "the year 9999)"
        )


def _check_dataset(ds: DatasetFingerprint) -> None:
    """The dataset's settings and each file's fingerprint."""
    _ranged(ds.chunks_per_task, "chunks per task", 1, _MAX_I64, "2**63-1")
    if ds.chunk_size is not None:
        _ranged(ds.chunk_size, "chunk size", 1, _MAX_I64, "2**63-1")
    if not _FORMAT_NAME.fullmatch(ds.format):
        raise CheckpointError(
            f"format {_shown(ds.format)} is not a format name (1 to 32 of a-z, 0-9, _ and -)"
        )
    for i, glob in enumerate(ds.globs):
        _text(glob, f"glob {i}")
    for i, f in enumerate(ds.files):
        _text(f.path, f"file {i} path")
        _ranged(f.size, f"file {i} size", -1, _MAX_I64, "2**63-1")
        _ranged(f.num_chunks, f"file {i} chunk count", 0, _MAX_I64, "2**63-1")
        _ranged(f.num_records, f"file {i} records", 0, _MAX_RECORDS, "2**64-1")
        if len(f.index_digest) != _DIGEST_SIZE:
            raise CheckpointError(f"file {i} index digest is not {_DIGEST_SIZE} bytes")


def _check_units(cp: DataCheckpoint) -> None:
    """The units of a pass: the dataset's tasks, or a mixture's (its sources and plans)."""
    ds = cp.dataset
    if cp.mixture is not None:
        _check_mixture(cp, cp.mixture)
        if set_with(cp) is None:
            raise CheckpointError(
                f"num_tasks {cp.num_tasks} is not the tasks of the mixture's first sources "
                f"({', '.join(map(str, _prefix_tasks(cp)))}): the units of its passes"
            )
    elif cp.num_tasks != (expected_tasks := count_tasks(ds.num_chunks, ds.chunks_per_task)):
        raise CheckpointError(
            f"num_tasks {cp.num_tasks} does not match the dataset's {ds.num_chunks} chunks "
            f"at {ds.chunks_per_task} a task ({expected_tasks} tasks)"
        )


def _check_passes(cp: DataCheckpoint) -> None:
    """The floor, the shuffle seed and each pass's commits."""
    if cp.floor < 0:
        raise CheckpointError(f"floor {cp.floor} is negative")
    _ranged(cp.floor, "floor", 0, _MAX_PASS, "2**62")
    if cp.shuffle_seed is not None:
        _ranged(cp.shuffle_seed, "shuffle seed", 0, MAX_SEED, "2**64-1")
    _ranged(cp.shuffle_window, "shuffle window", 0, MAX_WINDOW, f"{MAX_WINDOW:,}")
    if cp.shuffle_window and cp.shuffle_seed is None:
        raise CheckpointError("a shuffle window without a shuffle seed")
    previous = cp.floor - 1
    for p in cp.passes:
        _ranged(p.pass_id, "pass", 0, _MAX_PASS, "2**62")
        if p.pass_id <= previous:
            raise CheckpointError(
                f"pass {p.pass_id} is out of order: passes must be ascending and from the "
                f"floor {cp.floor} on"
            )
        previous = p.pass_id
        if p.full and (min(p.full) < 0 or max(p.full) >= cp.num_tasks):
            raise CheckpointError(
                f"pass {p.pass_id}: a wholly committed task is not in 0..{cp.num_tasks - 1}"
            )
        for task, records in p.partial.items():
            if not 0 <= task < cp.num_tasks:
                raise CheckpointError(
                    f"pass {p.pass_id}: partly committed task {task} is not in "
                    f"0..{cp.num_tasks - 1}"
                )
            if not 0 < records <= _MAX_RECORDS:
                raise CheckpointError(
                    f"pass {p.pass_id}: task {task} has {records} records committed "
                    f"(a partial commit has at least 1)"
                )
            if task in p.full:
                raise CheckpointError(
                    f"pass {p.pass_id}: task {task} is both wholly and partly committed"
                )
        for task, ranges in p.ranges.items():
            _check_ranges(cp, p, task, ranges)


def _check_ranges(
    cp: DataCheckpoint, p: PassCommits, task: int, ranges: tuple[tuple[int, int], ...]
) -> None:
    """A task's ranges committed beyond its prefix: after it, ascending and apart (the task's
    end is checked against its records by `check_restorable`)."""
    where = f"pass {p.pass_id}: task {task}"
    if not 0 <= task < cp.num_tasks:
        raise CheckpointError(f"{where} has committed ranges and is not in 0..{cp.num_tasks - 1}")
    if task in p.full:
        raise CheckpointError(f"{where} is wholly committed and has committed ranges beyond it")
    if not ranges:
        raise CheckpointError(f"{where} has an empty list of committed ranges")
    at = p.partial.get(task, 0)
    for start, end in ranges:
        if not at < start < end <= _MAX_RECORDS:
            raise CheckpointError(
                f"{where}: committed range [{_shown(start)}, {_shown(end)}) is not after "
                f"record {at} (its prefix or the range before it), or is empty"
            )
        at = end


def _check_mixture(cp: DataCheckpoint, mix: MixtureCheckpoint) -> None:
    """A mixture's sources, weights and plans: in range and consistent with its commits."""
    names = [s.name for s in mix.sources]
    if not names:
        raise CheckpointError("a mixture has no source")
    if len(set(names)) != len(names):
        raise CheckpointError("a mixture names a source twice")
    if sum(s.num_files for s in mix.sources) != len(cp.dataset.files):
        raise CheckpointError(
            f"the mixture's sources hold {sum(s.num_files for s in mix.sources)} files, the "
            f"dataset {len(cp.dataset.files)}"
        )
    for i, s in enumerate(mix.sources):
        problem = name_problem(s.name)
        if problem is not None:
            raise CheckpointError(f"source {i}: {problem}")
        for g in s.globs:
            _text(g, f"source {s.name!r} glob")
        _ranged(s.num_files, f"source {s.name!r} file count", 1, _MAX_I64, "2**63-1")
        if not _FORMAT_NAME.fullmatch(s.format):
            raise CheckpointError(
                f"source {s.name!r} format {_shown(s.format)} is not a format name"
            )
        if s.chunk_size is not None:
            _ranged(s.chunk_size, f"source {s.name!r} chunk size", 1, _MAX_I64, "2**63-1")
    tasks = [
        count_tasks(f.num_chunks, cp.dataset.chunks_per_task)
        for f in mix.source_fingerprints(cp.dataset)
    ]
    if 0 in tasks:
        raise CheckpointError(f"source {names[tasks.index(0)]!r} has no chunk")
    try:
        Weights.fixed([s.weight for s in mix.sources]).check(names, bounds=False)
        mix.weights.check(names, bounds=False)
        for p, plan in mix.passes:
            _check_plan(p, plan, names, tasks, cp.num_tasks)
    except MixtureError as exc:
        raise CheckpointError(f"mixture: {exc}") from None
    planned = [p for p, _ in mix.passes]
    if planned != list(range(cp.floor, cp.floor + len(planned))) or not planned:
        raise CheckpointError(
            f"the mixture's plans are of passes {planned[:5]}, not the floor {cp.floor} on"
        )
    for c in cp.passes:
        if c.pass_id > planned[-1]:
            raise CheckpointError(f"pass {c.pass_id} has commits and no plan")


def _check_plan(
    pass_id: int, plan: PassPlan, names: list[str], tasks: list[int], units: int
) -> None:
    _ranged(pass_id, "pass", 0, _MAX_PASS, "2**62")
    if len(plan.start) != len(tasks):
        raise MixtureError(f"pass {pass_id}: {len(plan.start)} cursors for {len(tasks)} sources")
    for c, n in zip(plan.start, tasks, strict=True):
        if not (0 <= c.epoch <= _MAX_PASS and 0 <= c.next < n and 0 <= c.planned <= _MAX_I64):
            raise MixtureError(f"pass {pass_id}: a cursor out of range")
        if not math.isfinite(c.ahead):
            raise MixtureError(f"pass {pass_id}: a cursor's lead is not finite")
    plan.weights.check(names, bounds=False)
    last = -1
    for r in plan.replans:
        if not last < r.at < units:
            raise MixtureError(f"pass {pass_id}: re-plans out of order or past its {units} units")
        last = r.at
        r.weights.check(names, bounds=False)


def unit_records(cp: DataCheckpoint, ds: Dataset) -> dict[int, list[int]]:
    """Records per unit of each pass a mixture's checkpoint planned, planned again on `ds`
    (its sources: `check_restorable` first), up to the pass's last unit with a commit: the
    units a commit names (planning costs microseconds a unit; a pass may be a million)."""
    assert cp.mixture is not None
    mix = MixtureState.of(ds)
    records = ds.task_records
    last = {p.pass_id: max([*p.full, *p.partial, *p.ranges], default=-1) for p in cp.passes}
    n = len(ds.sources)  # sources after the checkpoint's have weight 0 in its plans
    return {
        p: [records[t] for t in mix.compute(widen_plan(plan, n), last.get(p, -1) + 1)[0]]
        for p, plan in cp.mixture.passes
    }


def _check_sources(cp: DataCheckpoint, ds: Dataset, sizes: Sequence[int] | None) -> list[str]:
    """What differs between a mixture checkpoint's sources and `ds`'s, one line each."""
    assert cp.mixture is not None
    mine = [s.name for s in cp.mixture.sources]
    theirs = [s.name for s in ds.sources]
    if not ds.sources:
        return [f"the data checkpoint is of a mixture of {mine}, this master's dataset is not one"]
    missing = [n for n in mine if n not in theirs]
    if missing:
        return [
            f"source(s) {', '.join(map(repr, missing))} of the data checkpoint are not in this "
            f"master's mixture {theirs}: every source of the checkpoint continues where it was"
        ]
    if theirs[: len(mine)] != mine:
        return [
            f"sources changed: {mine} -> {theirs} (the checkpoint's names first, in its order; "
            "sources added after them)"
        ]
    now = MixtureCheckpoint(mixture_parts(ds), cp.mixture.weights, ())
    lines = []
    pairs = zip(
        cp.mixture.source_fingerprints(cp.dataset),
        now.source_fingerprints(fingerprint(ds, sizes))[: len(mine)],
        strict=True,
    )
    for name, (old, new) in zip(mine, pairs, strict=True):
        lines += [f"source {name!r}: {line}" for line in differences(old, new)]
    return lines


def check_restorable(
    cp: DataCheckpoint, ds: Dataset, sizes: Sequence[int] | None = None, units: int | None = None
) -> dict[int, list[int]]:
    """Refuse restoring `cp` onto `ds` unless it is the dataset the checkpoint was taken on
    (a mixture: its sources, maybe followed by sources added since), whose passes are `units`
    units (None: its tasks). Returns a mixture's `unit_records` (computed here: its commits
    are checked against them; empty for one dataset)."""
    _check_shuffle(cp, ds)
    if cp.mixture is None and ds.sources:
        raise CheckpointError(
            "the data checkpoint is of one dataset, this master's is a mixture of sources "
            f"{[s.name for s in ds.sources]}"
        )
    if cp.mixture is not None:
        changes = _check_sources(cp, ds, sizes)
    else:
        changes = differences(cp.dataset, fingerprint(ds, sizes))
    if changes:
        raise CheckpointError(
            "the dataset changed since the data checkpoint was taken: "
            + "; ".join(changes)
            + ". Restore onto the same files, or start the job without --restore"
        )
    units = units if units is not None else ds.num_tasks
    if cp.mixture is not None and cp.num_tasks != units:
        raise CheckpointError(
            f"the data checkpoint's passes are {cp.num_tasks} units and this job's {units}: its "
            "recorded plans begin each pass after that many. Restore it when the job starts "
            "(chunkmaster master --restore), then add the sources (chunkmaster weights --add)"
        )
    records = unit_records(cp, ds) if cp.mixture is not None else {}
    for p in cp.passes:
        totals = records.get(p.pass_id) or ds.task_records_for(p.pass_id)
        for task, got in p.partial.items():
            if got >= totals[task]:
                raise CheckpointError(
                    f"pass {p.pass_id}: task {task} has {totals[task]} records, so {got} "
                    f"committed is not a partial commit"
                )
        for task, ranges in p.ranges.items():
            if ranges[-1][1] > totals[task]:
                raise CheckpointError(
                    f"pass {p.pass_id}: task {task} has {totals[task]} records, so a range "
                    f"committed up to record {ranges[-1][1]} is not within it"
                )
    return records


def _check_shuffle(cp: DataCheckpoint, ds: Dataset) -> None:
    """Refuse another shuffle seed or window than the checkpoint's: its commits name tasks of
    its seed's passes, and its partial commits count records in its window's order."""
    if cp.shuffle_seed != ds.shuffle_seed:
        raise CheckpointError(
            f"the data checkpoint was taken with shuffle seed {_seed_text(cp.shuffle_seed)} and "
            f"this master has {_seed_text(ds.shuffle_seed)}: its commits name tasks of the "
            f"checkpoint's shuffled passes. Start the master with "
            + (
                "no --shuffle-seed"
                if cp.shuffle_seed is None
                else f"--shuffle-seed {cp.shuffle_seed}"
            )
        )
    if cp.shuffle_window != ds.shuffle_window:
        raise CheckpointError(
            f"the data checkpoint was taken with shuffle window {_window_text(cp.shuffle_window)}"
            f" and this master has {_window_text(ds.shuffle_window)}: its partial commits count "
            "records in the checkpoint's windows' order. Start the master with "
            + (
                "no --shuffle-window"
                if not cp.shuffle_window
                else f"--shuffle-window {cp.shuffle_window}"
            )
        )


def _seed_text(seed: int | None) -> str:
    return "none" if seed is None else str(seed)


def _window_text(window: int) -> str:
    return "0 (off)" if not window else str(window)


# --- bytes -------------------------------------------------------------------------------------

_BITS_TO_ASCII = bytes.maketrans(b"\x00\x01", b"01")
_ASCII_TO_BITS = bytes.maketrans(b"01", b"\x00\x01")


def _bitmap(tasks: frozenset[int], num_tasks: int) -> bytes:
    """Task t is bit t % 8 of byte t // 8 (checked to be in range before)."""
    if not tasks:
        return bytes((num_tasks + 7) // 8)
    flags = bytearray(num_tasks)
    for t in tasks:
        flags[t] = 1
    value = int(flags.translate(_BITS_TO_ASCII)[::-1], 2)
    return value.to_bytes((num_tasks + 7) // 8, "little")


def _tasks(bitmap: bytes, num_tasks: int, pass_id: int) -> frozenset[int]:
    value = int.from_bytes(bitmap, "little")
    if value.bit_length() > num_tasks:
        raise CheckpointError(f"pass {pass_id}: bitmap names a task beyond num_tasks {num_tasks}")
    flags = format(value, "b").encode()[::-1].translate(_ASCII_TO_BITS) if value else b""
    return frozenset(compress(range(num_tasks), flags))


def _dumps(obj: Any) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("ascii")
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"cannot write the checkpoint header: {exc}") from exc


def encode(cp: DataCheckpoint) -> bytes:
    _check(cp)
    sections: list[bytes] = []
    passes: list[list[int]] = []
    for p in cp.passes:
        bitmap = zlib.compress(_bitmap(p.full, cp.num_tasks), 6)
        tasks = sorted(p.partial)
        ids = array("I", tasks).tobytes()
        records = array("Q", (p.partial[t] for t in tasks)).tobytes()
        sections += (bitmap, ids, records)
        passes.append([p.pass_id, len(p.full), len(bitmap), len(tasks)])
    ranges = [
        [p.pass_id, t, start, end]
        for p in cp.passes
        for t in sorted(p.ranges)
        for start, end in p.ranges[t]
    ]
    ds = cp.dataset
    head = _dumps(
        {
            "job": cp.job,
            "created": cp.created,
            "num_tasks": cp.num_tasks,
            "floor": cp.floor,
            "dataset": {
                "globs": list(ds.globs),
                "cpt": ds.chunks_per_task,
                "files": [
                    [f.path, f.size, f.num_chunks, f.num_records, f.index_digest.hex()]
                    for f in ds.files
                ],
                **({} if ds.format == "recordio" else {"format": ds.format}),
                **({} if ds.chunk_size is None else {"chunk_size": ds.chunk_size}),
            },
            "passes": passes,
            **({} if cp.shuffle_seed is None else {"shuffle_seed": cp.shuffle_seed}),
            **({} if not cp.shuffle_window else {"shuffle_window": cp.shuffle_window}),
            **({} if cp.mixture is None else {"mixture": _mixture_json(cp.mixture)}),
            **({} if not cp.job_id else {"job_id": cp.job_id}),
            **({} if not ranges else {"ranges": ranges}),
        }
    )
    if len(head) > MAX_HEAD_SIZE:
        raise CheckpointError(
            f"cannot write the checkpoint header: its {len(ds.files)} files take "
            f"{len(head) >> 20} MiB, over the format's {MAX_HEAD_SIZE >> 20} MiB"
        )
    body = b"".join([_JSON_LEN.pack(len(head)), head, *sections])
    out = _HEADER.pack(MAGIC, _version(cp), len(body)) + body
    return out + hashlib.blake2b(out, digest_size=_DIGEST_SIZE).digest()


def _version(cp: DataCheckpoint) -> int:
    """The oldest format that holds `cp`: a reader of an older one would drop what it has."""
    if any(p.ranges for p in cp.passes):
        return VERSION_RANGES
    if cp.shuffle_window:
        return VERSION_WINDOWED
    if cp.mixture is not None:
        return VERSION_MIXTURE
    return VERSION if cp.shuffle_seed is None else VERSION_SHUFFLED


def _mixture_json(mix: MixtureCheckpoint) -> dict[str, Any]:
    return {
        "sources": [
            [s.name, list(s.globs), s.num_files, s.format, s.chunk_size, s.weight]
            for s in mix.sources
        ],
        "weights": weights_json(mix.weights),
        "passes": [[p, plan_json(plan)] for p, plan in mix.passes],
    }


def _mixture_from(v: Any) -> MixtureCheckpoint:
    """A header's mixture, type-checked (`_check` checks its meaning)."""
    if type(v) is not dict:
        raise CheckpointError("mixture is not a JSON object")
    try:
        sources = []
        for i, s in enumerate(_list(v["sources"], "mixture sources")):
            name, globs, files, fmt, size, weight = _list(s, f"source {i}", 6)
            if type(weight) not in (int, float):
                raise CheckpointError(f"source {i} weight is not a number")
            sources.append(
                SourcePart(
                    _str(name, f"source {i} name"),
                    tuple(_str(g, f"source {i} glob") for g in _list(globs, f"source {i} globs")),
                    _int(files, f"source {i} file count"),
                    _str(fmt, f"source {i} format"),
                    None if size is None else _int(size, f"source {i} chunk size"),
                    float(weight),
                )
            )
        passes = tuple(
            (_int(p, "a planned pass"), plan_from_json(plan))
            for p, plan in (_list(e, "a pass's plan", 2) for e in _list(v["passes"], "plans"))
        )
        return MixtureCheckpoint(tuple(sources), weights_from_json(v["weights"]), passes)
    except MixtureError as exc:
        raise CheckpointError(f"mixture: {exc}") from None
    except KeyError as exc:
        raise CheckpointError(f"mixture lacks the field {exc}") from None


def _foreign(data: memoryview, n: int) -> CheckpointError:
    """Why a file of `n` bytes starting with `data` is no checkpoint."""
    if n == 0:
        return CheckpointError(f"empty file: not a chunkmaster data checkpoint; {_WHAT_TO_DO}")
    start = bytes(data[:8])
    if start == MAGIC[: len(start)]:
        return CheckpointError(
            f"truncated data checkpoint: {n} bytes, shorter than its {_HEADER.size}-byte header; "
            f"{_WHAT_TO_DO}, copied whole"
        )
    kind = ""
    if start.startswith(_RECORDIO_MAGIC):
        kind = " (it looks like a RecordIO data file)"
    elif start.startswith(_STORE_MAGIC):
        kind = " (it looks like a chunkmaster store snapshot)"
    return CheckpointError(f"not a chunkmaster data checkpoint{kind}; {_WHAT_TO_DO}")


def _frame(view: memoryview, n: int) -> int:
    """The body length the fixed header of a blob of `n` bytes gives, once its magic, version
    and total size are checked."""
    if n < _HEADER.size or bytes(view[:8]) != MAGIC:
        raise _foreign(view, n)
    _, version, body_len = _HEADER.unpack_from(view)
    if version not in VERSIONS:
        raise CheckpointError(
            f"data checkpoint format version {version} is not supported: this build reads "
            f"versions {', '.join(map(str, VERSIONS[:-1]))} and {VERSIONS[-1]}; restore it with "
            "the "
            f"chunkmaster version that wrote it"
        )
    total = _HEADER.size + body_len + _DIGEST_SIZE
    if n < total:
        raise CheckpointError(
            f"truncated data checkpoint: {n} of {total} bytes; {_WHAT_TO_DO}, copied whole"
        )
    if n > total:
        raise CheckpointError(
            f"data checkpoint has {n - total} bytes after its end; {_WHAT_TO_DO}, unchanged"
        )
    return int(body_len)


def check_prefix(prefix: bytes, size: int) -> int:
    """A file of `size` bytes whose first bytes are `prefix` (PREFIX_SIZE of them, or all of a
    shorter file): refuse it unless its size is the one its header gives and its JSON header
    fits the format's limit. Returns the JSON header's length, to read and `check_head` next
    (0: the file is too short to hold one; `decode` says what is wrong)."""
    view = memoryview(prefix).cast("B")
    body_len = _frame(view, size)
    if len(view) < PREFIX_SIZE or body_len < _JSON_LEN.size:
        return 0
    (head_len,) = _JSON_LEN.unpack_from(view, _HEADER.size)
    if head_len > MAX_HEAD_SIZE or _JSON_LEN.size + head_len > body_len:
        raise CheckpointError(
            f"invalid data checkpoint: its JSON header would be {head_len} bytes, more than "
            f"{'the format allows' if head_len > MAX_HEAD_SIZE else 'its body holds'}; "
            f"{_WHAT_TO_DO}, from an intact copy"
        )
    return int(head_len)


def check_head(prefix: bytes, head: bytes) -> None:
    """Refuse a checkpoint from its JSON header (`head`, after `prefix`), before its sections
    are read: every field must be in range, and the sections it declares (at most what its
    tasks allow) must fill the body the fixed header gives exactly."""
    if len(prefix) < PREFIX_SIZE:
        return
    _, _, body_len = _HEADER.unpack_from(prefix)
    try:
        cp, entries, _ = _parse_head(memoryview(head))
        _check_entries(entries, cp.num_tasks, body_len - _JSON_LEN.size - len(head))
    except CheckpointError as exc:
        raise CheckpointError(
            f"invalid data checkpoint: {exc}; {_WHAT_TO_DO}, from an intact copy"
        ) from None


def decode(data: bytes | bytearray | memoryview) -> DataCheckpoint:
    view = memoryview(data).cast("B")
    total = _HEADER.size + _frame(view, len(view)) + _DIGEST_SIZE
    _, version, _ = _HEADER.unpack_from(view)
    digest = hashlib.blake2b(view[: total - _DIGEST_SIZE], digest_size=_DIGEST_SIZE).digest()
    if digest != bytes(view[total - _DIGEST_SIZE :]):
        raise CheckpointError(
            f"checksum mismatch: the data checkpoint is corrupt; {_WHAT_TO_DO}, from an intact copy"
        )
    try:
        cp = _parse(view[_HEADER.size : total - _DIGEST_SIZE])
        _check_version(version, cp)
        _check(cp)
    except CheckpointError as exc:
        raise CheckpointError(f"inconsistent data checkpoint: {exc}") from None
    return cp


def _check_version(version: int, cp: DataCheckpoint) -> None:
    """The format version agrees with what the checkpoint holds (a windowed one holds a
    mixture or not, and a seed: `_check`; one with ranges any of the others')."""
    if (version == VERSION_RANGES) != any(p.ranges for p in cp.passes):
        raise CheckpointError(f"format version {version} and the committed ranges disagree")
    if version == VERSION_RANGES:
        return
    if (version == VERSION_WINDOWED) != (cp.shuffle_window > 0):
        raise CheckpointError(f"format version {version} and the shuffle window disagree")
    if version == VERSION_WINDOWED:
        return
    if (version == VERSION_MIXTURE) != (cp.mixture is not None):
        raise CheckpointError(f"format version {version} and the mixture disagree")
    if version != VERSION_MIXTURE and (version == VERSION_SHUFFLED) != (
        cp.shuffle_seed is not None
    ):
        raise CheckpointError(f"format version {version} and the shuffle seed disagree")


def _int(v: Any, what: str) -> int:
    if type(v) is not int:
        raise CheckpointError(f"{what} is not an integer")
    return v


def _str(v: Any, what: str) -> str:
    if type(v) is not str:
        raise CheckpointError(f"{what} is not a string")
    return v


def _list(v: Any, what: str, length: int | None = None) -> list[Any]:
    if type(v) is not list or (length is not None and len(v) != length):
        raise CheckpointError(f"{what} is not a list" + (f" of {length}" if length else ""))
    return v


def _depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (without recursion: it may nest thousands deep)."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if deepest > _HEAD_DEPTH:
            break
        if type(v) is dict:
            todo.extend((x, d + 1) for x in v.values())
        elif type(v) is list:
            todo.extend((x, d + 1) for x in v)
    return deepest


def _load_head(js: memoryview) -> dict[str, Any]:
    try:
        head = json.loads(bytes(js).decode("ascii"))
    except RecursionError:
        raise CheckpointError(f"header nests deeper than {_HEAD_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError):
        raise CheckpointError("header is not ASCII JSON") from None
    if type(head) is not dict:
        raise CheckpointError("header is not a JSON object")
    if _depth(head) > _HEAD_DEPTH:
        raise CheckpointError(f"header nests deeper than {_HEAD_DEPTH} levels")
    return head


def _dataset_head(ds_head: Any) -> DatasetFingerprint:
    """The header's dataset fingerprint, type-checked (`_check_dataset` checks its ranges)."""
    if type(ds_head) is not dict:
        raise CheckpointError("dataset is not a JSON object")
    files = []
    for i, f in enumerate(_list(ds_head["files"], "dataset files")):
        path, size, chunks, num_records, hexdigest = _list(f, f"file {i}", 5)
        try:
            index_digest = bytes.fromhex(_str(hexdigest, f"file {i} index digest"))
        except ValueError:
            raise CheckpointError(f"file {i} index digest is not hex") from None
        files.append(
            FileFingerprint(
                _str(path, f"file {i} path"),
                _int(size, f"file {i} size"),
                _int(chunks, f"file {i} chunk count"),
                _int(num_records, f"file {i} records"),
                index_digest,
            )
        )
    return DatasetFingerprint(
        tuple(_str(g, "glob") for g in _list(ds_head["globs"], "globs")),
        _int(ds_head["cpt"], "chunks per task"),
        tuple(files),
        _str(ds_head.get("format", "recordio"), "format"),
        None if ds_head.get("chunk_size") is None else _int(ds_head["chunk_size"], "chunk size"),
    )


_Entries = list[tuple[int, int, int, int]]


def _parse_head(js: memoryview) -> tuple[DataCheckpoint, _Entries, _Entries]:
    """The JSON header's fields, type- and range-checked (`_check`, passes aside), its pass
    entries (pass, tasks wholly committed, bitmap bytes, tasks partly committed) and its
    committed ranges (pass, task, start, end)."""
    head = _load_head(js)
    try:
        dataset = _dataset_head(head["dataset"])
        created = head["created"]
        if type(created) not in (int, float):
            raise CheckpointError("created is not a number")
        if type(created) is int and not 0 <= created <= _MAX_CREATED:  # float() may overflow
            raise CheckpointError(f"created {_shown(created)} is out of range")
        entries = []
        for entry in _list(head["passes"], "passes"):
            pass_id, full, bitmap_len, partial = (
                _int(v, "pass entry field") for v in _list(entry, "pass entry", 4)
            )
            entries.append((pass_id, full, bitmap_len, partial))
        ranges = []
        for entry in _list(head.get("ranges", []), "ranges"):
            pass_id, task, start, end = (
                _int(v, "committed range field") for v in _list(entry, "committed range", 4)
            )
            ranges.append((pass_id, task, start, end))
        seed = head.get("shuffle_seed")
        window = _int(head.get("shuffle_window", 0), "shuffle window")
        mixture = None if head.get("mixture") is None else _mixture_from(head["mixture"])
        cp = DataCheckpoint(
            _str(head["job"], "job"),
            float(created),
            dataset,
            _int(head["num_tasks"], "num_tasks"),
            _int(head["floor"], "floor"),
            (),
            None if seed is None else _int(seed, "shuffle seed"),
            mixture,
            _str(head.get("job_id", ""), "job_id"),
            window,
        )
    except KeyError as exc:
        raise CheckpointError(f"header lacks the field {exc}") from None
    _check(cp)
    return cp, entries, ranges


def _bitmap_bound(num_tasks: int) -> int:
    """The longest zlib stream of a bitmap of `num_tasks` bits (zlib's compressBound)."""
    n = (num_tasks + 7) // 8
    return n + (n >> 12) + (n >> 14) + (n >> 25) + 13


def _check_entries(entries: list[tuple[int, int, int, int]], num_tasks: int, room: int) -> None:
    """The sections the pass entries declare fill `room` bytes exactly, and none is longer
    than `num_tasks` tasks allow."""
    pos = 0
    bound = _bitmap_bound(num_tasks)
    for pass_id, num_full, bitmap_len, num_partial in entries:
        if bitmap_len < 0 or num_partial < 0 or num_full < 0:
            raise CheckpointError(f"pass {_shown(pass_id)}: a negative count or length")
        pos += bitmap_len + num_partial * 12
        if pos > room:
            raise CheckpointError(f"pass {_shown(pass_id)}: sections run past the end of the body")
        if bitmap_len > bound or num_full + num_partial > num_tasks:
            raise CheckpointError(
                f"pass {_shown(pass_id)}: {num_full} tasks committed whole and {num_partial} in "
                f"part, in a bitmap of {bitmap_len} bytes: more than {num_tasks} tasks hold"
            )
    if pos != room:
        raise CheckpointError(
            f"{room - pos} bytes in the body belong to no section (a checkpoint of {num_tasks} "
            f"tasks with {len(entries)} pass(es) of commits)"
        )


def _parse(body: memoryview) -> DataCheckpoint:
    """The body's fields, type-checked; their meaning is checked by `_check`."""
    if len(body) < _JSON_LEN.size:
        raise CheckpointError("body is shorter than its header length")
    (head_len,) = _JSON_LEN.unpack_from(body)
    pos = _JSON_LEN.size + head_len
    if pos > len(body):
        raise CheckpointError("header runs past the end of the body")
    head, entries, ranges = _parse_head(body[_JSON_LEN.size : pos])
    num_tasks = head.num_tasks
    _check_entries(entries, num_tasks, len(body) - pos)
    passes = []
    for pass_id, num_full, bitmap_len, num_partial in entries:
        bitmap = _inflate(body[pos : pos + bitmap_len], num_tasks, pass_id)
        full = _tasks(bitmap, num_tasks, pass_id)
        if len(full) != num_full:
            raise CheckpointError(
                f"pass {pass_id}: bitmap holds {len(full)} tasks, the header says {num_full}"
            )
        pos += bitmap_len
        ids: array[int] = array("I")
        ids.frombytes(body[pos : pos + 4 * num_partial])
        pos += 4 * num_partial
        records: array[int] = array("Q")
        records.frombytes(body[pos : pos + 8 * num_partial])
        pos += 8 * num_partial
        if any(a >= b for a, b in pairwise(ids)):
            raise CheckpointError(f"pass {pass_id}: partial task ids are not ascending")
        passes.append(PassCommits(pass_id, full, dict(zip(ids, records, strict=True))))
    return replace(head, passes=_with_ranges(passes, ranges))


def _with_ranges(passes: list[PassCommits], ranges: _Entries) -> tuple[PassCommits, ...]:
    """The passes with the header's committed ranges, each in a pass that has an entry."""
    if any(a >= b for a, b in pairwise((p, t, s) for p, t, s, _ in ranges)):
        raise CheckpointError("committed ranges are not ascending")
    by_pass: dict[int, dict[int, list[tuple[int, int]]]] = {}
    for pass_id, task, start, end in ranges:
        by_pass.setdefault(pass_id, {}).setdefault(task, []).append((start, end))
    known = {p.pass_id for p in passes}
    for pass_id in by_pass:
        if pass_id not in known:
            raise CheckpointError(f"committed ranges of pass {_shown(pass_id)}, which has no entry")
    return tuple(
        replace(p, ranges={t: tuple(r) for t, r in by_pass[p.pass_id].items()})
        if p.pass_id in by_pass
        else p
        for p in passes
    )


def _inflate(section: memoryview, num_tasks: int, pass_id: int) -> bytes:
    size = (num_tasks + 7) // 8
    inflater = zlib.decompressobj()
    try:
        bitmap = inflater.decompress(section, size + 1)
    except zlib.error:
        raise CheckpointError(f"pass {pass_id}: bitmap does not decompress") from None
    if len(bitmap) != size or not inflater.eof or inflater.unused_data:
        raise CheckpointError(f"pass {pass_id}: bitmap is not {size} bytes of zlib data")
    return bitmap
