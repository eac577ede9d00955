"""Journal and snapshot bytes: replaying entries and loading a snapshot give the same state."""

from __future__ import annotations

from array import array
from fractions import Fraction

import hypothesis.strategies as st
import pytest
from helpers.mixtures import check_ledger_sums
from hypothesis import given, settings

from chunkmaster.core.codec import (
    READABLE_VERSIONS,
    CodecError,
    decode_event,
    decode_snapshot,
    encode_event,
    encode_snapshot,
    pack,
    unpack,
)
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.events import (
    ApproveSave,
    Commit,
    Configure,
    Dispatch,
    EndSession,
    EqualSteps,
    Fail,
    Finish,
    OpenSession,
    Progress,
    Resume,
    SetDataset,
    SetErrorBudget,
)
from chunkmaster.core.model import FailedPolicy, Position, Task
from chunkmaster.core.quarantine import ErrorBudget
from chunkmaster.core.state import Availability, MasterState, apply, check_get_task


def ds(n: int) -> Dataset:
    return Dataset.build(
        ["/d/*.rio"], ["/d/a.rio", "/d/b.rio"], [(list(range(n)), [2] * n), ([7], [1])], 2
    )


def comparable(s: MasterState) -> tuple[object, ...]:
    return (
        s.cur_pass,
        list(s.todo),
        s.done,
        s.failed,
        list(s.epochs),
        [  # in dispatch order: a lost session charges the first task it holds
            (t, p.epoch, p.deadline, p.worker, p.request, p.session, p.start, p.owner)
            for t, p in s.pending.items()
        ],
        s.taken,
        {p: (f.ids, list(f.tasks), f.pieces) for p, f in s.finishers.items()},
        s.sessions,
        s.progress,
        s.commits,
        s.full_commits,
        s.commit_floor,
        s.pass_done,
        s.ledger,
        s.requests,
        s.num_failures,
        {t: list(v) for t, v in s.failure_log.items()},
        s.failure_total,
        s.saver,
        s.failure_max,
        s.failed_policy,
        s.error_budget,
        s.stopped,
        s.steps,
        None if s.mix is None else mixture_view(s),
        None
        if s.dataset is None
        else (
            s.dataset.globs,
            s.dataset.files,
            list(s.dataset.chunk_file),
            list(s.dataset.chunk_offset),
            list(s.dataset.chunk_records),
            s.dataset.chunks_per_task,
            s.dataset.sources,
            s.dataset.shuffle_seed,
        ),
    )


def mixture_view(s: MasterState) -> tuple[object, ...]:
    """A mixture's state, its plans as units whether stored or computed again."""
    mix = s.mix
    assert mix is not None
    return (
        mix.units,
        mix.weights,
        mix.cursors,
        {
            p: (plan.start, plan.weights, plan.replans, list(mix.plan(p)))
            for p, plan in mix.passes.items()
        },
        mix.high,
        mix.handed,
        mix.consumed,
        mix.committed,
        mix.reached,
    )


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from("DFXSCROEPKQ"), st.integers(0, 9)), max_size=80))
def test_replay_and_snapshot_agree(ops: list[tuple[str, int]]) -> None:
    live, journal = MasterState(), []
    for ev in [SetDataset(ds(9))]:
        journal.append(encode_event(ev))
        apply(live, ev)
    for kind, x in ops:
        ev: object
        if kind == "D":
            if not live.todo:
                continue
            session = f"s{x % 3}" if f"s{x % 3}" in live.sessions else ""
            owner = f"CN=trainer-{x % 2}" if x % 4 == 1 and not session else ""
            ev = Dispatch(
                1000.0 + x, f"worker-{x}", f"req-{len(journal)}" if x % 2 else "", session, owner
            )
        elif kind == "O":
            owner = f"CN=trainer-{x % 2}" if x % 3 else ""
            ev = OpenSession(f"s{x % 3}", f"trainer {x}", "host", 100 + x, x * 10, owner)
        elif kind == "E":
            lost = x % 2 == 1
            ev = EndSession(
                f"s{x % 3}", "trainer lost" if lost else "returned", held(live, x), lost
            )
        elif kind == "P":  # a deadline moves with the progress (0: an entry from before)
            ev = Progress(held(live, x), 1010.0 + x if x % 3 else 0.0)
        elif kind == "K":
            ev = Commit(held(live, x))
        elif kind == "F":
            ev = Finish(x % live.num_tasks, x % 3, -1)
        elif kind == "X":
            t = x % live.num_tasks
            p = live.pending.get(t)
            ev = Fail(t, p.epoch if p else 0, f"reason {x} ünïcode")
        elif kind == "S":
            ev = ApproveSave(f"trainer-{x}", 50.0 + x)
        elif kind == "R":
            ev = Resume(1003.5 + x)
        elif kind == "Q":
            budget = [ErrorBudget(), ErrorBudget(records=x), ErrorBudget(percent=Fraction(x, 4))]
            ev = SetErrorBudget(budget[x % 3])
        else:
            ev = Configure(x % 3, FailedPolicy.KEEP if x % 2 else FailedPolicy.RETRY)
        journal.append(encode_event(ev))  # type: ignore[arg-type]
        apply(live, ev)  # type: ignore[arg-type]
    replayed = MasterState()
    for data in journal:
        apply(replayed, decode_event(data))
    assert comparable(replayed) == comparable(live)
    assert comparable(decode_snapshot(encode_snapshot(live))) == comparable(live)


@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from(["drop", "pad"]),
    ops=st.lists(st.tuples(st.sampled_from("DDDFFXOEPKQR"), st.integers(0, 9)), max_size=100),
)
def test_replay_and_snapshot_agree_with_equal_steps(mode: str, ops: list[tuple[str, int]]) -> None:
    """Equal steps (pieces, quotas, drops, pads, trainers lost, restores of ranges committed
    beyond a split task's prefix) replay and load exactly."""
    from chunkmaster.core.events import Restore
    from chunkmaster.core.state import committed_position, committed_ranges

    live, journal = MasterState(), []
    first = [EqualSteps(mode), SetDataset(ds(9))]
    first += [OpenSession(f"s{i}", f"t{i}", "h", i, 0, f"CN=t{i % 2}") for i in range(3)]
    for ev in first:
        journal.append(encode_event(ev))
        apply(live, ev)  # type: ignore[arg-type]
    for kind, x in ops:
        ev: object
        sid = f"s{x % 4}"
        if kind == "D":
            if check_get_task(live, live.cur_pass, sid) is not Availability.DISPATCH:
                continue
            ev = Dispatch(1000.0 + x, sid, f"req-{len(journal)}", sid)
        elif kind == "O":
            ev = OpenSession(sid, f"trainer {x}", "host", 100 + x, x * 10)
        elif kind == "E":
            lost = x % 2 == 1
            ev = EndSession(sid, "trainer lost" if lost else "returned", held(live, x), lost)
        elif kind == "P":  # a deadline moves with the progress (0: an entry from before)
            ev = Progress(held(live, x), 1010.0 + x if x % 3 else 0.0)
        elif kind == "K":
            ev = Commit(held(live, x))
        elif kind == "Q":
            ev = EqualSteps(["off", "drop", "pad"][x % 3])
        elif kind == "R":
            floor, commits = committed_position(live)
            key = f"k{len(journal)}"
            ev = Restore(floor, commits, key, key, ranges=committed_ranges(live))
        elif not live.pending:
            continue
        else:
            t = sorted(live.pending)[x % len(live.pending)]
            p = live.pending[t]
            ev = Finish(t, p.epoch, live.cur_pass) if kind == "F" else Fail(t, p.epoch, "bad")
        journal.append(encode_event(ev))  # type: ignore[arg-type]
        apply(live, ev)  # type: ignore[arg-type]
    replayed = MasterState()
    for data in journal:
        apply(replayed, decode_event(data))
    assert comparable(replayed) == comparable(live)
    assert comparable(decode_snapshot(encode_snapshot(live))) == comparable(live)


def mixed() -> Dataset:
    parts = [
        ("web", Dataset.build(["/w/*"], ["/w/a", "/w/b"], [([0, 1, 2], [3, 1, 4]), ([0], [2])], 1)),
        ("code", Dataset.build(["/c/*.jsonl"], ["/c/a.jsonl"], [([0, 9], [5, 5])], 1, fmt="jsonl")),
        ("books", Dataset.build(["/b/*"], ["/b/a"], [([0], [9])], 1)),
    ]
    return Dataset.mix([(n, d, w) for (n, d), w in zip(parts, (0.6, 0.3, 0.1), strict=True)])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    mode=st.sampled_from(["off", "drop", "pad"]),
    cut=st.integers(0, 120),
    ops=st.lists(st.tuples(st.sampled_from("DDDFFXOEPKWB"), st.integers(0, 9)), max_size=120),
)
def test_replay_and_snapshot_agree_with_a_mixture(
    seed: int | None, mode: str, cut: int, ops: list[tuple[str, int]]
) -> None:
    """A mixture's plans, weight changes (re-plans), per-source counts and restores from its
    own data position replay and load exactly, with and without equal steps; a state loaded
    from a snapshot taken midway then applies the rest of the journal to the same state."""
    from chunkmaster.core.events import Restore, SetWeights
    from chunkmaster.core.mixture import Breakpoint, Weights
    from chunkmaster.core.state import committed_position, mixture_position

    live, journal = MasterState(), []
    first = [EqualSteps(mode), SetDataset(mixed().with_shuffle(seed))]
    first += [OpenSession(f"s{i}", f"t{i}", "h", i) for i in range(2)]
    for ev in first:
        journal.append(encode_event(ev))
        apply(live, ev)  # type: ignore[arg-type]
    snapshot, at = None, 0
    for kind, x in ops:
        ev: object
        sid = f"s{x % 3}"
        if kind == "D":
            if check_get_task(live, live.cur_pass, sid) is not Availability.DISPATCH:
                continue
            ev = Dispatch(
                1000.0 + x, sid, f"req-{len(journal)}", sid if sid in live.sessions else ""
            )
        elif kind == "O":
            ev = OpenSession(sid, f"trainer {x}", "host", 100 + x, x * 10)
        elif kind == "E":
            ev = EndSession(sid, "trainer lost" if x % 2 else "returned", held(live, x), x % 2 == 1)
        elif kind == "P":
            ev = Progress(held(live, x), 1010.0 + x)
        elif kind == "K":
            ev = Commit(held(live, x))
        elif kind == "W":
            points = (Breakpoint(0, (x % 3, 1, x % 2)), Breakpoint(10 + x, (1, x % 4, 1)))
            ev = SetWeights(Weights(points, "linear" if x % 2 else "step"))
        elif kind == "B":
            floor, commits = committed_position(live)
            ev = Restore(floor, commits, f"ckpt{x}", f"key{len(journal)}", mixture_position(live))
        elif not live.pending:
            continue
        else:
            t = sorted(live.pending)[x % len(live.pending)]
            p = live.pending[t]
            ev = Finish(t, p.epoch, live.cur_pass) if kind == "F" else Fail(t, p.epoch, "bad")
        journal.append(encode_event(ev))  # type: ignore[arg-type]
        apply(live, ev)  # type: ignore[arg-type]
        if len(journal) == cut:
            snapshot, at = encode_snapshot(live), len(journal)
    check_ledger_sums(live.ledger)  # each pass's counts, source by source
    replayed = MasterState()
    for data in journal:
        apply(replayed, decode_event(data))
    assert comparable(replayed) == comparable(live)
    assert comparable(decode_snapshot(encode_snapshot(live))) == comparable(live)
    if snapshot is not None:
        resumed = decode_snapshot(snapshot)
        for data in journal[at:]:
            apply(resumed, decode_event(data))
        assert comparable(resumed) == comparable(live)


def test_a_mixtures_entries_and_snapshots_refuse_older_readers() -> None:
    """A mixture's dataset ("M"), weight change ("W") and restore ("A") have tags of their own
    and its snapshots version 7: an older build refuses them rather than read one dataset.
    A job that is no mixture is written as before (version 6, "T")."""
    from chunkmaster.core.codec import SNAPSHOT_VERSION_MIXTURE, unpack
    from chunkmaster.core.events import Restore, SetWeights
    from chunkmaster.core.mixture import Weights
    from chunkmaster.core.state import committed_position, mixture_position

    state = MasterState()
    apply(state, SetDataset(mixed()))
    assert encode_event(SetDataset(mixed()))[:1] == b"M"
    assert encode_event(SetDataset(mixed().with_shuffle(3)))[:1] == b"M"
    assert encode_event(SetWeights(Weights.fixed([1, 2, 3])))[:1] == b"W"
    floor, commits = committed_position(state)
    restore = Restore(floor, commits, "c", "", mixture_position(state))
    assert encode_event(restore)[:1] == b"A" and decode_event(encode_event(restore)) == restore
    assert unpack(encode_snapshot(state))[0]["version"] == SNAPSHOT_VERSION_MIXTURE == 7
    plain = MasterState()
    apply(plain, SetDataset(ds(9)))
    assert unpack(encode_snapshot(plain))[0]["version"] == 6
    assert encode_event(SetDataset(ds(9)))[:1] == b"T"


def test_a_restore_with_committed_ranges_has_a_tag_older_builds_refuse() -> None:
    """A restore that carries ranges committed beyond tasks' prefixes is tagged "Y" (a
    mixture's too): an older build refuses it rather than replay it without them, which would
    deliver those records again. One without ranges is written as before."""
    from chunkmaster.core.events import MixturePosition, Restore
    from chunkmaster.core.mixture import Weights

    ranges = ((0, 2, 3, 5), (1, 0, 1, 2))
    for ev in (
        Restore(0, ((0, 1, 4),), "c", "k", None, 1, "ab", ranges),
        Restore(0, (), "c", "", MixturePosition((), Weights.fixed([1, 2])), -1, "", ranges),
    ):
        data = encode_event(ev)
        assert data[:1] == b"Y" and decode_event(data) == ev
    old = Restore(0, ((0, 1, 4),), "c", "k", None, 1)
    assert encode_event(old) == b'B[0,[[0,1,4]],"c","k",1]'
    assert decode_event(encode_event(old)).ranges == ()


def test_a_mixtures_per_source_ledger_is_kept_and_an_older_snapshot_has_none() -> None:
    """Each pass's per-source counts are in the mixture's section of the snapshot, no new
    version: a snapshot written before them (no such key) loads with none, the rest alike."""
    from chunkmaster.core.codec import pack, unpack

    state = MasterState()
    apply(state, SetDataset(mixed()))
    for _ in range(3):
        task = apply(state, Dispatch(1.0))
        assert isinstance(task, Task)
        apply(state, Finish(task.meta.id, task.meta.epoch, 0))
    led = state.ledger[0]
    assert led.consumed > 0 and sum(c.consumed for c in led.sources.values()) == led.consumed
    back = decode_snapshot(encode_snapshot(state))
    assert back.ledger == state.ledger
    header, blobs = unpack(encode_snapshot(state))
    assert header["version"] == 7
    del header["mixture"]["ledger"]
    old = decode_snapshot(pack(header, blobs))
    assert old.ledger[0].sources == {} and old.ledger[0].consumed == led.consumed
    old.ledger[0].sources = led.sources
    assert comparable(old) == comparable(state)


def held(s: MasterState, x: int) -> tuple[Position, ...]:
    """Positions x records into every pending task (capped by the core)."""
    return tuple(Position(t, p.epoch, s.cur_pass, x) for t, p in s.pending.items())


def test_a_lost_session_that_charges_has_a_tag_older_builds_refuse() -> None:
    """A charging EndSession is tagged "L": an older build refuses it instead of replaying it
    without the failure it counts. Entries written before charging existed ("E", whatever
    their reason) replay as they were applied: without a charge."""
    pos = (Position(1, 2, 0, 3),)
    charged = EndSession("s", "trainer lost", pos, True)
    assert encode_event(charged)[:1] == b"L"
    assert decode_event(encode_event(charged)) == charged
    old = b'E["s","trainer lost",[[1,2,0,3]]]'  # as a build before charging wrote it
    assert encode_event(EndSession("s", "trainer lost", pos)) == old
    assert decode_event(old) == EndSession("s", "trainer lost", pos, False)


def test_a_lost_trainers_charge_replays_and_loads_to_the_same_quarantine() -> None:
    live, journal = MasterState(failure_max=1), []

    def do(ev: object) -> None:
        journal.append(encode_event(ev))  # type: ignore[arg-type]
        apply(live, ev)  # type: ignore[arg-type]

    do(Configure(1, FailedPolicy.KEEP))
    do(SetDataset(ds(9)))
    for n in range(2):  # two trainers die reading task 0: over the limit of 1
        do(OpenSession(f"s{n}", f"t{n}", "h", n))
        do(Dispatch(1000.0, "w", f"r{n}a", f"s{n}"))
        do(Dispatch(1000.0, "w", f"r{n}b", f"s{n}"))
        do(EndSession(f"s{n}", "trainer lost", (), True))
    assert live.failed == [0] and 1 in live.todo and 1 not in live.num_failures
    assert [f.reason.startswith("trainer lost while reading it") for f in live.failure_log[0]] == [
        True,
        True,
    ]
    replayed = MasterState()
    for data in journal:
        apply(replayed, decode_event(data))
    assert comparable(replayed) == comparable(live)
    assert comparable(decode_snapshot(encode_snapshot(live))) == comparable(live)


def test_a_snapshot_of_an_older_version_loads_with_no_identities() -> None:
    """Versions 2 to 4 knew no identities and no dispatches taken back: they load with none
    (every session resumable by any certificate, as before); an older build refuses 5."""
    from chunkmaster.core.codec import SNAPSHOT_VERSION, pack, unpack

    live = MasterState()
    apply(live, SetDataset(ds(9)))
    apply(live, OpenSession("s1", "t", "h", 1, 0, "CN=trainer-a"))
    apply(live, Dispatch(1000.0, "w", "r", "s1"))
    apply(live, Dispatch(1000.0, "w", "", "", "CN=trainer-b"))
    apply(live, EndSession("s1", "trainer lost"))
    header, blobs = unpack(encode_snapshot(live))
    assert header["version"] == SNAPSHOT_VERSION == 6
    assert header["taken"] and header["sessions"] == []
    old = dict(header, version=3, pending=[p[:7] for p in header["pending"]])
    del old["taken"], old["finishers"]
    back = decode_snapshot(pack(old, blobs))
    assert [p.owner for p in back.pending.values()] == [""] and back.taken == {}
    assert decode_snapshot(encode_snapshot(live)).pending[1].owner == "CN=trainer-b"


def test_progress_deadlines_replay_load_and_older_entries_have_none() -> None:
    """A session's progress deadline is state: a Progress that moved it replays and loads to
    the same deadline; it has a tag an older build refuses ("G"), while a Progress without one
    is written as before ("P"). A version 5 snapshot loads with no deadlines (its tasks keep
    their dispatch's)."""
    from chunkmaster.core.codec import pack, unpack
    from chunkmaster.core.state import task_deadline

    live, journal = MasterState(), []

    def do(ev: object) -> None:
        journal.append(encode_event(ev))  # type: ignore[arg-type]
        apply(live, ev)  # type: ignore[arg-type]

    do(SetDataset(ds(9)))
    do(OpenSession("s1", "t", "h", 1))
    do(Dispatch(1000.0, "w", "r1", "s1"))
    do(Dispatch(1000.0, "w", "r2", "s1"))
    do(Dispatch(1000.0, "w", "r3"))  # a trainer without a session: a fixed deadline
    do(Progress((Position(0, 1, 0, 1),), 1500.0))
    do(Progress((Position(0, 1, 0, 1),), 1900.0))  # no record gained: no progress
    assert journal[-1][:1] == b"G" and encode_event(Progress(()))[:1] == b"P"
    assert [task_deadline(live, t) for t in (0, 1, 2)] == [1500.0, 1500.0, 1000.0]
    replayed = MasterState()
    for data in journal:
        apply(replayed, decode_event(data))
    loaded = decode_snapshot(encode_snapshot(live))
    for st_ in (replayed, loaded):
        assert comparable(st_) == comparable(live)
        assert [task_deadline(st_, t) for t in (0, 1, 2)] == [1500.0, 1500.0, 1000.0]
    header, blobs = unpack(encode_snapshot(live))
    old = dict(header, version=5, sessions=[s[:9] for s in header["sessions"]])
    assert decode_snapshot(pack(old, blobs)).sessions["s1"].deadline == 0.0


def test_empty_state_snapshot() -> None:
    s = decode_snapshot(encode_snapshot(MasterState()))
    assert s.dataset is None and not s.ready


@pytest.mark.parametrize(
    "data", [b"", b"Z[]", b"D[1", b"F[1,2]", b"T" + b"XXXX", b"Tnot a container"]
)
def test_corrupt_entries_raise_codec_error(data: bytes) -> None:
    with pytest.raises(CodecError):
        decode_event(data)


def test_corrupt_snapshot_raises_codec_error() -> None:
    good = encode_snapshot(MasterState())
    for bad in (good[:-1] + b"", good[:10], b"CMB1" + good[4:] + b"x"):
        with pytest.raises(CodecError):
            decode_snapshot(bad)


def test_dataset_entry_is_compact() -> None:
    """A million chunks cost 16 bytes each in the journal, not a JSON object each."""
    n = 1_000_000
    big = Dataset(
        "g", ("f",), array("I", bytes(4 * n)), array("Q", bytes(8 * n)), array("I", bytes(4 * n)), 1
    )
    data = encode_event(SetDataset(big))
    assert len(data) < 16 * n + 1000
    back = decode_event(data)
    assert isinstance(back, SetDataset) and back.dataset.num_chunks == n


def test_bytes_per_operation_do_not_grow_with_the_dataset() -> None:
    """The original rewrote its whole state per operation; a journal entry is O(1)."""
    sizes = []
    for n in (10, 1_000_000):
        st = MasterState()
        apply(st, SetDataset(Dataset.build(["g"], ["f"], [(list(range(n)), [1] * n)], 1)))
        task = apply(st, Dispatch(1e9, "worker-1"))
        assert not isinstance(task, bool) and task is not None
        entries = [Dispatch(1e9, "worker-1"), Finish(task.meta.id, task.meta.epoch, 0)]
        sizes.append([len(encode_event(e)) for e in entries])
    assert sizes[0] == sizes[1] and max(sizes[0]) < 64


def test_a_datasets_chunk_size_is_kept_and_an_older_entry_has_none() -> None:
    """The bound the master cut a dataset's chunks at survives the journal and a snapshot
    (a data checkpoint's fingerprint needs it); an entry written before it reads as None."""
    cut = Dataset.build(
        ["/d/*.jsonl"], ["/d/a.jsonl"], [([0, 90], [3, 2])], 1, fmt="jsonl", chunk_size=96
    )
    back = decode_event(encode_event(SetDataset(cut)))
    assert isinstance(back, SetDataset) and back.dataset.chunk_size == 96
    state = MasterState()
    apply(state, SetDataset(cut))
    loaded = decode_snapshot(encode_snapshot(state)).dataset
    assert loaded is not None and loaded.chunk_size == 96 and loaded.format == "jsonl"
    older = Dataset.build(["/d/*.rio"], ["/d/a.rio"], [([0], [3])], 1)
    data = encode_event(SetDataset(older))
    assert b"chunk_size" not in data
    back = decode_event(data)
    assert isinstance(back, SetDataset) and back.dataset.chunk_size is None


def test_an_added_source_has_a_tag_and_its_snapshot_a_version_older_builds_refuse() -> None:
    """Sources added to a running mixture ("N": the added sources' dataset, with its formats
    and sizes, and the weights) read back as written; the grown mixture's snapshot is version
    8 (its passes are fewer units than its sources' tasks, which an older build would take for
    a damaged job) and loads to the same state, plans included; one without an added source
    stays version 7."""
    from helpers.state_dump import dump

    from chunkmaster.core.codec import SNAPSHOT_VERSION_GROWN, unpack
    from chunkmaster.core.events import AddSources
    from chunkmaster.core.mixture import Weights

    state = MasterState()
    apply(state, SetDataset(mixed()))
    lines = Dataset.build(["/l/*.txt"], ["/l/a.txt"], [([0, 7], [2, 3])], 1, fmt="text")
    added = Dataset.mix([("lines", lines, 2.0)])
    ev = AddSources(added, Weights.fixed([1, 1, 1, 2]))
    data = encode_event(ev)
    back = decode_event(data)
    assert data[:1] == b"N" and isinstance(back, AddSources) and back.weights == ev.weights
    assert back.dataset.sources == added.sources and back.dataset.files == added.files
    assert list(back.dataset.chunk_records) == [2, 3]
    assert apply(state, back) == 0
    assert state.dataset is not None and state.dataset.task_format(7) == "text"
    header = unpack(encode_snapshot(state))[0]
    assert header["version"] == SNAPSHOT_VERSION_GROWN == 8
    loaded = decode_snapshot(encode_snapshot(state))
    assert dump(loaded) == dump(state)
    assert state.mix is not None and loaded.mix is not None
    assert list(loaded.mix.plan(0)) == list(state.mix.plan(0))


def test_a_newer_snapshot_is_refused_naming_its_version_and_those_read() -> None:
    """A snapshot a newer build wrote is refused in one line that names its version and the
    versions this build reads (docs/deploy.md, Upgrades)."""
    header, blobs = unpack(encode_snapshot(MasterState()))
    newer = max(READABLE_VERSIONS) + 1
    with pytest.raises(CodecError) as err:
        decode_snapshot(pack(dict(header, version=newer), blobs))
    text = str(err.value)
    assert "\n" not in text
    assert f"snapshot version {newer} was written by a newer chunkmaster" in text
    assert f"reads snapshot versions 2 to {max(READABLE_VERSIONS)}" in text
    with pytest.raises(CodecError, match=r"snapshot version 1 is not supported \(this"):
        decode_snapshot(pack(dict(header, version=1), blobs))


def test_an_entry_of_an_unknown_kind_is_refused_as_a_newer_chunkmaster_s() -> None:
    with pytest.raises(CodecError) as err:
        decode_event(b"\x01" + bytes(range(40)))  # a binary body: refused by its tag alone
    assert "of a kind this chunkmaster does not know (tag b'\\x01'" in str(err.value)
    assert "written by a newer chunkmaster" in str(err.value)
