"""Bytes for the journal and the snapshots.

A journal entry is one tag byte and a compact JSON body, except the dataset, which is large
and goes in a binary container (JSON header + raw little-endian arrays). No pickle: whoever
can write the store must not be able to run code in the master.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections import deque
from collections.abc import Callable
from fractions import Fraction
from typing import Any, TypeVar

from chunkmaster.core.budget import ErrorBudget, JobStop
from chunkmaster.core.dataset import Dataset, Source
from chunkmaster.core.events import (
    AddSources,
    ApproveSave,
    Commit,
    Configure,
    Dispatch,
    EndSession,
    EqualSteps,
    Event,
    Fail,
    Finish,
    MixturePosition,
    OpenSession,
    Progress,
    Restore,
    Resume,
    ReturnTasks,
    SetDataset,
    SetErrorBudget,
    SetWeights,
    StopJob,
)
from chunkmaster.core.ids import UnitId
from chunkmaster.core.master_state import (
    FAILURE_HISTORY,
    Finishers,
    MasterState,
    Pending,
    SaveApproval,
    Session,
)
from chunkmaster.core.mixture import (
    MixtureState,
    cursor_from_json,
    cursor_json,
    plan_from_json,
    plan_json,
    weights_from_json,
    weights_json,
)
from chunkmaster.core.model import FailedPolicy, Failure, PassLedger, Position, RecordCounts
from chunkmaster.core.steps import Piece, StepsMode, StepsState

if sys.byteorder != "little":  # pragma: no cover - every platform we ship for is little-endian
    raise ImportError("chunkmaster's state codec assumes a little-endian machine")

CONTAINER_MAGIC = b"CMB1"
#: The snapshot versions this build reads, and what each holds beside the one before (a field
#: a version lacks reads as its empty value). A version is new when a reader without the field
#: would hand out other tasks or let the wrong trainer in: such a reader must refuse it.
#:
#: 2: the queues, passes, failures, sessions, commits and the ledger's counts.
#: 3: quarantined records, the error budget and a stopped job, equal steps.
#: 4: version 3 with a shuffle seed.
#: 5: who holds what (identities of sessions and dispatches, dispatches taken back, each
#:    pass's finishers), sessions' ranks and world sizes, the last restore's key.
#: 6: each session's progress deadline; the version of every job that is not a mixture.
#: 7: a mixture (its sources, plans, weights and per-source counts).
#: 8: a mixture that sources were added to while it ran (fewer units than its tasks).
#: 9: any of 6, 7 or 8 whose dataset has a shuffle window (its `window`): a reader without
#:    it would tell trainers to read each task in file order, and their positions count
#:    records in the window's permuted order.
#:
#: Optional keys that need no version: a mixture's per-source counts of each pass, read as
#: none; a dataset's `chunk_size`, read as None (its data checkpoints then read as cut at
#: 4 MiB); a ledger row's last two counts (what a restore found committed and rolled back:
#: figures for the status, which hand out nothing), read as 0.
SNAPSHOT_VERSION = 6
SNAPSHOT_VERSION_SHUFFLED = SNAPSHOT_VERSION
SNAPSHOT_VERSION_MIXTURE = 7
SNAPSHOT_VERSION_GROWN = 8
SNAPSHOT_VERSION_WINDOWED = 9
MIXTURE_VERSIONS = (SNAPSHOT_VERSION_MIXTURE, SNAPSHOT_VERSION_GROWN)
READABLE_VERSIONS = (2, 3, 4, 5, SNAPSHOT_VERSION, *MIXTURE_VERSIONS, SNAPSHOT_VERSION_WINDOWED)
_LEN = struct.Struct("<I")
_C = TypeVar("_C", bound=RecordCounts)


class CodecError(ValueError):
    """Stored bytes that this version cannot read."""


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def pack(header: dict[str, Any], blobs: dict[str, array[int]]) -> bytes:
    header = dict(header)
    header["blobs"] = [[name, a.typecode, len(a)] for name, a in blobs.items()]
    head = _dumps(header)
    parts = [CONTAINER_MAGIC, _LEN.pack(len(head)), head]
    parts.extend(a.tobytes() for a in blobs.values())
    return b"".join(parts)


def unpack(data: bytes | memoryview) -> tuple[dict[str, Any], dict[str, array[int]]]:
    view = memoryview(data)
    if bytes(view[:4]) != CONTAINER_MAGIC:
        raise CodecError("not a chunkmaster container (bad magic)")
    (hlen,) = _LEN.unpack_from(view, 4)
    header = json.loads(bytes(view[8 : 8 + hlen]))
    pos = 8 + hlen
    blobs: dict[str, array[int]] = {}
    for name, typecode, count in header.pop("blobs"):
        a: array[int] = array(typecode)
        size = a.itemsize * count
        if pos + size > len(view):
            raise CodecError(f"container truncated in blob {name!r}")
        a.frombytes(view[pos : pos + size])
        blobs[name] = a
        pos += size
    if pos != len(view):
        raise CodecError("container has trailing bytes")
    return header, blobs


def _dataset_parts(ds: Dataset) -> tuple[dict[str, Any], dict[str, array[int]]]:
    header: dict[str, Any] = {
        "globs": list(ds.globs),
        "files": list(ds.files),
        "cpt": ds.chunks_per_task,
    }
    if ds.format != "recordio":
        header["format"] = ds.format
    if ds.shuffle_seed is not None:
        header["seed"] = ds.shuffle_seed
    if ds.shuffle_window:
        header["window"] = ds.shuffle_window
    if ds.chunk_size is not None:
        header["chunk_size"] = ds.chunk_size
    if ds.sources:
        header["sources"] = [
            [s.name, list(s.globs), s.num_files, s.num_chunks, s.format, s.chunk_size, s.weight]
            for s in ds.sources
        ]
    blobs = {"cf": ds.chunk_file, "co": ds.chunk_offset, "cr": ds.chunk_records}
    if ds.file_sizes is not None:
        blobs["fs"] = ds.file_sizes
    if ds.chunk_length is not None:
        blobs["cl"] = ds.chunk_length
    if ds.file_mtimes is not None:
        blobs["fm"] = ds.file_mtimes
    return header, blobs


def _dataset_from(header: dict[str, Any], blobs: dict[str, array[int]]) -> Dataset:
    if int(header.get("window", 0)) < 0:
        raise CodecError(f"a dataset's shuffle window {header['window']} is negative")
    return Dataset(
        tuple(header["globs"]),
        tuple(header["files"]),
        blobs["cf"],
        blobs["co"],
        blobs["cr"],
        int(header["cpt"]),
        blobs.get("fs"),
        blobs.get("cl"),
        str(header.get("format", "recordio")),
        None if header.get("seed") is None else int(header["seed"]),
        int(header.get("window", 0)),
        chunk_size=None if header.get("chunk_size") is None else int(header["chunk_size"]),
        sources=tuple(
            Source(
                str(name),
                tuple(map(str, globs)),
                int(files),
                int(chunks),
                str(fmt),
                None if size is None else int(size),
                float(weight),
            )
            for name, globs, files, chunks, fmt, size, weight in header.get("sources", ())
        ),
        file_mtimes=blobs.get("fm"),
    )


def _positions(positions: tuple[Position, ...]) -> list[list[int]]:
    return [[p.task_id, p.epoch, p.pass_id, p.records] for p in positions]


def _positions_from(v: Any) -> tuple[Position, ...]:
    return tuple(Position(int(t), int(e), int(p), int(r)) for t, e, p, r in v)


def _budget(b: ErrorBudget) -> list[Any]:
    return [b.records, None if b.percent is None else str(b.percent)]


def _budget_from(v: Any) -> ErrorBudget:
    records, percent = v
    return ErrorBudget(
        None if records is None else int(records),
        None if percent is None else Fraction(str(percent)),
    )


def _encode_dispatch(ev: Dispatch) -> bytes:
    d, w, r, sid, who = ev.deadline, ev.worker, ev.request, ev.session, ev.owner
    if who:
        return b"D" + _dumps([d, w, r, sid, who])
    return b"D" + _dumps([d, w, r, sid] if sid else [d, w, r] if r else [d, w])


def _encode_open_session(ev: OpenSession) -> bytes:
    fields: list[Any] = [ev.session, ev.name, ev.host, ev.pid, ev.report_every]
    if ev.owner or ev.world_size:
        fields.append(ev.owner)
    if ev.world_size:
        fields += [ev.world_size, ev.rank]
    return b"O" + _dumps(fields)


def _encode_end_session(ev: EndSession) -> bytes:
    # A charging end has a tag of its own, which a reader that does not count its failure
    # refuses.
    return (b"L" if ev.charge else b"E") + _dumps([ev.session, ev.reason, _positions(ev.positions)])


def _encode_progress(ev: Progress) -> bytes:
    # Progress that moves deadlines has a tag of its own, which a reader that does not move
    # them refuses.
    ps = _positions(ev.positions)
    return b"G" + _dumps([ev.deadline, ps]) if ev.deadline else b"P" + _dumps(ps)


def _encode_restore(ev: Restore) -> bytes:
    cs = [list(c) for c in ev.commits]
    mix = ev.mixture
    if ev.ranges:  # a tag of its own, which a reader without ranges refuses (not drops)
        plans = None if mix is None else [weights_json(mix.weights), _plans_json(mix)]
        ranges = [list(r) for r in ev.ranges]
        return b"Y" + _dumps([ev.floor, cs, ev.source, ev.key, ev.rank, ev.job_id, plans, ranges])
    asker = [ev.rank, ev.job_id] if ev.job_id else [ev.rank] if ev.rank >= 0 else []
    if mix is not None:  # a tag of its own, which a reader without mixtures refuses
        return b"A" + _dumps(
            [ev.floor, cs, ev.source, ev.key, weights_json(mix.weights), _plans_json(mix), *asker]
        )
    tail = [ev.key, *asker] if ev.key or asker else []
    return b"B" + _dumps([ev.floor, cs, ev.source, *tail])


def _plans_json(mix: MixturePosition) -> list[Any]:
    return [[p, plan_json(plan)] for p, plan in mix.passes]


def _decode_ranged_restore(v: Any) -> Restore:
    """Y, a restore with committed ranges beyond tasks' prefixes: floor, commits, source,
    key, rank, job_id, [weights, plans] (a mixture's) or null, ranges."""
    floor, commits, source, key, rank, job_id, plans, ranges = v
    return Restore(
        int(floor),
        tuple((int(p), int(t), int(r)) for p, t, r in commits),
        str(source),
        str(key),
        None
        if plans is None
        else MixturePosition(
            tuple((int(p), plan_from_json(plan)) for p, plan in plans[1]),
            weights_from_json(plans[0]),
        ),
        int(rank),
        str(job_id),
        tuple((int(p), int(t), int(a), int(b)) for p, t, a, b in ranges),
    )


def _encode_add_sources(ev: AddSources) -> bytes:
    header, blobs = _dataset_parts(ev.dataset)
    return b"N" + pack({**header, "weights": weights_json(ev.weights)}, blobs)


def _encode_set_dataset(ev: SetDataset) -> bytes:
    ds = ev.dataset
    header, blobs = _dataset_parts(ds)
    if ev.job_id:
        header = {**header, "job_id": ev.job_id}
    # A seeded dataset, a mixture, and a dataset with a shuffle window (seeded, a mixture or
    # not) have tags of their own, which a reader without them refuses.
    if ds.shuffle_window:
        tag = b"V"
    else:
        tag = b"M" if ds.sources else b"T" if ds.shuffle_seed is None else b"H"
    return tag + pack(header, blobs)


#: Each event kind's journal entry: a tag byte and its body.
_ENCODERS: dict[type[Event], Callable[[Any], bytes]] = {
    Dispatch: _encode_dispatch,
    Finish: lambda ev: b"F" + _dumps([ev.task_id, ev.epoch, ev.pass_id]),
    Fail: lambda ev: b"X" + _dumps([ev.task_id, ev.epoch, ev.reason]),
    ApproveSave: lambda ev: b"S" + _dumps([ev.trainer_id, ev.until]),
    Configure: lambda ev: b"C" + _dumps([ev.failure_max, ev.failed_policy.value]),
    EqualSteps: lambda ev: b"Z" + _dumps([ev.mode]),
    Resume: lambda ev: b"R" + _dumps([ev.not_before]),
    OpenSession: _encode_open_session,
    EndSession: _encode_end_session,
    ReturnTasks: lambda ev: b"U" + _dumps([ev.session, _positions(ev.positions)]),
    Progress: _encode_progress,
    Commit: lambda ev: b"K" + _dumps(_positions(ev.positions)),
    Restore: _encode_restore,
    SetWeights: lambda ev: b"W" + _dumps(weights_json(ev.weights)),
    AddSources: _encode_add_sources,
    SetErrorBudget: lambda ev: b"Q" + _dumps(_budget(ev.budget)),
    StopJob: lambda ev: b"J" + _dumps([ev.message]),
    SetDataset: _encode_set_dataset,
}


def encode_event(ev: Event) -> bytes:
    encode = _ENCODERS.get(type(ev))
    if encode is None:
        raise CodecError(f"cannot encode {ev!r}")
    return encode(ev)


def _decode_dispatch(v: Any) -> Dispatch:
    return Dispatch(
        float(v[0]),
        str(v[1]),
        str(v[2]) if len(v) > 2 else "",
        str(v[3]) if len(v) > 3 else "",
        str(v[4]) if len(v) > 4 else "",
    )


def _decode_open_session(v: Any) -> OpenSession:
    return OpenSession(
        str(v[0]),
        str(v[1]),
        str(v[2]),
        int(v[3]),
        int(v[4]),
        str(v[5]) if len(v) > 5 else "",
        int(v[6]) if len(v) > 7 else 0,
        int(v[7]) if len(v) > 7 else 0,
    )


def _decode_restore(v: Any, *, mixture: bool = False) -> Restore:
    """B: floor, commits, source[, key[, rank[, job_id]]]; A, a mixture's: floor, commits,
    source, key, weights, plans[, rank[, job_id]]."""
    rank = 6 if mixture else 4  # where the asker's rank is, if it is there
    return Restore(
        int(v[0]),
        tuple((int(p), int(t), int(r)) for p, t, r in v[1]),
        str(v[2]),
        str(v[3]) if len(v) > 3 else "",
        MixturePosition(
            tuple((int(p), plan_from_json(plan)) for p, plan in v[5]),
            weights_from_json(v[4]),
        )
        if mixture
        else None,
        rank=int(v[rank]) if len(v) > rank else -1,
        job_id=str(v[rank + 1]) if len(v) > rank + 1 else "",
    )


#: Each JSON journal entry's event, by its tag (a dataset's entries: `_dataset_entry`).
_DECODERS: dict[bytes, Callable[[Any], Event]] = {
    b"D": _decode_dispatch,
    b"O": _decode_open_session,
    b"E": lambda v: EndSession(str(v[0]), str(v[1]), _positions_from(v[2]), False),
    b"L": lambda v: EndSession(str(v[0]), str(v[1]), _positions_from(v[2]), True),
    b"U": lambda v: ReturnTasks(str(v[0]), _positions_from(v[1])),
    b"P": lambda v: Progress(_positions_from(v)),
    b"G": lambda v: Progress(_positions_from(v[1]), float(v[0])),
    b"K": lambda v: Commit(_positions_from(v)),
    b"B": _decode_restore,
    b"A": lambda v: _decode_restore(v, mixture=True),
    b"Y": _decode_ranged_restore,
    b"W": lambda v: SetWeights(weights_from_json(v)),
    b"F": lambda v: Finish(int(v[0]), int(v[1]), int(v[2])),
    b"X": lambda v: Fail(int(v[0]), int(v[1]), str(v[2])),
    b"S": lambda v: ApproveSave(str(v[0]), float(v[1])),
    b"C": lambda v: Configure(int(v[0]), FailedPolicy(v[1])),
    b"R": lambda v: Resume(float(v[0])),
    b"Q": lambda v: SetErrorBudget(_budget_from(v)),
    b"J": lambda v: StopJob(str(v[0])),
    b"Z": lambda v: EqualSteps(StepsMode(v[0]).value),
}


#: The tags of the journal entries that carry a dataset (`_dataset_entry`).
_DATASET_TAGS = (b"T", b"H", b"M", b"V", b"N")


def decode_event(data: bytes) -> Event:
    tag, body = data[:1], data[1:]
    decode = _DECODERS.get(tag)
    if decode is None and tag not in _DATASET_TAGS:
        known = "".join(sorted(t.decode() for t in (*_DECODERS, *_DATASET_TAGS)))
        raise CodecError(
            f"a journal entry of a kind this chunkmaster does not know (tag {tag!r}; it reads "
            f"the tags {known}): it was written by a newer chunkmaster, or is damaged; run "
            "the version that wrote it"
        )
    try:
        if decode is None:
            return _dataset_entry(tag, body)
        return decode(json.loads(body))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise CodecError(f"corrupt journal entry (tag {tag!r}): {exc}") from exc


def _dataset_entry(tag: bytes, body: bytes) -> Event:
    """An entry that carries a dataset: SetDataset (T, H seeded, M a mixture, V with a
    shuffle window) or AddSources."""
    header, blobs = unpack(body)
    ds = _dataset_from(header, blobs)
    if tag == b"N":
        if not ds.sources:
            raise CodecError("sources added without sources")
        return AddSources(ds, weights_from_json(header["weights"]))
    if (tag == b"V") != (ds.shuffle_window > 0):
        raise CodecError("a dataset entry's tag and shuffle window disagree")
    if tag == b"V":
        if ds.shuffle_seed is None:
            raise CodecError("a dataset entry has a shuffle window without a shuffle seed")
    elif (tag == b"M") != bool(ds.sources):
        raise CodecError("a dataset entry's tag and its sources disagree")
    elif tag != b"M" and (tag == b"H") != (ds.shuffle_seed is not None):
        raise CodecError("a dataset entry's tag and shuffle seed disagree")
    return SetDataset(ds, str(header.get("job_id", "")))


def encode_snapshot(state: MasterState) -> bytes:
    stop = state.stopped
    header: dict[str, Any] = {
        "version": _version(state),
        "cur_pass": state.cur_pass,
        "failure_max": state.failure_max,
        "failed_policy": state.failed_policy.value,
        **_holders_header(state),
        **_commits_header(state),
        "ledger": [_ledger_row(p, led) for p, led in state.ledger.items()],
        "error_budget": _budget(state.error_budget),
        "stopped": None
        if stop is None
        else [stop.pass_id, stop.records, stop.limit, list(stop.tasks), stop.message],
        "steps": _steps_header(state.steps),
        "num_failures": list(state.num_failures.items()),
        "failure_log": [
            [t, state.failure_total.get(t, len(log)), [[f.pass_id, f.epoch, f.reason] for f in log]]
            for t, log in state.failure_log.items()
        ],
        "saver": None if state.saver is None else [state.saver.trainer_id, state.saver.until],
        "dataset": None,
    }
    blobs: dict[str, array[int]] = {
        "todo": array("q", state.todo),
        "done": array("q", state.done),
        "failed": array("q", state.failed),
        "epochs": state.epochs,
    }
    for p, fin in state.finishers.items():
        blobs[f"finishers{p}"] = fin.tasks
    if state.dataset is not None:
        ds_header, ds_blobs = _dataset_parts(state.dataset)
        header["dataset"] = ds_header
        blobs.update(ds_blobs)
    if state.mix is not None:
        header["mixture"] = _mixture_header(state.mix, state.ledger)
        for p, plan in state.mix.passes.items():
            if plan.units is not None:
                blobs[f"plan{p}"] = plan.units
    return pack(header, blobs)


def _holders_header(state: MasterState) -> dict[str, Any]:
    """Who holds what: the pending dispatches, the sessions, the dispatches taken back and
    handed back, the finishers of each pass, and the positions of this pass."""
    return {
        "pending": [
            [t, p.epoch, p.deadline, p.worker, p.request, p.session, p.start, p.owner]
            for t, p in state.pending.items()
        ],
        "sessions": [_session_row(sid, s) for sid, s in state.sessions.items()],
        "taken": [[t, e, p] for (t, e), p in state.taken.items()],
        "returned": [[t, e, sid, r] for (t, e), (sid, r) in state.returned.items()],
        "finishers": [
            [p, list(fin.ids.items()), list(fin.pieces.items())]
            for p, fin in state.finishers.items()
        ],
        "progress": list(state.progress.items()),
    }


def _commits_header(state: MasterState) -> dict[str, Any]:
    """The commits, the last restore and the job's identity, and the passes ended."""
    return {
        "commits": [[p, list(c.items())] for p, c in state.commits.items()],
        "commit_floor": state.commit_floor,
        "restored_from": state.restored_from,
        "restore_key": state.restore_key,
        "job_id": state.job_id,
        "restore_ranks": list(state.restore_ranks),
        "restore_moved": state.restore_moved,
        "pass_done": list(state.pass_done.items()),
    }


def _version(state: MasterState) -> int:
    if state.dataset is not None and state.dataset.shuffle_window:
        return SNAPSHOT_VERSION_WINDOWED
    if state.mix is None:
        return SNAPSHOT_VERSION
    assert state.dataset is not None
    if state.mix.units != state.dataset.num_tasks:
        return SNAPSHOT_VERSION_GROWN
    return SNAPSHOT_VERSION_MIXTURE


def _mixture_header(mix: MixtureState, ledger: dict[int, PassLedger]) -> dict[str, Any]:
    return {
        "ledger": [
            [p, [[s, *_counts_row(c)] for s, c in led.sources.items()]]
            for p, led in ledger.items()
            if led.sources
        ],
        "units": mix.units,
        "weights": weights_json(mix.weights),
        "cursors": [cursor_json(c) for c in mix.cursors],
        "passes": [[p, plan_json(plan)] for p, plan in mix.passes.items()],
        "high": mix.high,
        "handed": mix.handed,
        "consumed": mix.consumed,
        "committed": mix.committed,
    }


def _mixture_from(
    h: dict[str, Any], blobs: dict[str, array[int]], ds: Dataset | None, cur_pass: int
) -> MixtureState:
    if ds is None or not ds.sources:
        raise CodecError("a snapshot's mixture has no sources in its dataset")
    mix = MixtureState.of(ds)
    mix.units = int(h["units"])
    mix.weights = weights_from_json(h["weights"])
    mix.cursors = [cursor_from_json(c) for c in h["cursors"]]
    for p, plan in h["passes"]:
        mix.passes[int(p)] = record = plan_from_json(plan)
        record.units = blobs.get(f"plan{int(p)}")
    mix.handed = [int(n) for n in h["handed"]]
    mix.consumed = [int(n) for n in h["consumed"]]
    mix.committed = [int(n) for n in h["committed"]]
    high = int(h["high"])
    if high:
        mix.reach(cur_pass, high - 1)
    mix.records = mix.records_of(mix.plan(cur_pass))
    return mix


def _session_row(sid: str, s: Session) -> list[Any]:
    return [
        sid,
        s.name,
        s.host,
        s.pid,
        s.report_every,
        s.consumed,
        s.owner,
        s.world_size,
        s.rank,
        s.deadline,
    ]


def _ledger_row(p: int, led: PassLedger) -> list[Any]:
    return [p, *_counts_row(led)]


def _counts_row(c: RecordCounts) -> list[Any]:
    return [
        c.dispatched,
        c.consumed,
        c.committed,
        c.redispatched,
        c.quarantined,
        c.dropped,
        c.padded,
        c.restored,
        c.rolled_back,
    ]


def _counts_from(row: list[Any], into: _C) -> _C:
    """A ledger row's counts (quarantined, dropped and padded are absent before version 3,
    restored and rolled_back in snapshots older than them)."""
    d, c, k, r, *more = row
    into.dispatched, into.consumed, into.committed = int(d), int(c), int(k)
    into.redispatched = {str(w): int(n) for w, n in r.items()}
    names = ("quarantined", "dropped", "padded", "restored", "rolled_back")
    for name, x in zip(names, more, strict=False):
        setattr(into, name, int(x))
    return into


def decode_snapshot(data: bytes) -> MasterState:
    try:
        header, blobs = unpack(data)
        st = MasterState()
        if header.get("version") not in READABLE_VERSIONS:
            raise CodecError(_version_refusal(header.get("version")))
        if header["dataset"] is not None:
            st.dataset = _dataset_from(header["dataset"], blobs)
        _check_version(header, st.dataset)
        st.cur_pass = int(header["cur_pass"])
        if "mixture" in header:
            st.mix = _mixture_from(header["mixture"], blobs, st.dataset, st.cur_pass)
        st.failure_max = int(header["failure_max"])
        st.failed_policy = FailedPolicy(header["failed_policy"])
        st.todo = deque(blobs["todo"])
        st.done = list(blobs["done"])
        st.failed = list(blobs["failed"])
        st.epochs = blobs["epochs"]
        _sessions_from(st, header, blobs)
        _commits_from(st, header)
        _ledger_from(st, header)
        if "steps" in header:
            st.steps = _steps_from(header["steps"])
        _failures_from(st, header)
        if header["saver"] is not None:
            st.saver = SaveApproval(str(header["saver"][0]), float(header["saver"][1]))
        return st
    except CodecError:
        raise
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise CodecError(f"corrupt snapshot: {exc}") from exc


def _version_refusal(version: Any) -> str:
    """Why a snapshot of `version` is not read, naming the versions this build reads."""
    reads = f"this chunkmaster reads snapshot versions {min(READABLE_VERSIONS)} to " + str(
        max(READABLE_VERSIONS)
    )
    if type(version) is int and version > max(READABLE_VERSIONS):
        return (
            f"snapshot version {version} was written by a newer chunkmaster ({reads}): run "
            "that newer version, or a later one"
        )
    return f"snapshot version {version!r} is not supported ({reads})"


def _check_version(header: dict[str, Any], ds: Dataset | None) -> None:
    """A snapshot's version agrees with what it holds: a mixture, a shuffle seed, a shuffle
    window (version 9: with or without a mixture, always with a seed)."""
    windowed = ds is not None and ds.shuffle_window > 0
    if (header["version"] == SNAPSHOT_VERSION_WINDOWED) != windowed:
        raise CodecError("a snapshot's version and its dataset's shuffle window disagree")
    if windowed and ds is not None and ds.shuffle_seed is None:
        raise CodecError("a snapshot's dataset has a shuffle window without a shuffle seed")
    if not windowed and (header["version"] in MIXTURE_VERSIONS) != ("mixture" in header):
        raise CodecError("a snapshot's version and its mixture disagree")
    seeded = ds is not None and ds.shuffle_seed is not None
    if header["version"] < 5 and seeded != (header["version"] == 4):
        raise CodecError("a snapshot's version and its dataset's shuffle seed disagree")


def _sessions_from(st: MasterState, header: dict[str, Any], blobs: dict[str, array[int]]) -> None:
    """A snapshot's pending dispatches, sessions, holders, finishers and positions."""
    st.pending = {
        int(t): Pending(int(e), float(d), str(w), str(r), str(sid), int(start), *map(str, who))
        for t, e, d, w, r, sid, start, *who in header["pending"]
    }
    st.requests = {p.request: t for t, p in st.pending.items() if p.request}
    st.sessions = {
        str(sid): _session_from(n, h, pid, every, consumed, more)
        for sid, n, h, pid, every, consumed, *more in header["sessions"]
    }
    _holders_from(st, header)
    for p, ids, pieces in header.get("finishers", ()):
        st.finishers[int(p)] = Finishers(
            {str(name): int(n) for name, n in ids},
            blobs[f"finishers{int(p)}"],
            {int(u): int(n) for u, n in pieces},
        )
    st.progress = {int(t): int(r) for t, r in header["progress"]}


def _commits_from(st: MasterState, header: dict[str, Any]) -> None:
    """A snapshot's commits, the last restore and the passes ended."""
    for p, commits in header["commits"]:
        c = st.commits[int(p)] = {int(t): int(r) for t, r in commits}
        if st.dataset is not None:
            full = sum(1 for t, r in c.items() if r == st.task_records(t, int(p)))
            if full:
                st.full_commits[int(p)] = full
    st.commit_floor = int(header["commit_floor"])
    _restores_from(st, header)
    st.pass_done = {int(p): int(n) for p, n in header["pass_done"]}


def _ledger_from(st: MasterState, header: dict[str, Any]) -> None:
    """A snapshot's record counts, its error budget and a stop it made."""
    st.ledger = {int(p): _counts_from(row, PassLedger()) for p, *row in header["ledger"]}
    if "mixture" in header:
        for p, sources in header["mixture"].get("ledger", ()):
            st.ledger[int(p)].sources = {
                int(s): _counts_from(row, RecordCounts()) for s, *row in sources
            }
    if header.get("error_budget") is not None:
        st.error_budget = _budget_from(header["error_budget"])
    if header.get("stopped") is not None:
        p, n, limit, tasks, message = header["stopped"]
        st.stopped = JobStop(int(p), int(n), int(limit), tuple(map(int, tasks)), str(message))


def _failures_from(st: MasterState, header: dict[str, Any]) -> None:
    """A snapshot's failure counts and the last failures of each task."""
    st.num_failures = {int(t): int(n) for t, n in header["num_failures"]}
    for t, total, log in header["failure_log"]:
        st.failure_log[int(t)] = deque(
            (Failure(int(p), int(e), str(r)) for p, e, r in log), maxlen=FAILURE_HISTORY
        )
        st.failure_total[int(t)] = int(total)


def _holders_from(st: MasterState, header: dict[str, Any]) -> None:
    """A snapshot's dispatches taken from their holders, and those handed back."""
    st.taken = {(int(t), int(e)): int(p) for t, e, p in header.get("taken", ())}
    st.returned = {
        (int(t), int(e)): (str(sid), int(r)) for t, e, sid, r in header.get("returned", ())
    }


def _restores_from(st: MasterState, header: dict[str, Any]) -> None:
    """A snapshot's last restore and the job's identity (each absent in older ones)."""
    st.restored_from = str(header["restored_from"])
    st.restore_key = str(header.get("restore_key", ""))
    st.job_id = str(header.get("job_id", ""))
    st.restore_ranks = frozenset(int(r) for r in header.get("restore_ranks", ()))
    st.restore_moved = bool(header.get("restore_moved", True))


def _session_from(n: Any, h: Any, pid: Any, every: Any, consumed: Any, more: list[Any]) -> Session:
    """A snapshot's session: owner, world size and rank are absent before version 5, the
    progress deadline before version 6."""
    owner = str(more[0]) if more else ""
    world, rank = (int(more[1]), int(more[2])) if len(more) > 2 else (0, 0)
    deadline = float(more[3]) if len(more) > 3 else 0.0
    return Session(
        str(n), str(h), int(pid), int(every), int(consumed), owner, world, rank, deadline
    )


def _steps_header(st: StepsState) -> dict[str, Any]:
    return {
        "mode": st.mode.value,
        "members": list(st.members.items()),
        "target": st.target,
        "unassigned": st.unassigned,
        "queued_pads": st.queued_pads,
        "pieces": [
            [u, p.pass_id, p.task, p.start, p.end, int(p.pad), p.epoch, p.committed]
            for u, p in st.pieces.items()
        ],
        "next_piece": st.next_piece,
        "outstanding": list(st.outstanding.items()),
        "lost": sorted(st.lost),
        "ahead": [[p, t, list(r.items())] for (p, t), r in st.ahead.items()],
        "pad": [st.pad_task, st.pad_at],
    }


def _steps_from(h: dict[str, Any]) -> StepsState:
    return StepsState(
        mode=StepsMode(h["mode"]),
        members={str(s): int(n) for s, n in h["members"]},
        target=int(h["target"]),
        unassigned=int(h["unassigned"]),
        queued_pads=int(h["queued_pads"]),
        pieces={
            int(u): Piece(int(p), UnitId(int(t)), int(a), int(b), bool(pad), int(e), int(c))
            for u, p, t, a, b, pad, e, c in h["pieces"]
        },
        next_piece=int(h["next_piece"]),
        outstanding={int(t): int(n) for t, n in h["outstanding"]},
        lost={int(t) for t in h["lost"]},
        ahead={(int(p), int(t)): {int(a): int(b) for a, b in r} for p, t, r in h["ahead"]},
        pad_task=int(h["pad"][0]),
        pad_at=int(h["pad"][1]),
    )
