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
    set_with,
    unit_records,
)
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.events import AddSources, Commit, Dispatch, Finish, SetDataset, SetWeights
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


def extra(n: int = 5) -> Dataset:
    """A source "extra" to add to a mixture (as a mixture of it alone)."""
    return Dataset.mix([("extra", source("extra", n), 1.0)])


def checkpoint_of(
    ds: Dataset, units: int = 50, add: Dataset | None = None
) -> tuple[DataCheckpoint, MasterState]:
    """A job that handed out, finished and committed `units` units and changed its weights
    (and had the sources `add` added, at its 30th unit)."""
    st = MasterState()
    apply(st, SetDataset(ds))
    for i in range(units):
        if i == 20:
            apply(st, SetWeights(Weights.fixed([1, 1, 2])))
        if i == 30 and add is not None:
            apply(st, AddSources(add, Weights.fixed([1, 1, 2, 3])))
        task = apply(st, Dispatch(1.0))
        assert task is not None and not isinstance(task, bool | int)
        apply(st, Finish(task.meta.id, task.meta.epoch, task.pass_id))
        if i % 7:
            apply(st, Commit((Position(task.meta.id, task.meta.epoch, task.pass_id, 5),)))
    floor, commits = committed_position(st)
    position = mixture_position(st)
    assert position is not None and st.dataset is not None
    ds = st.dataset
    by_pass: dict[int, tuple[set[int], dict[int, int]]] = {}
    for p, t, _ in commits:  # every task is one chunk of 5 records: committed whole
        by_pass.setdefault(p, (set(), {}))[0].add(t)
    return (
        DataCheckpoint(
            "job",
            1.0,
            fingerprint(ds),
            st.num_tasks,
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
    # each finite, their sum not: the planner could not use them (a checkpoint is held to what
    # the planner can use, not to set_weights' bounds: an older build's weights are still read)
    damaged({"weights": ["step", [[0, 1e308, 1e308, 1e308]]]}, "add up to more than a float")
    replans = json.loads(json.dumps(head["mixture"]["passes"]))
    replans[0][1][2] = [[1, ["step", [[0, 1, -1, 1]]]]]
    damaged({"passes": replans}, "source 'code' has weight -1")
    names = json.loads(json.dumps(head["mixture"]["sources"]))
    names[1][0] = "co\u202ede"
    damaged({"sources": names}, "source 1: source name", "U+202E", "at character 3")
    damaged({"sources": head["mixture"]["sources"][:2]}, "sources hold 4 files")
    bad_cursor = json.loads(json.dumps(head["mixture"]["passes"]))
    bad_cursor[0][1][0][1] = [0, 99, 0, 0.0]  # code has 10 tasks: no next task 99
    damaged({"passes": bad_cursor}, "cursor out of range")
    damaged({"passes": []}, "plans are of passes []")
    refused(seal(head, sections, version=1), "version 1 and the mixture disagree")
    del head["mixture"]
    refused(seal(head, sections, version=VERSION_MIXTURE), "version 3 and the mixture disagree")


def test_a_checkpoint_restores_onto_the_job_with_sources_added_since() -> None:
    """A checkpoint of web, code and books restores onto the job that had "extra" added since
    (its passes as many units as the checkpoint's): the units its commits name are the same
    tasks. Refused, naming it: a job whose passes are other units (a fresh job set with the
    four sources), a job lacking one of the checkpoint's sources, the sources in another
    order."""
    three = mixture(web=0.7, code=0.2, books=0.1)
    cp, _ = checkpoint_of(three)
    four = three.grown(extra())
    assert check_restorable(cp, four, units=cp.num_tasks) == unit_records(cp, three)
    with pytest.raises(CheckpointError, match=r"passes are 55 units and this job's 61.*--add"):
        check_restorable(cp, four)
    cp4, _ = checkpoint_of(three, add=extra())
    with pytest.raises(
        CheckpointError,
        match=r"source\(s\) 'extra' of the data checkpoint are not in this master's mixture",
    ):
        check_restorable(cp4, three)
    first = Dataset.mix([("extra", source("extra", 5), 1.0)]).grown(three)
    with pytest.raises(CheckpointError, match="sources changed"):
        check_restorable(cp, first, units=cp.num_tasks)


def test_a_grown_mixtures_checkpoint_round_trips_and_refuses_a_changed_added_source() -> None:
    """A checkpoint of a job that had a source added: its units are the tasks of the sources
    it was set with (`set_with`), it round-trips, restores onto the same four sources, and
    refuses the added source's files changed, naming the source and the file."""
    three = mixture(web=0.7, code=0.2, books=0.1)
    cp, st = checkpoint_of(three, units=80, add=extra())
    assert st.dataset is not None and cp.num_tasks == three.num_tasks < st.dataset.num_tasks
    back = decode(encode(cp))
    assert back == cp and set_with(back) == 3
    records = check_restorable(back, st.dataset, units=cp.num_tasks)
    assert st.mix is not None
    for p, got in records.items():
        assert got == [st.dataset.task_records[t] for t in st.mix.plan(p)][: len(got)]
    changed = three.grown(extra(6))
    with pytest.raises(CheckpointError, match="source 'extra': /extra/a: chunk count changed"):
        check_restorable(back, changed, units=cp.num_tasks)
    lying = DataCheckpoint(**{**cp.__dict__, "num_tasks": cp.num_tasks + 1})
    with pytest.raises(CheckpointError, match="is not the tasks of the mixture's first sources"):
        encode(lying)
