"""The job's one dataset: the first trainer's set_dataset indexes and journals it; a later one
naming the same dataset (the same patterns however spelled, or patterns matching exactly its
files) succeeds and changes nothing; one naming another is refused naming both
(`DatasetMismatchError`). Every pattern is held to the data roots first (docs/security.md).
The indexing itself is master/indexing.py's, on daemon threads.

A dataset may be a mixture of named sources (docs/mixtures.md), each indexed as a dataset of
its own; the same mixture is the same source names with the same patterns (their weights are
the first call's: later weights come with `set_weights`, which this part also handles).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from chunkmaster.core.dataset import Dataset
from chunkmaster.core.errors import (
    DatasetError,
    DatasetMismatchError,
    InvalidArgumentError,
    MasterError,
    NoDatasetError,
    NotAMixtureError,
    NotReadyError,
)
from chunkmaster.core.events import AddSources, SetDataset, SetWeights
from chunkmaster.core.mixture import (
    Breakpoint,
    MixtureError,
    MixtureState,
    Weights,
    check_cells,
    name_problem,
)
from chunkmaster.core.model import FailedPolicy
from chunkmaster.core.reconcile import KEEP_REFUSED
from chunkmaster.core.task_size import chosen_text
from chunkmaster.master.daemon_threads import in_daemon_thread
from chunkmaster.master.indexing import IndexSettings, load_dataset
from chunkmaster.master.ledger import Ledger
from chunkmaster.master.patterns import (
    absolute_pattern,
    dataset_mismatch,
    expand_globs,
    file_keys,
    same_patterns,
)
from chunkmaster.master.roots import DataRoots
from chunkmaster.master.settings import Settings
from chunkmaster.master.status import StatusWarnings

log = logging.getLogger("chunkmaster.service")

MAX_SOURCES = 10_000
#: Weights by source name at one point: a mapping, or (name, weight) pairs as the wire has
#: them (where a name may come twice, which is refused).
ByName = Mapping[str, float] | Sequence[tuple[str, float]]


@dataclass(frozen=True)
class SourceSpec:
    """A source of a mixture as a trainer names it: its patterns, its weight when the dataset
    is set, and its files' format (None: by their names, or the master's --format)."""

    name: str
    globs: tuple[str, ...]
    weight: float = 1.0
    format: str | None = None


@dataclass(frozen=True)
class Reweighted:
    """Where new weights took effect: units `unit`.. of pass `pass_id` were planned again,
    after `records` planned over the whole job (`unit` equal to the pass's units: from the
    next pass on)."""

    pass_id: int
    unit: int
    records: int


def check_sources(sources: Sequence[SourceSpec], *, weighted: bool = True) -> None:
    """Refuse a mixture that cannot be one, naming the source and what is wrong (`weighted`:
    the weights are the job's, held to `Weights.check`; sources added to a job have theirs
    checked with the job's by `add_sources`)."""
    if len(sources) > MAX_SOURCES:
        raise DatasetError(
            f"no valid dataset specified: {len(sources)} sources, over {MAX_SOURCES}"
        )
    seen: set[str] = set()
    for s in sources:
        problem = name_problem(s.name)
        if problem is not None:
            raise DatasetError(f"no valid dataset specified: {problem}")
        if s.name in seen:
            raise DatasetError(f"no valid dataset specified: source {s.name!r} is named twice")
        seen.add(s.name)
        if not s.globs:
            raise DatasetError(f"no valid dataset specified: source {s.name!r} has no pattern")
    if weighted:
        try:
            Weights.fixed([s.weight for s in sources]).check([s.name for s in sources])
        except MixtureError as exc:
            raise DatasetError(f"no valid dataset specified: {exc}") from None


class JobDataset:
    def __init__(
        self, ledger: Ledger, settings: Settings, roots: DataRoots, warnings: StatusWarnings
    ) -> None:
        self._ledger = ledger
        self._settings = settings
        self.roots = roots
        self._warnings = warnings
        self._indexing = IndexSettings(
            settings.index_timeout,
            settings.storage_options,
            settings.chunk_size,
            settings.max_inflated,
            roots,
        )
        self._loading: asyncio.Task[None] | None = None
        self._loading_key: object = None

    async def index(
        self, globs: Sequence[str], chunks_per_task: int | None, dataset_format: str | None
    ) -> Dataset:
        """Index the files of `globs` with this master's settings (its storage options, chunk
        size, inflation bound and data roots), seeded with its shuffle seed and window;
        `chunks_per_task` None: the master's choice (core/task_size.py)."""
        s = self._settings
        return (await self._index(globs, chunks_per_task, dataset_format)).with_shuffle(
            s.shuffle_seed, s.shuffle_window
        )

    async def _index(
        self, globs: Sequence[str], chunks_per_task: int | None, dataset_format: str | None
    ) -> Dataset:
        return await in_daemon_thread(
            load_dataset, list(globs), chunks_per_task, self._indexing, dataset_format
        )

    async def index_mixture(
        self, sources: Sequence[SourceSpec], chunks_per_task: int | None
    ) -> Dataset:
        """Index each source as a dataset of its own (`chunks_per_task` a task within each),
        and blend them, seeded with this master's shuffle seed and window. `chunks_per_task`
        None: the master's choice for the smallest source, for every source (a mixture has one
        chunks per task), so each source makes as many tasks as the rule gives it or more."""
        parts = []
        for s in sources:
            fmt = s.format or self._settings.dataset_format
            try:
                part = await self._index(s.globs, chunks_per_task, fmt)
            except DatasetError as exc:
                raise type(exc)(f"source {s.name!r}: {exc}") from None
            parts.append((s.name, part, s.weight))
        if chunks_per_task is None:
            cpt = min(p.chunks_per_task for _, p, _ in parts)  # the rule grows with the chunks
            parts = [(n, dataclasses.replace(p, chunks_per_task=cpt), w) for n, p, w in parts]
            log.info(
                "mixture of %d sources cut at %d chunk(s) a task, its smallest source's (%s)",
                len(parts),
                cpt,
                chosen_text(cpt),
            )
        settings = self._settings
        return Dataset.mix(parts).with_shuffle(settings.shuffle_seed, settings.shuffle_window)

    async def set(self, globs: Sequence[str], sources: Sequence[SourceSpec] = ()) -> None:
        """The first dataset wins (see the module's text); a restored data checkpoint's
        dataset is the master's like any other."""
        globs, sources = list(globs), list(sources)
        if globs and sources:
            raise InvalidArgumentError(
                "invalid argument: a dataset is one list of patterns or a mixture of named "
                "sources, not both"
            )
        if not globs and not sources:  # checked before "already set", as the Go master does
            raise NoDatasetError()
        if sources:
            check_sources(sources)
            if self._settings.failed_policy is FailedPolicy.KEEP:
                raise DatasetError(f"no valid dataset specified: {KEEP_REFUSED}")
        patterns = globs or [g for s in sources for g in s.globs]
        await in_daemon_thread(self.roots.check_all, patterns)  # realpath may touch the disk
        key = _key(globs, sources)
        while self._ledger.state.dataset is None:
            loading = self._loading
            if loading is None or loading.done():
                self._loading_key = key
                loading = self._loading = asyncio.create_task(
                    self._load(globs, sources), name="set-dataset"
                )
            try:
                await asyncio.shield(loading)
            except MasterError:
                if key == self._loading_key:
                    raise
                # Another trainer's dataset could not be set: this one may be.
        ds = self._ledger.state.dataset
        assert ds is not None
        if sources:
            await self._same_mixture(ds, sources)
            return
        if ds.sources:
            raise DatasetMismatchError(
                f"the dataset differs from the master's: this trainer's {globs[:4]} is one "
                f"list of patterns, the master's a mixture of sources {_names(ds)}. A master "
                "serves one dataset: name the master's sources, or run another job"
            )
        if same_patterns(ds.globs, globs):
            return
        why = await in_daemon_thread(
            dataset_mismatch, ds, globs, self._settings.storage_options, self.roots
        )
        if why is not None:
            log.warning("set_dataset refused: %s", why)
            raise DatasetMismatchError(why)
        log.info("set_dataset(%s): other patterns for the same files as the dataset's", globs)

    async def _same_mixture(self, ds: Dataset, sources: Sequence[SourceSpec]) -> None:
        """Refuse a mixture that is not the master's: other names, or a source's patterns that
        match other files. Its weights are not compared: the job's are set_weights's."""
        mine = {s.name: s for s in ds.sources}
        theirs = [s.name for s in sources]
        if not ds.sources or set(theirs) != set(mine):
            what = f"the mixture of sources {_names(ds)}" if ds.sources else f"{list(ds.globs)[:4]}"
            raise DatasetMismatchError(
                f"the dataset differs from the master's: this trainer's mixture of sources "
                f"{theirs} is not the master's {what}. A master serves one dataset: name the "
                "master's sources, or run another job"
            )
        first = 0
        files: dict[str, set[str]] = {}
        for s in ds.sources:
            files[s.name] = file_keys(ds.files[first : first + s.num_files])
            first += s.num_files
        for spec in sources:
            if same_patterns(mine[spec.name].globs, spec.globs):
                continue
            listed = await in_daemon_thread(
                _listed, [absolute_pattern(g) for g in spec.globs], self._settings, self.roots
            )
            if listed != files[spec.name]:
                raise DatasetMismatchError(
                    f"the dataset differs from the master's: source {spec.name!r} is "
                    f"{list(spec.globs)[:4]} here and {list(mine[spec.name].globs)[:4]} on the "
                    "master, which match other files. A master serves one dataset: give this "
                    "trainer the master's patterns, or run another job"
                )

    async def _load(self, globs: list[str], sources: list[SourceSpec]) -> None:
        s = self._settings
        if sources:
            dataset = await self.index_mixture(sources, s.chunks_per_task)
        else:
            dataset = await self.index(globs, s.chunks_per_task, s.dataset_format)
        if self._ledger.state.dataset is None:
            await self._ledger.commit(SetDataset(dataset, uuid.uuid4().hex))
            self._warnings.check()

    async def set_weights(
        self, points: Sequence[tuple[int, ByName]], mode: str = "step"
    ) -> Reweighted:
        """A mixture's weights from now on: a schedule of (records planned, weight by source
        name), every source named. The units of the pass nobody had are planned again."""
        st = self._ledger.state
        if st.dataset is None:
            raise NotReadyError()
        if st.mix is None:
            raise NotAMixtureError()
        names = list(st.mix.names)
        weights = await in_daemon_thread(weights_of, names, points, mode)  # off the loop
        st = self._ledger.state  # the job may have been restored or grown meanwhile
        if st.mix is None:
            raise NotAMixtureError()
        if list(st.mix.names) != names:  # sources added: these weights do not name them all
            weights = weights_of(st.mix.names, points, mode)
        _check_held(st.mix, weights, len(names))
        last = max(st.mix.passes)
        return self._reweighted(last, await self._ledger.commit(SetWeights(weights)), weights)

    def _reweighted(self, last: int, records: object, weights: Weights) -> Reweighted:
        """Where `weights`, just applied to pass `last` (the last planned before them: with
        equal steps they may end it, dropping the rest), took effect (and the log line)."""
        assert isinstance(records, int)
        st = self._ledger.state
        assert st.mix is not None
        plan = st.mix.passes.get(last)
        replans = () if plan is None else plan.replans
        unit = replans[-1].at if replans and replans[-1].weights is weights else st.mix.units
        log.info(
            "weights %s from pass %d unit %d on (%d records planned before it)",
            _weights_text(st.mix.names, weights),
            last,
            unit,
            records,
        )
        return Reweighted(last, unit, records)

    async def add_sources(
        self,
        sources: Sequence[SourceSpec],
        points: Sequence[tuple[int, ByName]] = (),
        mode: str = "step",
    ) -> Reweighted:
        """Sources added to a running mixture, after its own, each indexed as set_dataset
        indexes one, then new weights as `set_weights` (every source, old and new, named; no
        `points`: the schedule in force, each added source at its weight at every point), in
        one event. Refused, nothing added: a name the job has, a source that matches no file
        or cannot be indexed, each error naming the source."""
        st = self._ledger.state
        if st.dataset is None:
            raise NotReadyError()
        if st.mix is None:
            raise NotAMixtureError()
        check_sources(sources, weighted=False)
        self._refuse_known(sources)
        names = [*st.mix.names, *(s.name for s in sources)]
        now = st.mix.weights
        weights = await in_daemon_thread(_weights_with, names, now, sources, points, mode)
        _check_held(st.mix, weights, len(names))  # before any file is read
        await in_daemon_thread(self.roots.check_all, [g for s in sources for g in s.globs])
        added = await self.index_mixture(sources, st.dataset.chunks_per_task)
        st = self._ledger.state  # the job may have been restored or grown meanwhile
        assert st.mix is not None
        self._refuse_known(sources)
        if [*st.mix.names, *(s.name for s in sources)] != names or (
            not points and st.mix.weights is not now
        ):  # sources added or weights set meanwhile: these weights are of before
            names = [*st.mix.names, *(s.name for s in sources)]
            weights = _weights_with(names, st.mix.weights, sources, points, mode)
        _check_held(st.mix, weights, len(names))
        log.info(
            "sources added: %s",
            ", ".join(
                f"{s.name} ({len(s.globs)} pattern(s), {s.format or 'by name'})" for s in sources
            ),
        )
        last = max(st.mix.passes)
        return self._reweighted(
            last, await self._ledger.commit(AddSources(added, weights)), weights
        )

    def _refuse_known(self, sources: Sequence[SourceSpec]) -> None:
        """Refuse a name the job has, and more sources than a trainer may name (its
        set_dataset would be refused: no trainer could join the job again)."""
        st = self._ledger.state
        assert st.mix is not None
        known = [s.name for s in sources if s.name in st.mix.names]
        if known:
            raise DatasetError(
                f"no valid dataset specified: source {known[0]!r} is in the job already (its "
                f"sources: {', '.join(st.mix.names)}); an added source needs a name of its own"
            )
        total = len(st.mix.names) + len(sources)
        if total > MAX_SOURCES:
            raise DatasetError(
                f"no valid dataset specified: {total} sources with those added "
                f"({', '.join(s.name for s in sources)[:200]}), over {MAX_SOURCES}"
            )

    def close(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()


def weights_of(names: Sequence[str], points: Sequence[tuple[int, ByName]], mode: str) -> Weights:
    """A schedule from weights by source name, held to `Weights.check`; InvalidArgumentError
    naming what is wrong (a name unknown, missing or given twice in a point, a bad value; too
    many weights, before any is read)."""
    try:
        check_cells(len(points), len(names))
    except MixtureError as exc:
        raise InvalidArgumentError(f"invalid argument: {exc}") from None
    out = []
    for at, given in points:
        pairs = list(given.items()) if isinstance(given, Mapping) else list(given)
        by_name: dict[str, float] = {}
        for name, w in pairs:
            if name in by_name:
                raise InvalidArgumentError(
                    f"invalid argument: the weights at record {at} name source {name!r} twice "
                    f"({by_name[name]!r} and {w!r}): name each source once"
                )
            by_name[name] = w
        unknown = sorted(set(by_name) - set(names))
        missing = [n for n in names if n not in by_name]
        if unknown or missing:
            raise InvalidArgumentError(
                "invalid argument: weights name every source of the mixture "
                f"({', '.join(map(repr, names))}; 0 retires one)"
                + (f": {', '.join(map(repr, unknown))} is none of them" if unknown else "")
                + (f": {', '.join(map(repr, missing))} has none" if missing else "")
            )
        out.append(Breakpoint(at, tuple(float(by_name[n]) for n in names)))
    try:
        return Weights(tuple(out), mode or "step").check(names)
    except MixtureError as exc:
        raise InvalidArgumentError(f"invalid argument: {exc}") from None


def _weights_with(
    names: Sequence[str],
    now: Weights,
    sources: Sequence[SourceSpec],
    points: Sequence[tuple[int, ByName]],
    mode: str,
) -> Weights:
    """The weights sources added to a job bring (`names`: the job's, then theirs): `points`
    as `weights_of`, or none: `now`, the schedule in force, each added source at its own
    weight at every point; held to `Weights.check` alike."""
    if points:
        return weights_of(names, points, mode)
    extra = tuple(s.weight for s in sources)
    weights = Weights(tuple(Breakpoint(p.at, p.weights + extra) for p in now.points), now.mode)
    try:
        return weights.check(names)
    except MixtureError as exc:
        raise InvalidArgumentError(f"invalid argument: {exc}") from None


def _check_held(mix: MixtureState, weights: Weights, sources: int) -> None:
    """InvalidArgumentError if the job would keep too many weights (`check_held`)."""
    try:
        mix.check_held(weights, sources)
    except MixtureError as exc:
        raise InvalidArgumentError(f"invalid argument: {exc}") from None


#: Points and weights a point the log line of new weights shows (the status shows more).
_LOGGED_POINTS = 4
_LOGGED_WEIGHTS = 20


def _weights_text(names: Sequence[str], w: Weights) -> str:
    shown = "; ".join(
        f"from record {p.at}: "
        + ", ".join(
            f"{n}={x:g}"
            for n, x in zip(names[:_LOGGED_WEIGHTS], p.weights[:_LOGGED_WEIGHTS], strict=True)
        )
        + (f" (and {len(names) - _LOGGED_WEIGHTS} more)" if len(names) > _LOGGED_WEIGHTS else "")
        for p in w.points[:_LOGGED_POINTS]
    )
    more = len(w.points) - _LOGGED_POINTS
    return (
        shown
        + (f"; {more} more point(s)" if more > 0 else "")
        + ("" if w.mode == "step" else f" ({w.mode})")
    )


def _names(ds: Dataset) -> list[str]:
    return [s.name for s in ds.sources]


def _key(globs: Sequence[str], sources: Sequence[SourceSpec]) -> object:
    """What makes two set_dataset calls the same request (to share one indexing)."""
    if not sources:
        return frozenset(absolute_pattern(g) for g in globs)
    return frozenset((s.name, frozenset(map(absolute_pattern, s.globs))) for s in sources)


def _listed(globs: list[str], settings: Settings, roots: DataRoots) -> set[str]:
    """The files `globs` match, one text per file however reached (none: nothing matches)."""
    from chunkmaster.remote import shared

    try:
        return file_keys(expand_globs(globs, shared(settings.storage_options), roots))
    except DatasetError:
        return set()
