"""The job's shuffle window on the master: a property of the job like its seed. It is checked
as a setting, journaled with the dataset (a tag and a snapshot version older builds refuse),
kept in data checkpoints (a format version of its own), and a master or a restore with another
window is refused naming both."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.datasets import chunk_dataset

from chunkmaster.cli.status_cmd import render
from chunkmaster.core import checkpoint
from chunkmaster.core.codec import (
    SNAPSHOT_VERSION,
    SNAPSHOT_VERSION_MIXTURE,
    SNAPSHOT_VERSION_WINDOWED,
    CodecError,
    decode_event,
    decode_snapshot,
    encode_event,
    encode_snapshot,
    pack,
    unpack,
)
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.events import SetDataset
from chunkmaster.core.reconcile import Limits, reconcile
from chunkmaster.core.shuffle import MAX_WINDOW, ShuffleSeedError, ShuffleWindowError
from chunkmaster.core.state import MasterState, apply
from chunkmaster.master.config import ConfigError, MasterConfig
from chunkmaster.master.settings import SettingError, Settings


def dataset(seed: int | None = 5, window: int = 0) -> Dataset:
    return chunk_dataset([3, 1, 4, 1, 5, 9, 2, 6, 5], 2).with_shuffle(seed, window)


def mixed(seed: int | None = 5, window: int = 0) -> Dataset:
    a = Dataset.build(["/a/*"], ["/a/x"], [([0, 1, 2], [3, 1, 4])], 1)
    b = Dataset.build(["/b/*"], ["/b/y"], [([0, 9], [5, 5])], 1, fmt="jsonl")
    return Dataset.mix([("a", a, 0.5), ("b", b, 0.5)]).with_shuffle(seed, window)


def state_of(ds: Dataset) -> MasterState:
    st = MasterState()
    apply(st, SetDataset(ds, "job-1"))
    return st


# --- settings ------------------------------------------------------------------------------------


def test_the_window_is_a_number_of_records_from_0_to_the_bound_and_needs_a_seed() -> None:
    assert Settings().shuffle_window == 0 and Settings().limits.shuffle_window == 0
    assert Settings(shuffle_seed=1, shuffle_window=MAX_WINDOW).limits.shuffle_window == MAX_WINDOW
    for bad in (-1, MAX_WINDOW + 1):
        with pytest.raises(SettingError) as info:
            Settings(shuffle_seed=1, shuffle_window=bad)
        assert info.value.name == "shuffle_window" and "10,000,000" in str(info.value)
        assert "in memory" in str(info.value)
    with pytest.raises(SettingError, match="needs --shuffle-seed") as info:
        Settings(shuffle_window=100)
    assert info.value.name == "shuffle_window"


def test_the_window_flag_is_checked_naming_it() -> None:
    config = MasterConfig.from_text({"shuffle_seed": "3", "shuffle_window": "4096"})
    assert config.shuffle_window == config.settings().shuffle_window == 4096
    assert MasterConfig.from_text({"shuffle_window": ""}).shuffle_window == 0
    assert MasterConfig.from_text({}).shuffle_window == 0
    for bad in ("-1", "x", "1.5", str(MAX_WINDOW + 1)):
        with pytest.raises(ConfigError) as info:
            MasterConfig.from_text({"shuffle_seed": "3", "shuffle_window": bad})
        assert info.value.fields == ("shuffle_window",), bad
    with pytest.raises(ConfigError, match="needs --shuffle-seed") as info:
        MasterConfig.from_text({"shuffle_window": "64"})
    assert info.value.fields == ("shuffle_window",)


def test_the_window_flag_and_its_variable_reach_the_config() -> None:
    import argparse

    from chunkmaster.cli.common import CliError
    from chunkmaster.cli.master_cmd import config_from, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["master", "--shuffle-seed", "2", "--shuffle-window", "8"])
    assert config_from(args, {})[0].shuffle_window == 8
    bare = parser.parse_args(["master", "--shuffle-seed", "2"])
    assert config_from(bare, {"CHUNKMASTER_SHUFFLE_WINDOW": "16"})[0].shuffle_window == 16
    with pytest.raises(CliError, match="^CHUNKMASTER_SHUFFLE_WINDOW: needs --shuffle-seed"):
        config_from(parser.parse_args(["master"]), {"CHUNKMASTER_SHUFFLE_WINDOW": "16"})
    with pytest.raises(CliError, match="^--shuffle-window: .*0 \\(off\\) to 10,000,000"):
        config_from(parser.parse_args(["master", "--shuffle-window", "-3"]), {})


# --- the journal and the snapshots ---------------------------------------------------------------


def test_a_windowed_dataset_entry_has_a_tag_of_its_own_and_reads_back() -> None:
    for ds in (dataset(window=64), mixed(window=7)):
        data = encode_event(SetDataset(ds, "job-1"))
        assert data[:1] == b"V"  # unknown to older builds: refused, not read as file order
        back = decode_event(data)
        assert isinstance(back, SetDataset) and back.job_id == "job-1"
        assert (back.dataset.shuffle_seed, back.dataset.shuffle_window) == (5, ds.shuffle_window)
        assert back.dataset.sources == ds.sources
    # Without a window, every entry is written as before, and reads back as window 0.
    for ds, tag in ((dataset(None), b"T"), (dataset(), b"H"), (mixed(), b"M")):
        data = encode_event(SetDataset(ds))
        assert data[:1] == tag
        back = decode_event(data)
        assert isinstance(back, SetDataset) and back.dataset.shuffle_window == 0


def _retagged(ds: Dataset, tag: bytes, **header: Any) -> bytes:
    """A dataset entry of `ds` under another tag, its header changed by `header`."""
    head, blobs = unpack(encode_event(SetDataset(ds))[1:])
    return tag + pack({**head, **header}, blobs)


def test_a_dataset_entry_whose_tag_and_window_disagree_is_refused() -> None:
    with pytest.raises(CodecError, match="shuffle window"):
        decode_event(_retagged(dataset(), b"H", window=64))  # a window an old tag hides
    with pytest.raises(CodecError, match="shuffle window"):
        decode_event(_retagged(dataset(), b"V"))  # the new tag without a window
    with pytest.raises(CodecError, match="without a shuffle seed"):
        decode_event(_retagged(dataset(None), b"V", window=64))
    with pytest.raises(CodecError, match="negative"):
        decode_event(_retagged(dataset(), b"H", window=-1))


def test_a_windowed_jobs_snapshot_has_a_version_older_builds_refuse() -> None:
    for ds in (dataset(window=64), mixed(window=7)):
        st = state_of(ds)
        data = encode_snapshot(st)
        header = unpack(data)[0]
        assert header["version"] == SNAPSHOT_VERSION_WINDOWED == 9
        assert header["dataset"]["window"] == ds.shuffle_window
        back = decode_snapshot(data)
        assert back.dataset is not None and back.dataset.shuffle_window == ds.shuffle_window
        assert (back.mix is None) == (st.mix is None)
        assert list(back.todo) == list(st.todo)
    # Without a window: the versions of before, read as window 0.
    for ds, version in ((dataset(), SNAPSHOT_VERSION), (mixed(), SNAPSHOT_VERSION_MIXTURE)):
        data = encode_snapshot(state_of(ds))
        assert unpack(data)[0]["version"] == version and "window" not in unpack(data)[0]["dataset"]
        back = decode_snapshot(data)
        assert back.dataset is not None and back.dataset.shuffle_window == 0


def test_a_snapshot_whose_version_and_window_disagree_is_refused() -> None:
    header, blobs = unpack(encode_snapshot(state_of(dataset(window=64))))
    with pytest.raises(CodecError, match="shuffle window"):
        decode_snapshot(pack({**header, "version": SNAPSHOT_VERSION}, blobs))
    header, blobs = unpack(encode_snapshot(state_of(dataset())))
    with pytest.raises(CodecError, match="shuffle window"):
        decode_snapshot(pack({**header, "version": SNAPSHOT_VERSION_WINDOWED}, blobs))


# --- a master's window against the job's ------------------------------------------------------


def test_a_master_with_another_window_is_refused_naming_both() -> None:
    st = state_of(dataset(window=64))
    assert reconcile(st, Limits(shuffle_seed=5, shuffle_window=64)) == []
    for window, has in ((128, "has 128"), (0, "has 0 (off)")):
        with pytest.raises(ShuffleWindowError) as info:
            reconcile(st, Limits(shuffle_seed=5, shuffle_window=window))
        text = str(info.value)
        assert "started with shuffle window 64" in text and has in text
        assert "Start with --shuffle-window 64" in text
        assert isinstance(info.value, ShuffleSeedError)  # the seed's handlers see it too
    plain = state_of(dataset())
    with pytest.raises(ShuffleWindowError, match="window 0 \\(off\\), this master has 32"):
        reconcile(plain, Limits(shuffle_seed=5, shuffle_window=32))


def test_before_a_dataset_is_set_the_window_can_change() -> None:
    assert reconcile(MasterState(), Limits(shuffle_seed=5, shuffle_window=99)) == []


# --- data checkpoints --------------------------------------------------------------------------


def _checkpoint(ds: Dataset) -> checkpoint.DataCheckpoint:
    return checkpoint.DataCheckpoint(
        "j",
        0.0,
        checkpoint.fingerprint(ds),
        ds.num_tasks,
        0,
        (checkpoint.PassCommits(0, frozenset({1}), {0: 2}),),
        shuffle_seed=ds.shuffle_seed,
        shuffle_window=ds.shuffle_window,
    )


def _version(blob: bytes) -> int:
    return int.from_bytes(blob[8:12], "little")


def test_a_checkpoint_carries_the_window_in_a_version_of_its_own() -> None:
    ds = dataset(window=64)
    blob = checkpoint.encode(_checkpoint(ds))
    assert _version(blob) == checkpoint.VERSION_WINDOWED == 4
    cp = checkpoint.decode(blob)
    assert (cp.shuffle_seed, cp.shuffle_window) == (5, 64)
    checkpoint.check_restorable(cp, ds)
    # Without a window: written in the versions of before, read back as window 0.
    for plain, version in ((dataset(None), checkpoint.VERSION), (dataset(), 2)):
        blob = checkpoint.encode(_checkpoint(plain))
        assert _version(blob) == version and b"shuffle_window" not in blob
        assert checkpoint.decode(blob).shuffle_window == 0


def test_a_restore_onto_another_window_is_refused_naming_both() -> None:
    cp = checkpoint.decode(checkpoint.encode(_checkpoint(dataset(window=64))))
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.check_restorable(cp, dataset(window=32))
    assert "shuffle window 64" in str(info.value) and "has 32" in str(info.value)
    assert "--shuffle-window 64" in str(info.value)
    plain = checkpoint.decode(checkpoint.encode(_checkpoint(dataset())))
    with pytest.raises(checkpoint.CheckpointError, match="window 0 \\(off\\) and .* has 8"):
        checkpoint.check_restorable(plain, dataset(window=8))


def test_a_checkpoint_window_out_of_range_or_without_a_seed_is_refused() -> None:
    good = _checkpoint(dataset(window=64))
    for bad in (
        checkpoint.DataCheckpoint(**{**good.__dict__, "shuffle_window": MAX_WINDOW + 1}),
        checkpoint.DataCheckpoint(**{**good.__dict__, "shuffle_window": -1}),
        checkpoint.DataCheckpoint(**{**good.__dict__, "shuffle_seed": None}),
    ):
        with pytest.raises(checkpoint.CheckpointError, match="shuffle window"):
            checkpoint.encode(bad)


def test_a_checkpoint_whose_version_and_window_disagree_is_refused() -> None:
    blob = checkpoint.encode(_checkpoint(dataset(window=64)))
    forged = blob[:8] + (2).to_bytes(4, "little") + blob[12:]  # the seed's version
    import hashlib

    forged = forged[:-16] + hashlib.blake2b(forged[:-16], digest_size=16).digest()
    with pytest.raises(checkpoint.CheckpointError, match="shuffle window disagree"):
        checkpoint.decode(forged)


def test_checkpoint_show_names_the_window() -> None:
    from chunkmaster.cli.checkpoint_cmd import describe

    info = describe(checkpoint.decode(checkpoint.encode(_checkpoint(dataset(window=64)))))
    assert (info["shuffle_seed"], info["shuffle_window"]) == (5, 64)
    json.dumps(info)


# --- status ------------------------------------------------------------------------------------


def test_the_status_line_names_the_window_when_there_is_one() -> None:
    from chunkmaster.master.status import Status

    assert "shuffle_window" in Status.__dataclass_fields__
    st: dict[str, Any] = {
        "ready": True,
        "dataset": {
            "globs": ["x"],
            "files": 1,
            "chunks": 9,
            "records": 36,
            "chunks_per_task": 2,
        },
        "num_tasks": 5,
        "cur_pass": 0,
        "todo": 5,
        "pending": 0,
        "done": 0,
        "failed": 0,
        "store": {"kind": "memory", "healthy": True},
        "failed_tasks": [],
        "shuffle_seed": 5,
        "shuffle_window": 64,
    }
    assert "shuffle seed 5, shuffle window 64 records" in render(st)
    assert "shuffle window" not in render({**st, "shuffle_window": 0})
    assert "shuffle" not in render({**st, "shuffle_seed": None, "shuffle_window": 0})


# --- the tasks handed out ----------------------------------------------------------------------


def test_a_task_carries_the_jobs_window_and_seed_and_a_piece_all_its_chunks() -> None:
    from chunkmaster.core.events import Dispatch
    from chunkmaster.core.ids import UnitId
    from chunkmaster.core.model import Task
    from chunkmaster.core.steps import Piece

    for ds, expected in (
        (dataset(window=4), (True, 4)),
        (dataset(), (False, 0)),
        (dataset(None), (False, 0)),
    ):
        st = state_of(ds)
        task = apply(st, Dispatch(1e9))
        assert isinstance(task, Task)
        assert (bool(task.order_key), task.shuffle_window) == expected
        # A piece (equal steps) of unit 2 ending at its first record: cut to the chunks it
        # reaches, save with a window, whose windows are cut from all the task's records.
        st.steps.pieces[5] = Piece(0, UnitId(2), 0, 1)
        whole, piece = st.task(2), st.task(5)
        assert piece.end == 1 and len(whole.chunks) == 2
        assert piece.chunks == (whole.chunks if ds.shuffle_window else whole.chunks[:1])
        assert (piece.order_key, piece.shuffle_window) == (whole.order_key, expected[1])


def test_a_task_a_mixture_plans_twice_in_a_pass_is_read_in_two_orders() -> None:
    """Source a is 8 of the 18 records and weighs 0.9: the pass plans its tasks more than
    once. Each time a task comes, it carries another order key (the order is keyed by the
    pass's unit, not by the dataset's task), and each unit keeps one key for all its
    dispatches."""
    from chunkmaster.core.events import Dispatch

    a = Dataset.build(["/a/*"], ["/a/x"], [([0, 1, 2], [3, 1, 4])], 1)
    b = Dataset.build(["/b/*"], ["/b/y"], [([0, 9], [5, 5])], 1, fmt="jsonl")
    st = state_of(Dataset.mix([("a", a, 0.9), ("b", b, 0.1)]).with_shuffle(5, 4))
    keys: dict[int, set[int]] = {}  # the dataset's task -> the order keys it came with
    dispatched = {}
    while st.todo:
        task = apply(st, Dispatch(1e9))
        dispatched[task.meta.id] = task.order_key
        keys.setdefault(int(st.unit_task(task.meta.id)), set()).add(task.order_key)
    assert len(dispatched) > len(keys), "the plan repeats no task: the test proves nothing"
    assert sum(len(k) for k in keys.values()) == len(dispatched)  # a key of its own per unit
    assert all(st.task(u).order_key == key for u, key in dispatched.items())  # and kept
