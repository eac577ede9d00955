"""The dataset as the master sees it: files, their chunks, and the tasks cut from them.

Chunks live in three flat arrays (16 bytes a chunk), not in millions of objects. Tasks are
consecutive groups of `chunks_per_task` chunks, so task k is a range of chunk numbers and
needs no storage of its own; task IDs are 0..num_tasks-1, stable for the life of the job.
With a shuffle seed, task k of pass p is the same positions k*cpt.. of the pass's keyed
permutation of the chunks instead (core/shuffle.py): recomputed, never stored.

A mixture (docs/mixtures.md) is a dataset of named `sources`, each its own patterns, format and
chunk bound: their files and chunks follow one another in the flat arrays, and each source's
chunks are cut into tasks of their own (a task never spans two sources), so the global task IDs
are the sources' tasks, source after source. A mixture's tasks always cover the same chunks: a
shuffle seed orders each source's epochs instead (core/mixture.py).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import pairwise

from chunkmaster.core.model import Chunk
from chunkmaster.core.shuffle import PassChunks, PassTaskRecords

LIVE_PASSES = 4  # passes whose shuffled layout a dataset keeps at hand


def effective_chunks_per_task(chunks_per_task: int) -> int:
    """Chunks per task as tasks are cut: 0 or less means 1 (as in PaddlePaddle's Go master)."""
    return chunks_per_task if chunks_per_task > 0 else 1


def count_tasks(num_chunks: int, chunks_per_task: int) -> int:
    cpt = effective_chunks_per_task(chunks_per_task)
    return (num_chunks + cpt - 1) // cpt


@dataclass(frozen=True, slots=True)
class Source:
    """One named source of a mixture: its patterns, its files' format and chunk bound, how
    many of the dataset's files and chunks are its own (in order, after the sources before
    it), and the weight it was set with (the weights in force are the state's)."""

    name: str
    globs: tuple[str, ...]
    num_files: int
    num_chunks: int
    format: str = "recordio"
    chunk_size: int | None = None
    weight: float = 1.0


@dataclass(frozen=True, eq=False)
class Dataset:
    globs: tuple[str, ...]
    files: tuple[str, ...]
    chunk_file: array[int]  # 'I': index into files
    chunk_offset: array[int]  # 'Q': byte offset of the chunk header
    chunk_records: array[int]  # 'I': records in the chunk
    chunks_per_task: int
    file_sizes: array[int] | None = field(default=None)  # 'Q': bytes per file, if known
    chunk_length: array[int] | None = field(default=None)  # 'Q': bytes per chunk, if known
    format: str = "recordio"  # the files' format (chunkmaster.formats)
    shuffle_seed: int | None = None  # None: every pass cuts the same tasks, in file order
    #: The job's shuffle window (records; 0: off): trainers read each task's records in
    #: windows of this many, each permuted by the seed. Needs a seed; the master only keeps,
    #: journals and publishes it (a task's position counts records in that order).
    shuffle_window: int = 0
    #: The bound on a chunk's bytes the master cut the files' chunks at (--chunk-size), for the
    #: formats it cuts; None for the files' own chunks (RecordIO, Parquet), or not recorded
    #: (a journal or checkpoint whose dataset does not carry it).
    chunk_size: int | None = None
    #: A mixture's sources, in order (empty: one plain dataset, every task of every pass).
    sources: tuple[Source, ...] = ()
    #: 'q': each file's modification time (ns) when it was indexed; 0 where not known (object
    #: stores), None where the journal or checkpoint the dataset came from does not carry them.
    file_mtimes: array[int] | None = field(default=None)
    _layouts: dict[int, tuple[PassChunks, PassTaskRecords]] = field(
        default_factory=dict, init=False, repr=False
    )

    @classmethod
    def build(
        cls,
        globs: Sequence[str],
        files: Sequence[str],
        indexes: Iterable[tuple[Sequence[int], Sequence[int]]],
        chunks_per_task: int,
        sizes: Sequence[int] | None = None,
        *,
        lengths: Iterable[Sequence[int]] | None = None,
        fmt: str = "recordio",
        chunk_size: int | None = None,
        mtimes: Sequence[int] | None = None,
    ) -> Dataset:
        """Assemble from per-file (chunk offsets, records per chunk), in file order, with the
        bytes each chunk spans (`lengths`, per file) if known."""
        chunk_file: array[int] = array("I")
        chunk_offset: array[int] = array("Q")
        chunk_records: array[int] = array("I")
        for file_no, (offsets, records) in enumerate(indexes):
            if len(offsets) != len(records):
                raise ValueError(f"index of {files[file_no]} has mismatched lengths")
            chunk_file.extend([file_no] * len(offsets))
            chunk_offset.extend(offsets)
            chunk_records.extend(records)
        chunk_length: array[int] | None = None
        if lengths is not None:
            chunk_length = array("Q")
            for file_no, file_lengths in enumerate(lengths):
                chunk_length.extend(file_lengths)
                if len(chunk_length) > len(chunk_offset):
                    raise ValueError(f"index of {files[file_no]} has more lengths than chunks")
            if len(chunk_length) != len(chunk_offset):
                raise ValueError(
                    f"{len(chunk_length)} chunk lengths for {len(chunk_offset)} chunks"
                )
        return cls(
            tuple(globs),
            tuple(files),
            chunk_file,
            chunk_offset,
            chunk_records,
            effective_chunks_per_task(chunks_per_task),
            None if sizes is None else array("Q", sizes),
            chunk_length,
            fmt,
            chunk_size=chunk_size,
            file_mtimes=None if mtimes is None else array("q", mtimes),
        )

    @classmethod
    def mix(cls, parts: Sequence[tuple[str, Dataset, float]]) -> Dataset:
        """A mixture of named datasets (name, dataset, weight), in this order: their files,
        chunks and tasks one after the other. They were cut at the same chunks per task."""
        if not parts:
            raise ValueError("a mixture needs a source")
        cpts = {d.chunks_per_task for _, d, _ in parts}
        if len(cpts) != 1:
            raise ValueError(f"the sources of a mixture were cut at {sorted(cpts)} chunks a task")
        chunk_file: array[int] = array("I")
        chunk_offset: array[int] = array("Q")
        chunk_records: array[int] = array("I")
        sizes: array[int] | None = array("Q")
        mtimes: array[int] | None = array("q")
        lengths: array[int] | None = array("Q")
        with_lengths = any(d.chunk_length is not None for _, d, _ in parts)
        files: list[str] = []
        globs: list[str] = []
        sources = []
        for name, d, weight in parts:
            if d.sources:
                raise ValueError(f"source {name!r} is a mixture itself")
            base = len(files)
            chunk_file.extend(base + f for f in d.chunk_file)
            chunk_offset.extend(d.chunk_offset)
            chunk_records.extend(d.chunk_records)
            if sizes is not None and d.file_sizes is not None:
                sizes.extend(d.file_sizes)
            else:
                sizes = None
            if mtimes is not None and d.file_mtimes is not None:
                mtimes.extend(d.file_mtimes)
            else:
                mtimes = None
            if lengths is not None and with_lengths:  # 0: not known
                lengths.extend(d.chunk_length or array("Q", bytes(8 * d.num_chunks)))
            files.extend(d.files)
            globs.extend(d.globs)
            sources.append(
                Source(name, d.globs, len(d.files), d.num_chunks, d.format, d.chunk_size, weight)
            )
        formats = {d.format for _, d, _ in parts}
        return cls(
            tuple(globs),
            tuple(files),
            chunk_file,
            chunk_offset,
            chunk_records,
            cpts.pop(),
            sizes,
            lengths if with_lengths else None,
            formats.pop() if len(formats) == 1 else "mixed",
            sources=tuple(sources),
            file_mtimes=mtimes,
        )

    def grown(self, added: Dataset) -> Dataset:
        """This mixture with the sources of the mixture `added` after its own (sources added
        to a running job): their files, chunks and tasks follow this one's, so every task of
        this one keeps its ID. They were cut at the same chunks per task."""
        if not self.sources or not added.sources:
            raise ValueError("sources are added to a mixture, as a mixture")
        if added.chunks_per_task != self.chunks_per_task:
            raise ValueError(
                f"sources cut at {added.chunks_per_task} chunks a task added to a mixture cut "
                f"at {self.chunks_per_task}"
            )
        base = len(self.files)
        chunk_file = array("I", self.chunk_file)
        chunk_file.extend(base + f for f in added.chunk_file)
        sizes = None
        if self.file_sizes is not None and added.file_sizes is not None:
            sizes = self.file_sizes + added.file_sizes
        mtimes = None
        if self.file_mtimes is not None and added.file_mtimes is not None:
            mtimes = self.file_mtimes + added.file_mtimes
        lengths = None
        if self.chunk_length is not None or added.chunk_length is not None:
            lengths = array("Q")
            for d in (self, added):  # 0: not known
                lengths.extend(d.chunk_length or array("Q", bytes(8 * d.num_chunks)))
        return Dataset(
            self.globs + added.globs,
            self.files + added.files,
            chunk_file,
            self.chunk_offset + added.chunk_offset,
            self.chunk_records + added.chunk_records,
            self.chunks_per_task,
            sizes,
            lengths,
            self.format if self.format == added.format else "mixed",
            self.shuffle_seed,
            self.shuffle_window,
            chunk_size=self.chunk_size,
            sources=self.sources + added.sources,
            file_mtimes=mtimes,
        )

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_offset)

    @property
    def num_tasks(self) -> int:
        if self.sources:
            return self.source_bounds[1][-1]
        return count_tasks(self.num_chunks, self.chunks_per_task)

    @cached_property
    def source_bounds(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Each source's first chunk and first task, and one past the last source's."""
        chunks, tasks = [0], [0]
        for s in self.sources:
            chunks.append(chunks[-1] + s.num_chunks)
            tasks.append(tasks[-1] + count_tasks(s.num_chunks, self.chunks_per_task))
        return tuple(chunks), tuple(tasks)

    def source_of(self, task_id: int) -> int:
        """The source (its index) a task of a mixture belongs to."""
        return bisect_right(self.source_bounds[1], task_id) - 1

    def source_tasks(self, source: int) -> range:
        tasks = self.source_bounds[1]
        return range(tasks[source], tasks[source + 1])

    def task_format(self, task_id: int) -> str:
        """The format of the files a task covers."""
        if self.sources:
            return self.sources[self.source_of(task_id)].format
        return self.format

    @property
    def num_records(self) -> int:
        return sum(self.chunk_records)

    @cached_property
    def task_records(self) -> array[int]:
        """Records per task (8 bytes a task, computed once)."""
        cr = self.chunk_records
        cpt = effective_chunks_per_task(self.chunks_per_task)
        if cpt == 1:  # a task a chunk (a source's tasks end where its chunks do)
            return array("Q", cr)
        chunks = self.source_bounds[0] if self.sources else (0, self.num_chunks)
        out: array[int] = array("Q")
        for first, end in pairwise(chunks):
            out.extend(sum(cr[i : min(i + cpt, end)]) for i in range(first, end, cpt))
        return out

    def with_shuffle(self, seed: int | None, window: int = 0) -> Dataset:
        """This dataset with its tasks cut and ordered by `seed` (None: in file order), and
        each task's records read in permuted windows of `window` records (0: in file order)."""
        if (seed, window) == (self.shuffle_seed, self.shuffle_window):
            return self
        return replace(self, shuffle_seed=seed, shuffle_window=window)

    def _layout(self, pass_id: int) -> tuple[PassChunks, PassTaskRecords]:
        """The seeded layout of one pass, kept for the few passes in use (commits of an
        older pass may still come while a later one is dispatched)."""
        got = self._layouts.get(pass_id)
        if got is None:
            assert self.shuffle_seed is not None
            chunks = PassChunks(self.num_chunks, self.chunks_per_task, self.shuffle_seed, pass_id)
            got = chunks, PassTaskRecords(chunks, self.chunk_records, self.num_tasks)
            if len(self._layouts) >= LIVE_PASSES:
                del self._layouts[min(self._layouts)]
            self._layouts[pass_id] = got
        return got

    def task_records_for(self, pass_id: int) -> Sequence[int]:
        """Records per task in `pass_id` (the same every pass without a seed, and in a
        mixture)."""
        if self.shuffle_seed is None or self.sources:
            return self.task_records
        return self._layout(pass_id)[1]

    def chunk_ids(self, task_id: int, pass_id: int = 0) -> Sequence[int]:
        """The chunk numbers task `task_id` covers in pass `pass_id`, in reading order."""
        if self.shuffle_seed is None or self.sources:
            return self.chunk_range(task_id)
        return self._layout(pass_id)[0].chunks(task_id)

    def chunk_range(self, task_id: int) -> range:
        if not 0 <= task_id < self.num_tasks:
            raise KeyError(task_id)
        if self.sources:
            (chunks, tasks), s = self.source_bounds, self.source_of(task_id)
            start = chunks[s] + (task_id - tasks[s]) * self.chunks_per_task
            return range(start, min(start + self.chunks_per_task, chunks[s + 1]))
        start = task_id * self.chunks_per_task
        return range(start, min(start + self.chunks_per_task, self.num_chunks))

    def task_chunks(self, task_id: int, pass_id: int = 0) -> tuple[Chunk, ...]:
        files, cf, co, cr = self.files, self.chunk_file, self.chunk_offset, self.chunk_records
        cl = self.chunk_length
        fs, fm = self.file_sizes, self.file_mtimes
        ids = self.chunk_ids(task_id, pass_id)
        return tuple(
            Chunk(
                files[cf[i]],
                co[i],
                cr[i],
                0 if cl is None else cl[i],
                0 if fs is None else fs[cf[i]],
                0 if fm is None else fm[cf[i]],
            )
            for i in ids
        )
