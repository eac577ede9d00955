"""A mixture's data checkpoint (core/checkpoint.py, format version 3): its sources, weights and
plans round-trip; what is damaged or does not match the dataset is refused naming it."""

from __future__ import annotations

import json

import pytest
from test_checkpoint_blob import parts, refused, seal

from chunkmaster.core.checkpoint import (
    VERSION_MIXTURE,
    CheckpointError,
    DataCheckpoint,
    MixtureCheckpoint,
    PassCommits,
    check_restorable,
    decode,
    encode,
    fingerprint,
    mixture_parts,
    unit_records,
)
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.events import Commit, Dispatch, Finish, SetDataset, SetWeights
from chunkmaster.core.mixture import Weights
from chunkmaster.core.model import Position
from chunkmaster.core.state import MasterState, apply, committed_position, mixture_position


def source(name: str, n: int, records: int = 5, fmt: str = "recordio") -> Dataset:
    files = [f"/{name}/a", f"/{name}/b"]
    return Dataset.build(
        [f"/{name}/*"], files, [(list(range(n)), [records] * n), ([0], [records])], 1, fmt=fmt
    )


def mixture(**weights: float) -> Dataset:
    sizes = {"web": 40, "code": 9, "books": 3}
    return Dataset.mix([(n, source(n, sizes[n]), w) for n, w in weights.items()])


def checkpoint_of(ds: Dataset, units: int = 50) -> tuple[DataCheckpoint, MasterState]:
    """A job that handed out, finished and committed `units` units and changed its weights."""
    st = MasterState()
    apply(st, SetDataset(ds))
    for i in range(units):
        if i == 20:
            apply(st, SetWeights(Weights.fixed([1, 1, 2])))
        task = apply(st, Dispatch(1.0))
        assert task is not None and not isinstance(task, bool | int)
        apply(st, Finish(task.meta.id, task.meta.epoch, task.pass_id))
        if i % 7:
            apply(st, Commit((Position(task.meta.id, task.meta.epoch, task.pass_id, 5),)))
    floor, commits = committed_position(st)
    position = mixture_position(st)
    assert position is not None
    by_pass: dict[int, tuple[set[int], dict[int, int]]] = {}
    for p, t, _ in commits:  # every task is one chunk of 5 records: committed whole
        by_pass.setdefault(p, (set(), {}))[0].add(t)
    return (
        DataCheckpoint(
            "job",
            1.0,
            fingerprint(ds),
            ds.num_tasks,
            floor,
            tuple(PassCommits(p, frozenset(f), pr) for p, (f, pr) in sorted(by_pass.items())),
            None,
            MixtureCheckpoint(mixture_parts(ds), position.weights, position.passes),
        ),
        st,
    )


def test_a_mixtures_checkpoint_round_trips_as_version_3_and_plans_the_same_units() -> None:
    ds = mixture(web=0.7, code=0.2, books=0.1)
    cp, st = checkpoint_of(ds)
    blob = encode(cp)
    assert int.from_bytes(blob[8:12], "little") == VERSION_MIXTURE == 3
    back = decode(blob)
    assert back == cp
    assert back.mixture is not None and [s.name for s in back.mixture.sources] == [
        "web",
        "code",
        "books",
    ]
    assert check_restorable(back, ds, ds.file_sizes) == unit_records(back, ds)
    records = unit_records(back, ds)
    assert st.mix is not None
    # The units up to the last one committed: the only ones a commit names.
    (committed,) = back.passes
    assert len(records[0]) == 1 + max(committed.full)
    assert records[0] == [ds.task_records[t] for t in st.mix.plan(0)][: len(records[0])]


def test_a_mixtures_checkpoint_refuses_another_dataset_naming_the_difference() -> None:
    cp, _ = checkpoint_of(mixture(web=0.7, code=0.2, books=0.1))
    other_order = mixture(code=0.2, web=0.7, books=0.1)
    with pytest.raises(CheckpointError, match=r"sources changed: \['web', 'code', 'books'\]"):
        check_restorable(cp, other_order)
    grown = Dataset.mix(
        [
            ("web", source("web", 41), 0.7),
            ("code", source("code", 9), 0.2),
            ("books", source("books", 3), 0.1),
        ]
    )
    with pytest.raises(
        CheckpointError, match="source 'web': /web/a: chunk count changed: 40 -> 41"
    ):
        check_restorable(cp, grown)
    plain = source("web", 40)
    with pytest.raises(CheckpointError, match="is of a mixture of"):
        check_restorable(cp, plain)
    plain_cp = DataCheckpoint("job", 1.0, fingerprint(plain), plain.num_tasks, 0, ())
    with pytest.raises(CheckpointError, match="is of one dataset, this master's is a mixture"):
        check_restorable(plain_cp, mixture(web=0.7, code=0.2, books=0.1))


def test_a_damaged_mixture_section_is_refused_naming_the_field() -> None:
    cp, _ = checkpoint_of(mixture(web=0.7, code=0.2, books=0.1))
    head, sections = parts(encode(cp))

    def damaged(change: dict[str, object], *words: str) -> None:
        bad = json.loads(json.dumps(head))
        bad["mixture"].update(change)
        refused(seal(bad, sections, version=VERSION_MIXTURE), *words)

    damaged({"weights": ["step", [[0, 0, 0, 0]]]}, "mixture", "all zero")
    damaged({"weights": ["cubic", [[0, 1, 1, 1]]]}, "neither step nor linear")
    damaged({"sources": head["mixture"]["sources"][:2]}, "sources hold 4 files")
    bad_cursor = json.loads(json.dumps(head["mixture"]["passes"]))
    bad_cursor[0][1][0][1] = [0, 99, 0, 0.0]  # code has 10 tasks: no next task 99
    damaged({"passes": bad_cursor}, "cursor out of range")
    damaged({"passes": []}, "plans are of passes []")
    refused(seal(head, sections, version=1), "version 1 and the mixture disagree")
    del head["mixture"]
    refused(seal(head, sections, version=VERSION_MIXTURE), "version 3 and the mixture disagree")
