"""A mixture's weights and source names at their bounds, over real gRPC (docs/mixtures.md,
"Bounds"): weights the planner cannot use (each finite, their sum not; a share that rounds to
0; subnormal), a weight point naming a source twice, a name with a control or invisible
character or too long, are refused in one line naming the source and what is wrong, with
nothing changed: the next correct call works and trainers read as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster

from chunkmaster import Client, DatasetError, Source
from chunkmaster.client.connection import MasterConnection
from chunkmaster.core.errors import InvalidArgumentError
from chunkmaster.rpc import master_pb2 as pb

NAMES = ("a", "b", "c")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    return {n: numbered_records(tmp_path / f"{n}.rio", 6, n.encode() + b"%d") for n in "abcd"}


@pytest.fixture
def master() -> Iterator[InProcessMaster]:
    with InProcessMaster(chunks_per_task=1) as m:
        yield m


def every_record(files: dict[str, str], names: str = "abc") -> list[bytes]:
    return sorted(n.encode() + b"%d" % i for n in names for i in range(6))


def read_pass(addr: str, pass_id: int) -> list[bytes]:
    with Client(addr) as client:
        return sorted(client.records(pass_id))


def mixture_view(m: InProcessMaster) -> dict[str, Any]:
    """What a refused call must leave as it was: the schedule, the sources, the pass."""
    st = m.status()
    mix = st["mixture"]
    return {
        "pass": st["cur_pass"],
        "schedule": mix["schedule"],
        "sources": [(s["name"], s["target"], s["tasks"]) for s in mix["sources"]],
    }


def point(*weights: tuple[str, float], at: int = 0) -> pb.WeightPoint:
    return pb.WeightPoint(
        records=at, weights=[pb.SourceWeight(name=n, weight=w) for n, w in weights]
    )


def test_a_dataset_whose_weights_overflow_is_refused_and_a_correct_one_then_set(
    master: InProcessMaster, files: dict[str, str]
) -> None:
    """1e308 three times: each finite, their sum inf (normalised, every weight 0: the planner
    had nothing to choose, and the job was left half set with 0 tasks)."""
    with Client(master.addr) as client:
        with pytest.raises(DatasetError, match="source 'a' has weight 1e\\+308 at record 0"):
            client.set_dataset({n: Source(files[n], 1e308) for n in NAMES})
        assert master.status_view().ready is False  # nothing set, nothing journaled
        with pytest.raises(DatasetError, match="source 'b' has weight 5e-324"):
            client.set_dataset({"a": Source(files["a"], 0), "b": Source(files["b"], 5e-324)})
        with pytest.raises(DatasetError, match="source 'c' has weight 1e-13 at record 0, 1e-13"):
            client.set_dataset({"a": Source(files["a"]), "c": Source(files["c"], 1e-13)})
        assert master.status_view().ready is False
        client.set_dataset({n: Source(files[n], 1) for n in NAMES})
    assert master.status_view().num_tasks == 18
    assert read_pass(master.addr, 0) == every_record(files)


def test_weights_the_planner_cannot_use_change_nothing_and_the_job_goes_on(
    master: InProcessMaster, files: dict[str, str]
) -> None:
    with Client(master.addr) as client:
        client.set_dataset({n: Source(files[n], 1) for n in NAMES})
    before = mixture_view(master)
    bad = [
        ([point(("a", 1e308), ("b", 1e308), ("c", 1e308))], "source 'a' has weight 1e+308"),
        ([point(("a", 1), ("b", 1e-13), ("c", 0))], "source 'b' has weight 1e-13 at record 0"),
        ([point(("a", 5e-324), ("b", 5e-324), ("c", 0))], "source 'a' has weight 5e-324"),
        (
            [point(("a", 1), ("b", 1), ("c", 1)), point(("a", 1), ("b", 1), ("c", 1e308), at=9)],
            "source 'c' has weight 1e+308 at record 9",
        ),
    ]
    with MasterConnection(master.addr) as conn:
        for points, why in bad:
            with pytest.raises(InvalidArgumentError) as info:
                conn.set_weights(points)
            assert why in str(info.value)
            assert mixture_view(master) == before
        # Sources added with weights that overflow, or with a share that rounds to 0: refused
        # before any file is read, nothing added.
        d = pb.Source(name="d", globs=[files["d"]], weight=1e308)
        with pytest.raises(InvalidArgumentError, match="source 'd' has weight 1e\\+308"):
            conn.set_weights([], add=[d])
        d.weight = 1e-320
        with pytest.raises(InvalidArgumentError, match="source 'd' has weight 1e-320"):
            conn.set_weights([], add=[d])
        d.weight = 1
        with pytest.raises(InvalidArgumentError, match="source 'd' has weight 1e\\+308"):
            conn.set_weights([point(("a", 1), ("b", 1), ("c", 1), ("d", 1e308))], add=[d])
        assert mixture_view(master) == before
    assert read_pass(master.addr, 0) == every_record(files)
    with Client(master.addr) as client:
        change = client.set_weights({"a": 1, "b": 0, "c": 0})
        assert change.pass_id == 1
    assert read_pass(master.addr, 1) == sorted([b"a%d" % i for i in range(6)] * 3)


def test_a_weight_point_naming_a_source_twice_is_refused(
    master: InProcessMaster, files: dict[str, str]
) -> None:
    """The wire's weights are (name, weight) pairs: the same name twice was taken, last wins."""
    with Client(master.addr) as client:
        client.set_dataset({n: Source(files[n], 1) for n in NAMES})
    before = mixture_view(master)
    with MasterConnection(master.addr) as conn:
        with pytest.raises(InvalidArgumentError) as info:
            conn.set_weights([point(("a", 1), ("b", 1), ("c", 1), ("a", 5))])
        assert "the weights at record 0 name source 'a' twice (1.0 and 5.0)" in str(info.value)
        assert mixture_view(master) == before
        d = pb.Source(name="d", globs=[files["d"]], weight=1)
        with pytest.raises(InvalidArgumentError, match="at record 0 name source 'd' twice"):
            conn.set_weights([point(("a", 1), ("b", 1), ("c", 1), ("d", 1), ("d", 2))], add=[d])
        assert mixture_view(master) == before


@pytest.mark.parametrize(
    ("name", "shown", "code", "at"),
    [
        ("web\x1b[31m", "'web\\x1b[31m'", "U+001B (Cc", 4),
        ("we\nb", "'we\\nb'", "U+000A (Cc", 3),
        ("\u2028web", "'\\u2028web'", "U+2028 (Zl", 1),
        ("web\u202e", "'web\\u202e'", "U+202E (Cf", 4),
        ("w\u200beb", "'w\\u200beb'", "U+200B (Cf", 2),
    ],
)
def test_a_source_name_with_a_control_character_is_refused_naming_its_position(
    master: InProcessMaster, files: dict[str, str], name: str, shown: str, code: str, at: int
) -> None:
    """It was escaped on the way in (the wire took it for a trainer's free text) and set."""
    with Client(master.addr) as client:
        with pytest.raises(DatasetError) as info:
            client.set_dataset({name: Source(files["a"]), "b": Source(files["b"])})
        message = str(info.value)
        assert f"source name {shown} holds {code}" in message and f"at character {at}:" in message
        assert "\n" not in message and "\x1b" not in message  # one line, shown escaped
        assert master.status_view().ready is False
        client.set_dataset({n: Source(files[n], 1) for n in NAMES})
    with MasterConnection(master.addr) as conn:
        added = pb.Source(name=name, globs=[files["d"]], weight=1)
        with pytest.raises(DatasetError) as add_info:
            conn.set_weights([], add=[added])
        assert f"holds {code}" in str(add_info.value)
        assert f"at character {at}:" in str(add_info.value)
        with pytest.raises(InvalidArgumentError) as weights_info:
            conn.set_weights([point(("a", 1), ("b", 1), ("c", 1), (name, 1))])
        assert f"{shown} is none of them" in str(weights_info.value)
    assert [s["name"] for s in master.status()["mixture"]["sources"]] == list(NAMES)


def test_a_source_name_is_up_to_255_characters_of_any_width(
    master: InProcessMaster, files: dict[str, str]
) -> None:
    """255 four-byte characters (1,020 bytes of UTF-8) were cut on the way in as free text,
    and then refused as "must be 1 to 255 characters"."""
    wide = "\N{GRINNING FACE}" * 255
    with Client(master.addr) as client:
        with pytest.raises(
            DatasetError, match="is 256 characters long: a source's name is 1 to 255"
        ):
            client.set_dataset({wide + "x": Source(files["a"]), "b": Source(files["b"])})
        client.set_dataset({wide: Source(files["a"], 1), "b": Source(files["b"], 1)})
    assert [s["name"] for s in master.status()["mixture"]["sources"]] == [wide, "b"]
    assert read_pass(master.addr, 0) == every_record(files, "ab")
    with Client(master.addr) as client:
        assert client.set_weights({wide: 1, "b": 0}).pass_id == 1
    assert read_pass(master.addr, 1) == sorted([b"a%d" % i for i in range(6)] * 2)
