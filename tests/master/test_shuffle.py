"""The seeded shuffle: the keyed bijection itself, and a seeded state machine whose order and
tasks depend on the seed and the pass only (replays, snapshots and restores give the same)."""

from __future__ import annotations

import random
from collections import Counter
from itertools import pairwise

import hypothesis.strategies as st
import pytest
from helpers.datasets import chunk_dataset
from hypothesis import given, settings

from chunkmaster.core import checkpoint
from chunkmaster.core.codec import decode_event, decode_snapshot, encode_event, encode_snapshot
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.events import (
    Commit,
    Dispatch,
    EndSession,
    Event,
    Fail,
    Finish,
    OpenSession,
    Restore,
    SetDataset,
)
from chunkmaster.core.model import RETURNED_REASON, Position
from chunkmaster.core.shuffle import CHUNKS, TASKS, Permutation, pass_queue
from chunkmaster.core.state import MasterState, apply, committed_position

SIZES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 13, 16, 17, 31, 97, 100, 101, 255, 256, 1000, 1009, 4096]


@pytest.mark.parametrize("n", SIZES)
def test_is_a_permutation_of_range_n(n: int) -> None:
    for seed in (0, 1, 2**64 - 1):
        for pass_id in (0, 1, 7):
            perm = Permutation(n, seed, pass_id, CHUNKS)
            assert sorted(perm) == list(range(n))


@given(st.integers(0, 3000), st.integers(0, 2**64 - 1), st.integers(0, 10**6))
@settings(max_examples=60, deadline=None)
def test_is_a_permutation_for_any_n_seed_and_pass(n: int, seed: int, pass_id: int) -> None:
    assert sorted(Permutation(n, seed, pass_id, TASKS)) == list(range(n))


def test_is_deterministic_and_elementwise() -> None:
    a, b = Permutation(1000, 42, 3, CHUNKS), Permutation(1000, 42, 3, CHUNKS)
    assert list(a) == list(b)
    assert [a(i) for i in (999, 0, 500)] == [list(b)[i] for i in (999, 0, 500)]
    assert list(Permutation(5, 42, 3, CHUNKS)) == [3, 4, 2, 0, 1]  # pinned: any build, any run


def test_seeds_passes_and_domains_differ() -> None:
    base = list(Permutation(1000, 42, 3, CHUNKS))
    assert base != list(range(1000))
    assert base != list(Permutation(1000, 43, 3, CHUNKS))
    assert base != list(Permutation(1000, 42, 4, CHUNKS))
    assert base != list(Permutation(1000, 42, 3, TASKS))
    orders = {tuple(Permutation(50, 9, p, TASKS)) for p in range(20)}
    assert len(orders) == 20


def test_out_of_range_indexes_are_refused() -> None:
    perm = Permutation(10, 1, 0, TASKS)
    for i in (-1, 10):
        with pytest.raises(IndexError):
            perm(i)


def test_positions_are_spread_evenly() -> None:
    """Where index 0 lands, over many seeds, is close to uniform (a shuffle, not a rotation)."""
    n, seeds = 10, 5000
    landed = Counter(Permutation(n, s, 0, CHUNKS)(0) for s in range(seeds))
    assert len(landed) == n
    assert max(landed.values()) < 1.3 * seeds / n and min(landed.values()) > 0.7 * seeds / n


def test_pass_queue_orders_members_by_the_pass_permutation() -> None:
    assert pass_queue(None, 3, 5, [4, 2, 0]) == type(pass_queue(None, 3, 5))([4, 2, 0])
    full = list(pass_queue(7, 3, 20))
    assert full == list(Permutation(20, 7, 3, TASKS))
    assert list(pass_queue(7, 3, 20, [19, 0, 5, 11])) == [t for t in full if t in {19, 0, 5, 11}]


# --- a seeded state ---------------------------------------------------------------------------


def dataset(num_chunks: int, cpt: int, seed: int | None) -> Dataset:
    rng = random.Random(num_chunks)
    return chunk_dataset([rng.randrange(1, 9) for _ in range(num_chunks)], cpt).with_shuffle(seed)


def run_pass(state: MasterState, events: list[Event]) -> list[tuple[int, tuple[int, ...]]]:
    """Dispatch and finish every task of a pass; (task, chunk offsets) in dispatch order."""
    seen = []
    pass_id = state.cur_pass
    while state.cur_pass == pass_id and state.todo:
        ev: Event = Dispatch(1e9)
        task = apply(state, ev)
        events.append(ev)
        assert not isinstance(task, (bool, int)) and task is not None
        seen.append((task.meta.id, tuple(c.offset for c in task.chunks)))
        fin = Finish(task.meta.id, task.meta.epoch, pass_id)
        apply(state, fin)
        events.append(fin)
    return seen


def test_without_a_seed_every_pass_is_todays() -> None:
    state = MasterState()
    apply(state, SetDataset(dataset(23, 3, None)))
    for _ in range(3):
        seen = run_pass(state, [])
        assert seen == [(k, tuple(range(3 * k, min(3 * k + 3, 23)))) for k in range(8)]


def test_each_pass_has_its_own_order_and_tasks_covering_every_chunk_once() -> None:
    state = MasterState()
    ds = dataset(23, 3, 11)
    apply(state, SetDataset(ds))
    passes = []
    for p in range(4):
        seen = run_pass(state, [])
        assert sorted(t for t, _ in seen) == list(range(8))
        assert sorted(o for _, offs in seen for o in offs) == list(range(23))
        records = {t: sum(ds.chunk_records[o] for o in offs) for t, offs in seen}
        assert records == {t: ds.task_records_for(p)[t] for t in range(8)}
        passes.append(seen)
    for a, b in pairwise(passes):
        assert [t for t, _ in a] != [t for t, _ in b]
        assert dict(a) != dict(b)


def test_another_seed_gives_other_passes() -> None:
    def first_pass(seed: int) -> list[tuple[int, tuple[int, ...]]]:
        state = MasterState()
        apply(state, SetDataset(dataset(40, 2, seed)))
        return run_pass(state, [])

    assert first_pass(5) == first_pass(5)
    assert first_pass(5) != first_pass(6)


@given(st.integers(0, 2**64 - 1), st.lists(st.integers(0, 5), min_size=5, max_size=80))
@settings(max_examples=40, deadline=None)
def test_replays_and_snapshots_reproduce_the_order(seed: int, script: list[int]) -> None:
    """Random dispatches, finishes, failures and returns; a replay of the journal (through the
    codec) and a snapshot taken at any point give the same queues and the same tasks."""
    state = MasterState()
    journal: list[bytes] = []

    def do(ev: Event) -> object:
        journal.append(encode_event(ev))
        return apply(state, ev)

    do(SetDataset(dataset(17, 2, seed)))
    do(OpenSession("s", "t", "h", 1))
    mid: bytes | None = None
    for i, op in enumerate(script):
        if i == len(script) // 2:
            mid = encode_snapshot(state)
            mid_len = len(journal)
        pending = sorted(state.pending)
        if op <= 2 and state.todo:
            do(Dispatch(1e9, session="s"))
        elif op == 3 and pending:
            t = pending[0]
            do(Finish(t, state.pending[t].epoch, state.cur_pass))
        elif op == 4 and pending:
            t = pending[-1]
            do(Fail(t, state.pending[t].epoch, "bad"))
        elif op == 5 and pending:
            do(EndSession("s", RETURNED_REASON))
            do(OpenSession("s", "t", "h", 1))

    def same(other: MasterState) -> None:
        assert other.cur_pass == state.cur_pass
        assert list(other.todo) == list(state.todo)
        assert list(other.done) == list(state.done)
        assert sorted(other.pending) == sorted(state.pending)
        for t in range(state.num_tasks):
            assert other.task(t).chunks == state.task(t).chunks

    replayed = MasterState()
    for data in journal:
        apply(replayed, decode_event(data))
    same(replayed)
    assert mid is not None
    resumed = decode_snapshot(mid)
    assert resumed.dataset is not None and resumed.dataset.shuffle_seed == seed
    for data in journal[mid_len:]:
        apply(resumed, decode_event(data))
    same(resumed)


def test_commits_of_an_older_pass_count_against_that_pass_layout() -> None:
    state = MasterState()
    ds = dataset(30, 3, 99)
    apply(state, SetDataset(ds))
    first = run_pass(state, [])
    assert state.cur_pass == 1 and state.commit_floor == 0
    totals0 = [ds.task_records_for(0)[t] for t in range(10)]
    totals1 = [ds.task_records_for(1)[t] for t in range(10)]
    assert totals0 != totals1
    for t, _ in first:
        too_many = Commit((Position(t, 1, 0, totals0[t] + 1),))
        assert apply(state, too_many) == 0
        assert apply(state, Commit((Position(t, 1, 0, totals0[t]),))) == 1
    assert state.commit_floor == 1  # every task of pass 0 wholly committed, by pass 0's counts


def test_a_restore_starts_the_pass_in_its_order_with_its_commits() -> None:
    ds = dataset(30, 3, 5)
    state = MasterState()
    apply(state, SetDataset(ds))
    for t, _ in run_pass(state, []):
        apply(state, Commit((Position(t, 1, 0, ds.task_records_for(0)[t]),)))
    assert state.commit_floor == 1
    order = list(state.todo)
    t0, t1 = order[0], order[1]
    apply(state, Dispatch(1e9))
    apply(state, Dispatch(1e9))
    whole = ds.task_records_for(1)[t0]
    apply(state, Commit((Position(t0, 1 + 1, 1, whole), Position(t1, 2, 1, 1))))
    floor, commits = committed_position(state)
    blob = checkpoint.encode(
        checkpoint.DataCheckpoint(
            "j", 0.0, checkpoint.fingerprint(ds), ds.num_tasks, floor, (), shuffle_seed=5
        )
    )
    assert checkpoint.decode(blob).shuffle_seed == 5
    with pytest.raises(checkpoint.CheckpointError, match="shuffle seed 5 .* has 6"):
        checkpoint.check_restorable(checkpoint.decode(blob), ds.with_shuffle(6))
    restored = MasterState()
    apply(restored, SetDataset(dataset(30, 3, 5)))
    apply(restored, Restore(floor, commits))
    assert restored.cur_pass == 1
    assert t0 in restored.done and restored.progress == {t1: 1}
    assert list(restored.todo) == [t for t in order if t != t0]


def test_the_seed_flag_is_checked() -> None:
    from chunkmaster.master.config import ConfigError, MasterConfig

    assert MasterConfig.from_text({"shuffle_seed": "42"}).shuffle_seed == 42
    assert MasterConfig.from_text({}).shuffle_seed is None
    for bad in ("-1", "x", str(2**64)):
        with pytest.raises(ConfigError) as info:
            MasterConfig.from_text({"shuffle_seed": bad})
        assert info.value.fields == ("shuffle_seed",)


def test_snapshots_and_journal_entries_of_a_seeded_job_refuse_older_readers() -> None:
    from chunkmaster.core.codec import SNAPSHOT_VERSION, unpack

    plain, seeded = MasterState(), MasterState()
    apply(plain, SetDataset(dataset(9, 2, None)))
    apply(seeded, SetDataset(dataset(9, 2, 4)))
    # Every snapshot is version 6 (from 5 on): builds that read 3 but not 4 would drop the seed.
    assert unpack(encode_snapshot(plain))[0]["version"] == SNAPSHOT_VERSION == 6
    assert unpack(encode_snapshot(seeded))[0]["version"] == SNAPSHOT_VERSION
    assert encode_event(SetDataset(dataset(9, 2, None)))[:1] == b"T"
    assert encode_event(SetDataset(dataset(9, 2, 4)))[:1] == b"H"
    ev = decode_event(encode_event(SetDataset(dataset(9, 2, 4))))
    assert isinstance(ev, SetDataset) and ev.dataset.shuffle_seed == 4
