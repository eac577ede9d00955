"""A mixture of three sources end to end (docs/mixtures.md): real master processes, real
`chunkmaster read` and session trainers, a weight change and a source added over the CLI and
the client, SIGKILLs, restores.

The sources differ in format and size: "web" a RecordIO file of 800 chunks of 20 to 80
records, "code" 200 JSON Lines files of 30 lines, "books" a RecordIO file of 7 chunks of 100.
Every task is one chunk (or file), so the test knows each task's records, and it plans the
passes itself with the core's planner from the master's inputs (the dataset, the seed, the
weights and where a change took effect): what the trainers got per source must be exactly
what the plans hold, and the plans are whole source epochs (tests/master/test_mixture_state.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from helpers.master_process import MasterProcess
from helpers.mixtures import check_ledger_sums, check_source_epochs, windows
from helpers.session_trainer_process import SessionTrainerProcess
from helpers.trainers import Trainer

from chunkmaster.client import Client, Source
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.checkpoint import DataCheckpoint, decode
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.events import AddSources, MixturePosition, Restore, SetDataset, SetWeights
from chunkmaster.core.mixture import Weights
from chunkmaster.core.state import MasterState, apply
from chunkmaster.digest import Digest
from chunkmaster.master.indexing import load_dataset
from chunkmaster.recordio import Writer

SEED = 7
NAMES = ("web", "code", "books")
FIRST = {"web": 0.7, "code": 0.2, "books": 0.1}
LATER = {"web": 0.2, "code": 0.3, "books": 0.5}
#: The weights once the source "extra" is added.
FOURTH = {"web": 0.4, "code": 0.2, "books": 0.1, "extra": 0.3}


class Sources:
    """The three sources on disk, each task's records, and the master's view of them."""

    def __init__(self, d: Path, *, numbered: bool = False) -> None:
        """`numbered`: every record an ASCII integer, unique over the sources (for the session
        trainer, which logs them), and "code" RecordIO too."""
        self.tasks: dict[str, list[list[Any]]] = {}
        self.patterns: dict[str, str] = {}
        base = {"web": 0, "code": 100_000, "books": 200_000}
        sizes = {
            "web": [20 + (c * 7) % 61 for c in range(800)],
            "code": [30] * 200,
            "books": [100] * 7,
        }
        for name in NAMES:
            (d / name).mkdir(parents=True)
            n = base[name]
            tasks = []
            for size in sizes[name]:
                tasks.append(list(range(n, n + size)))
                n += size
            if name == "code" and not numbered:
                for f, ids in enumerate(tasks):
                    lines = "".join(json.dumps({"code": i}) + "\n" for i in ids)
                    (d / name / f"part-{f:03d}.jsonl").write_text(lines)
                self.tasks[name] = [[{"code": i} for i in ids] for ids in tasks]
                self.patterns[name] = str(d / name / "*.jsonl")
                continue
            path = d / name / f"{name}.rio"
            fmt = b"%06d" if numbered else name.encode() + b"-%06d"
            with Writer(str(path), max_chunk_size=1 << 30) as w:
                for ids in tasks:
                    for i in ids:
                        w.write(fmt % i)
                    w.flush()  # one chunk a task
            self.tasks[name] = [[fmt % i for i in ids] for ids in tasks]
            self.patterns[name] = str(path)

    def flags(self, weights: dict[str, float]) -> list[str]:
        return [f for n in NAMES for f in ("--source", f"{n}={self.patterns[n]}@{weights[n]}")]

    def spec(self, weights: dict[str, float]) -> dict[str, Source]:
        return {n: Source(self.patterns[n], weights[n]) for n in NAMES}

    def dataset(self, weights: dict[str, float]) -> Dataset:
        """The dataset as the master indexes it (one chunk a task), seeded as it is."""
        parts = [(n, load_dataset([self.patterns[n]], 1), weights[n]) for n in NAMES]
        return Dataset.mix(parts).with_shuffle(SEED)

    def records(self, ds: Dataset, task: int) -> list[Any]:
        s = ds.source_of(task)
        return self.tasks[NAMES[s]][task - ds.source_tasks(s).start]

    def by_source(self, ds: Dataset, plan: list[int]) -> dict[str, Digest]:
        """Each source's digest of the records of a pass's plan."""
        out = {n: Digest() for n in NAMES}
        for t in plan:
            for r in self.records(ds, t):
                out[NAMES[ds.source_of(t)]].add(r)
        return out


def got_by_source(trainers: list[Trainer], p: int) -> dict[str, Digest]:
    """Each source's digest of pass `p` over what the trainers printed (their `sources`)."""
    out = {n: Digest() for n in NAMES}
    for t in trainers:
        for name, d in t.passes[p].get("sources", {}).items():
            out[name].merge(Digest(int(d["digest"], 16), int(d["records"])))
    return out


def plans(ds: Dataset, passes: int, change: tuple[int, int] | None = None) -> dict[int, list[int]]:
    """The plans the master makes: the first weights, and LATER from (pass, unit) on."""
    state = MasterState()
    apply(state, SetDataset(ds))
    mix = state.mix
    assert mix is not None
    out = {}
    for p in range(passes):
        if p:
            mix.begin(p)
        if change is not None and change[0] == p:
            mix.replan(p, change[1], Weights.fixed([LATER[n] for n in NAMES]), True)
        out[p] = list(mix.plan(p))
    return out


def test_three_sources_follow_their_weights_and_every_source_adds_up(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    """Three trainers read two passes of a 0.7/0.2/0.1 mixture of sources of 40,000, 6,000
    and 700 records: each source's records (added up over the trainers' `sources`) are
    exactly its planned records each pass, and over the records consumed, in the order the
    plan hands them out, every window of 10,000 after the first is within one percentage
    point of the weights."""
    src = Sources(tmp_path / "data")
    m = master_process("--chunk-per-task", "1", "--shuffle-seed", str(SEED))
    args = ["--addr", m.addr, *src.flags(FIRST), "--passes", "2"]
    ts = trainers(3, args)
    for t in ts:
        assert t.drain() == 0, t.log()
    ds = src.dataset(FIRST)
    expected = plans(ds, 2)
    for p in (0, 1):
        assert got_by_source(ts, p) == src.by_source(ds, expected[p]), f"pass {p}"
    lines = sorted(
        (int(line["pass"]), int(line["task"]), line)
        for t in ts
        for p in (0, 1)
        for line in t.tasks[p]
    )
    assert [(p, u) for p, u, _ in lines] == [(p, u) for p in (0, 1) for u in range(ds.num_tasks)]
    consumed = [(NAMES.index(line["source"]), int(line["records"])) for _, _, line in lines]
    shares = windows(consumed, 3)
    assert len(shares) > 1000
    for got in shares:
        for g, want in zip(got, FIRST.values(), strict=True):
            assert abs(g - want) <= 0.01
    with MasterConnection(m.addr) as c:
        st = c.status()
    mix = st["mixture"]
    assert [s["name"] for s in mix["sources"]] == list(NAMES)
    assert [s["consumed"] for s in mix["sources"]] == [
        got_by_source(ts, 0)[n].count + got_by_source(ts, 1)[n].count for n in NAMES
    ]
    check_pass_sources(st, ts, NAMES, (0, 1))


def check_pass_sources(
    st: dict[str, Any], ts: list[Trainer], names: Sequence[str], passes: Sequence[int]
) -> None:
    """The status's ledger of each pass in `passes`, source by source, holds what the
    trainers' `read --json` say they consumed of each source in it; in every pass shown the
    sources' counts add up to the pass's."""
    ledger = {led["pass"]: led for led in st["ledger"]}
    assert set(passes) <= set(ledger), f"passes shown: {sorted(ledger)}"
    check_ledger_sums(st["ledger"])
    for led in st["ledger"]:
        assert list(led["sources"]) == list(names)
    for p in passes:
        sources = ledger[p]["sources"]
        read: Counter[str] = Counter()
        for t in ts:
            for name, d in t.passes[p].get("sources", {}).items():
                read[name] += int(d["records"])
        assert {n: c["consumed"] for n, c in sources.items() if c["consumed"]} == read, p
        assert all(c["dispatched"] >= c["consumed"] for c in sources.values())


def progress(addr: str) -> tuple[int, int]:
    with MasterConnection(addr) as c:
        st = c.status()
    return st["cur_pass"], st["progress"]["records_done"]


def test_a_weight_change_and_a_killed_master_mid_pass_deliver_each_source_epoch_once(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    """Mid-pass 1: new weights over the CLI, then the master SIGKILLed and restarted on its
    store. Passes 0 and 2 add up per source exactly; in pass 1 every unit was completed with
    the records of the task its plan (the first weights up to the change, the new ones after)
    holds; the plans are whole source epochs, and pass 2 follows the new weights."""
    src = Sources(tmp_path / "data")
    m = master_process(
        "--chunk-per-task", "1", "--shuffle-seed", str(SEED), "--task-timeout-dur", "30s"
    )
    args = ["--addr", m.addr, *src.flags(FIRST), "--passes", "3", "--step-time", "0.0002"]
    ts = trainers(3, args)
    deadline = time.monotonic() + 300
    while progress(m.addr) < (1, 8000):
        assert time.monotonic() < deadline, "pass 1 never got going"
        time.sleep(0.05)
    point = ",".join(f"{n}={w}" for n, w in LATER.items())
    out = subprocess.run(
        [sys.executable, "-m", "chunkmaster", "weights", "--addr", m.addr, "--json", point],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    change = json.loads(out.stdout)
    m.restart()  # SIGKILL, then the same port and store
    for t in ts:
        assert t.drain(timeout=300) == 0, t.log()
    ds = src.dataset(FIRST)
    assert change["pass"] == 1 and 0 < change["unit"] < ds.num_tasks
    expected = plans(ds, 3, (1, change["unit"]))
    check_source_epochs(ds, expected)
    for p in (0, 2):
        assert got_by_source(ts, p) == src.by_source(ds, expected[p]), f"pass {p}"
    done: dict[int, dict[str, Any]] = {}
    for t in ts:
        for line in t.tasks[1]:
            done[int(line["task"])] = line  # the last completion of each unit
    assert sorted(done) == list(range(ds.num_tasks))
    for unit, line in done.items():
        task = expected[1][unit]
        records = src.records(ds, task)
        d = Digest()
        for r in records[int(line["start"]) :]:
            d.add(r)
        assert line["source"] == NAMES[ds.source_of(task)]
        assert (int(line["records"]), line["digest"]) == (d.count, d.hex()), f"unit {unit}"
    late = got_by_source(ts, 2)
    total = sum(d.count for d in late.values())
    for n in NAMES:
        assert abs(late[n].count / total - LATER[n]) < 0.02
    with MasterConnection(m.addr) as c:
        # pass 1 (the change and the restart in it) adds up; pass 2 is what the trainers read
        check_pass_sources(c.status(), ts, NAMES, (2,))


class SessionTrainer(SessionTrainerProcess):
    def __init__(self, addr: str, out: Path, *args: str) -> None:
        super().__init__(out, "--addr", addr, *args)


def checkpointed_mid_job(
    tmp_path: Path, src: Sources, flags: list[str], ckpt: Path
) -> DataCheckpoint:
    """Three trainers commit as they read the three-source mixture; the data checkpoint is
    saved to `ckpt` while they do; everything is SIGKILLed. The checkpoint, decoded."""
    first = MasterProcess(["--store", str(tmp_path / "a.db"), *flags]).start()
    try:
        with Client(first.addr) as client:
            client.set_dataset(src.spec(FIRST))
        common = ["--passes", "2", "--commit-every", "23", "--step-time", "0.001"]
        olds = [SessionTrainer(first.addr, tmp_path / f"a{i}.out", *common) for i in range(3)]
        deadline = time.monotonic() + 120
        while not all(t.read() >= 300 for t in olds):
            assert time.monotonic() < deadline, "the trainers never got going"
            time.sleep(0.05)
        save = ["checkpoint", "save", "--addr", first.addr, str(ckpt)]
        out = subprocess.run(
            [sys.executable, "-m", "chunkmaster", *save], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        for t in olds:
            t.kill()
    finally:
        first.kill()
    return decode(ckpt.read_bytes())


def restored(
    ds: Dataset, cp: DataCheckpoint
) -> tuple[MasterState, tuple[tuple[int, int, int], ...]]:
    """The state a master restoring `cp` onto the mixture `ds` holds (as the pure core
    builds it), and the checkpoint's commits as (pass, unit, records; -1: the whole unit)."""
    state = MasterState()
    apply(state, SetDataset(ds))
    commits = tuple(
        (p.pass_id, t, r)
        for p in cp.passes
        for t, r in sorted([(t, -1) for t in p.full] + list(p.partial.items()))
    )
    assert cp.mixture is not None
    position = MixturePosition(cp.mixture.passes, cp.mixture.weights)
    apply(state, Restore(cp.floor, _whole(state, commits, position), "ckpt", "", position))
    return state, commits


def planned_passes(state: MasterState, passes: Sequence[int]) -> dict[int, list[int]]:
    """Each pass's plan (its units' tasks), planning the passes not begun yet as the master
    will."""
    assert state.mix is not None
    out: dict[int, list[int]] = {}
    for p in passes:
        if p not in state.mix.passes:
            state.mix.begin(p)
        out[p] = list(state.mix.plan(p))
    return out


def test_a_whole_job_restored_with_new_weights_delivers_what_was_not_committed_once(
    tmp_path: Path,
) -> None:
    """Trainers commit as they read; the data checkpoint is saved; everything is SIGKILLed. A
    fresh master restores the checkpoint, is given new weights, and fresh trainers read two
    passes: in each, what was committed before plus what is delivered after is exactly the
    records of the pass's plan (as the checkpoint recorded it up to the last commit, the new
    weights after), as many times as planned; the plans are whole source epochs."""
    src = Sources(tmp_path / "data", numbered=True)
    ckpt = tmp_path / "job.ckpt"
    flags = ["--chunk-per-task", "1", "--shuffle-seed", str(SEED)]
    cp = checkpointed_mid_job(tmp_path, src, flags, ckpt)
    assert cp.mixture is not None
    fresh = MasterProcess(
        ["--store", str(tmp_path / "b.db"), *flags, "--restore", str(ckpt)]
    ).start()
    try:
        with Client(fresh.addr) as client:
            change = client.set_weights(LATER)
        common = ["--passes", "2", "--first-pass", str(cp.floor)]
        news = [SessionTrainer(fresh.addr, tmp_path / f"b{i}.out", *common) for i in range(2)]
        for t in news:
            assert t.proc.wait(300) == 0, t.out.with_suffix(".log").read_text()
    finally:
        fresh.kill()

    ds = src.dataset(FIRST)
    state, commits = restored(ds, cp)
    apply(state, SetWeights(Weights.fixed([LATER[n] for n in NAMES])))
    assert state.mix is not None
    expected = planned_passes(state, (cp.floor, cp.floor + 1))
    assert (change.pass_id, change.unit) != (cp.floor, 0) or not cp.passes
    check_source_epochs(ds, expected)
    committed: dict[int, list[int]] = defaultdict(list)
    for p, unit, r in commits:
        records = src.records(ds, expected[p][unit])
        committed[p] += [int(x) for x in records[: None if r < 0 else r]]
    for p in (cp.floor, cp.floor + 1):
        # A small source repeats its epochs within a pass: records come as often as planned.
        got = Counter(r for t in news for r in t.records(p))
        planned = Counter(int(x) for t in expected[p] for x in src.records(ds, t))
        assert got + Counter(committed[p]) == planned, f"pass {p}"


def _whole(
    state: MasterState, commits: tuple[tuple[int, int, int], ...], position: MixturePosition
) -> tuple[tuple[int, int, int], ...]:
    """Commits with a whole unit's records (-1 above) filled in from the recorded plans."""
    assert state.mix is not None and state.dataset is not None
    out = []
    for p, unit, r in commits:
        if r < 0:
            plan = dict(position.passes)[p]
            tasks = state.mix.compute(plan)[0]
            r = state.dataset.task_records[tasks[unit]]
        out.append((p, unit, r))
    return tuple(out)


# ---- a source added to the running job -------------------------------------------------------


class Extra:
    """A fourth source, "extra", on disk: a RecordIO file of 60 chunks of 15 to 25 records (one
    chunk a task), and the master's view of it, added after the three."""

    def __init__(self, d: Path, *, numbered: bool = False) -> None:
        (d / "extra").mkdir(parents=True)
        self.path = str(d / "extra" / "extra.rio")
        fmt = b"%06d" if numbered else b"extra-%06d"
        self.tasks: list[list[bytes]] = []
        n = 300_000
        with Writer(self.path, max_chunk_size=1 << 30) as w:
            for c in range(60):
                ids = range(n, n + 15 + c % 11)
                n += len(ids)
                for i in ids:
                    w.write(fmt % i)
                w.flush()
                self.tasks.append([fmt % i for i in ids])

    def added(self) -> Dataset:
        """The source as the master indexes it to add it (a mixture of it alone)."""
        return Dataset.mix([("extra", load_dataset([self.path], 1), 1.0)]).with_shuffle(SEED)


def source_records(src: Sources, extra: Extra, ds: Dataset, task: int) -> list[Any]:
    """The records of a task of the grown mixture (web, code, books, extra)."""
    s = ds.source_of(task)
    tasks = extra.tasks if ds.sources[s].name == "extra" else src.tasks[ds.sources[s].name]
    return tasks[task - ds.source_tasks(s).start]


def test_a_source_added_and_a_killed_master_mid_pass_deliver_each_source_epoch_once(
    tmp_path: Path, master_process: Any, trainers: Any
) -> None:
    """Mid-pass 1: a fourth source added over the CLI (with weights naming it), then the
    master SIGKILLed and restarted on its store (it replays the add). Passes 0 and 2 add up per
    source exactly, the added one included; in pass 1 every unit was completed with the records
    of the task its plan holds (the three sources up to the add, the four after); the plans
    are whole source epochs, the added source's from its first; pass 2 follows the new weights;
    every pass is the job's 1,007 units."""
    src = Sources(tmp_path / "data")
    extra = Extra(tmp_path / "data")
    m = master_process(
        "--chunk-per-task", "1", "--shuffle-seed", str(SEED), "--task-timeout-dur", "30s"
    )
    args = ["--addr", m.addr, *src.flags(FIRST), "--passes", "3", "--step-time", "0.0002"]
    ts = trainers(3, args)
    deadline = time.monotonic() + 300
    while progress(m.addr) < (1, 8000):
        assert time.monotonic() < deadline, "pass 1 never got going"
        time.sleep(0.05)
    point = ",".join(f"{n}={w}" for n, w in FOURTH.items())
    cmd = ["weights", "--addr", m.addr, "--json", "--add", f"extra={extra.path}", point]
    out = subprocess.run(
        [sys.executable, "-m", "chunkmaster", *cmd], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    change = json.loads(out.stdout)
    m.restart()  # SIGKILL, then the same port and store
    for t in ts:
        assert t.drain(timeout=300) == 0, t.log()
    ds = src.dataset(FIRST)
    grown = ds.grown(extra.added())
    n = ds.num_tasks
    assert change["pass"] == 1 and 0 < change["unit"] < n
    expected = plans_with_extra(ds, grown, 3, change["unit"])
    epochs = check_source_epochs(grown, expected)
    assert epochs[3] >= 1  # extra went through a whole epoch of its own at least
    names = [s.name for s in grown.sources]
    for p in (0, 2):
        want = {name: Digest() for name in names}
        for t in expected[p]:
            for r in source_records(src, extra, grown, t):
                want[names[grown.source_of(t)]].add(r)
        got = {name: Digest() for name in names}
        for t in ts:
            for name, d in t.passes[p].get("sources", {}).items():
                got[name].merge(Digest(int(d["digest"], 16), int(d["records"])))
        assert got == want, f"pass {p}"
    done: dict[int, dict[str, Any]] = {}
    for t in ts:
        for line in t.tasks[1]:
            done[int(line["task"])] = line  # the last completion of each unit
    assert sorted(done) == list(range(n))
    for unit, line in done.items():
        task = expected[1][unit]
        d = Digest()
        for r in source_records(src, extra, grown, task)[int(line["start"]) :]:
            d.add(r)
        assert line["source"] == names[grown.source_of(task)]
        assert (int(line["records"]), line["digest"]) == (d.count, d.hex()), f"unit {unit}"
    assert any(line["source"] == "extra" for line in done.values())
    records = grown.task_records
    late = Counter()
    for t in expected[2]:
        late[names[grown.source_of(t)]] += records[t]
    total = sum(late.values())
    for name in names:
        assert abs(late[name] / total - FOURTH[name]) < 0.02
    with MasterConnection(m.addr) as c:
        st = c.status()
    mix = st["mixture"]
    assert mix["units"] == n and [s["name"] for s in mix["sources"]] == names
    check_pass_sources(st, ts, names, (2,))  # and pass 1, with the add in it, adds up
    (one,) = [led for led in st["ledger"] if led["pass"] == 1]
    assert one["sources"]["extra"]["consumed"] > 0  # the source added mid-pass 1 counts in it


def plans_with_extra(ds: Dataset, grown: Dataset, passes: int, unit: int) -> dict[int, list[int]]:
    """The plans the master makes: the first weights, and from unit `unit` of pass 1 on the
    four sources under FOURTH."""
    state = MasterState()
    apply(state, SetDataset(ds))
    mix = state.mix
    assert mix is not None
    out = {}
    records = grown.task_records
    for p in range(passes):
        if p:
            mix.begin(p)
        if p == 1:
            r = grown.source_tasks(3)
            mix.add(["extra"], [records[r.start : r.stop]])
            mix.replan(p, unit, Weights.fixed(list(FOURTH.values())), True)
        out[p] = list(mix.plan(p))
    return out


def test_a_whole_job_restored_with_an_added_source_delivers_what_was_not_committed_once(
    tmp_path: Path,
) -> None:
    """Trainers commit as they read a mixture of three sources; the data checkpoint is saved;
    everything is SIGKILLed. A fresh master restores the checkpoint, a fourth source is added
    with new weights (`Client.add_sources`), and fresh trainers read two passes: in each, what
    was committed before plus what is delivered after is exactly the records of the pass's plan
    (as the checkpoint recorded it up to the last commit, the four sources under the new
    weights after), as many times as planned; the three continue their epochs where they were,
    the added one starts at its first; its records are delivered."""
    src = Sources(tmp_path / "data", numbered=True)
    extra = Extra(tmp_path / "data", numbered=True)
    ckpt = tmp_path / "job.ckpt"
    flags = ["--chunk-per-task", "1", "--shuffle-seed", str(SEED)]
    cp = checkpointed_mid_job(tmp_path, src, flags, ckpt)
    assert cp.mixture is not None and len(cp.mixture.sources) == 3
    fresh = MasterProcess(
        ["--store", str(tmp_path / "b.db"), *flags, "--restore", str(ckpt)]
    ).start()
    try:
        with Client(fresh.addr) as client:
            change = client.add_sources({"extra": Source(extra.path)}, FOURTH)
        common = ["--passes", "2", "--first-pass", str(cp.floor)]
        news = [SessionTrainer(fresh.addr, tmp_path / f"b{i}.out", *common) for i in range(2)]
        for t in news:
            assert t.proc.wait(300) == 0, t.out.with_suffix(".log").read_text()
        with MasterConnection(fresh.addr) as c:
            mix = c.status()["mixture"]
    finally:
        fresh.kill()

    ds = src.dataset(FIRST)
    state, commits = restored(ds, cp)
    apply(state, AddSources(extra.added(), Weights.fixed(list(FOURTH.values()))))
    assert state.mix is not None and state.dataset is not None
    grown = state.dataset
    expected = planned_passes(state, (cp.floor, cp.floor + 1))
    assert (change.pass_id, change.unit) != (cp.floor, 0) or not cp.passes
    assert mix["units"] == ds.num_tasks and mix["sources"][3]["name"] == "extra"
    check_source_epochs(grown, expected)
    committed: dict[int, list[int]] = defaultdict(list)
    for p, unit, r in commits:
        records = source_records(src, extra, grown, expected[p][unit])
        committed[p] += [int(x) for x in records[: None if r < 0 else r]]
    added = 0
    for p in (cp.floor, cp.floor + 1):
        got = Counter(r for t in news for r in t.records(p))
        planned = Counter(int(x) for t in expected[p] for x in source_records(src, extra, grown, t))
        assert got + Counter(committed[p]) == planned, f"pass {p}"
        added += sum(n for r, n in got.items() if r >= 300_000)
    assert added > 0  # the added source was delivered
