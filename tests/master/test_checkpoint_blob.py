"""Data checkpoint bytes: they round-trip, and anything damaged, foreign or inconsistent is
refused with a CheckpointError that says what is wrong; the fingerprint names what changed."""

from __future__ import annotations

import hashlib
import io
import json
import random
import struct
import zlib
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from helpers.datasets import numbered_records
from hypothesis import given, settings

from chunkmaster.cli.checkpoint_cmd import describe
from chunkmaster.core.checkpoint import (
    MAGIC,
    VERSION,
    VERSION_RANGES,
    VERSION_SHUFFLED,
    VERSION_WINDOWED,
    CheckpointError,
    DataCheckpoint,
    DatasetFingerprint,
    PassCommits,
    check_restorable,
    decode,
    differences,
    encode,
    fingerprint,
)
from chunkmaster.core.codec import encode_snapshot
from chunkmaster.core.dataset import Dataset
from chunkmaster.core.state import MasterState
from chunkmaster.master.checkpoint_file import load

FILES = ("/d/a.rio", "/d/b.rio", "/d/c.rio")


def dataset(
    files: tuple[str, ...] = FILES,
    chunks: tuple[int, ...] = (4, 3, 5),
    cpt: int = 2,
    globs: tuple[str, ...] = ("/d/*.rio",),
    sizes: list[int] | None = None,
    records: int = 10,
) -> Dataset:
    indexes = [([100 * i for i in range(n)], [records] * n) for n in chunks]
    return Dataset.build(globs, files, indexes, cpt, sizes)


def checkpoint(passes: tuple[PassCommits, ...] | None = None, floor: int = 2) -> DataCheckpoint:
    ds = dataset()  # 12 chunks, 6 tasks of 20 records
    if passes is None:
        passes = (
            PassCommits(2, frozenset({0, 3}), {1: 7, 5: 19}),
            PassCommits(4, frozenset({2}), {}),
        )
    return DataCheckpoint(
        "job-7", 1700000000.25, fingerprint(ds, [4096, 2048, 512]), 6, floor, passes
    )


def seal(head: dict[str, Any], sections: bytes = b"", version: int = VERSION) -> bytes:
    """A blob laid out as the module docstring says, with a valid checksum."""
    return sealed(json.dumps(head).encode(), sections, version)


def sealed(js: bytes, sections: bytes = b"", version: int = VERSION) -> bytes:
    """A blob of this JSON header text and these sections, with a valid checksum."""
    body = struct.pack("<I", len(js)) + js + sections
    out = MAGIC + struct.pack("<IQ", version, len(body)) + body
    return out + hashlib.blake2b(out, digest_size=16).digest()


def parts(blob: bytes) -> tuple[dict[str, Any], bytes]:
    """The JSON header and the binary sections of a blob (inverse of `seal`)."""
    (n,) = struct.unpack_from("<I", blob, 20)
    return json.loads(blob[24 : 24 + n]), blob[24 + n : -16]


def refused(data: bytes, *words: str) -> str:
    with pytest.raises(CheckpointError) as info:
        decode(data)
    msg = str(info.value)
    for w in words:
        assert w in msg
    return msg


# --- round trips -------------------------------------------------------------------------------


def test_round_trip() -> None:
    cp = checkpoint()
    assert decode(encode(cp)) == cp
    assert decode(bytearray(encode(cp))) == cp
    assert decode(memoryview(encode(cp))) == cp


def test_round_trip_empty_passes() -> None:
    for passes in [(), (PassCommits(2, frozenset(), {}),), (PassCommits(9, frozenset(), {}),)]:
        cp = checkpoint(passes)
        assert decode(encode(cp)) == cp


def test_round_trip_every_task_full_and_empty_dataset() -> None:
    cp = checkpoint((PassCommits(2, frozenset(range(6)), {}),))
    assert decode(encode(cp)) == cp
    empty = Dataset.build(["/none/*"], [], [], 1)
    cp0 = DataCheckpoint("j", 0.0, fingerprint(empty), 0, 0, (PassCommits(0, frozenset(), {}),))
    assert decode(encode(cp0)) == cp0


def test_a_million_tasks_cost_about_a_bit_each() -> None:
    n = 1_000_000
    ds = Dataset.build(["/big/*"], ["/big/x"], [(range(0, 8 * n, 8), [3] * n)], 1)
    rnd = random.Random(7)
    full = frozenset(t for t in range(n) if rnd.random() < 0.5)
    cp = DataCheckpoint("big", 1.0, fingerprint(ds), n, 0, (PassCommits(0, full, {}),))
    blob = encode(cp)
    assert n // 8 <= len(blob) <= n // 8 + 1024  # a random half: the bitmap does not compress
    assert decode(blob) == cp
    in_order = DataCheckpoint(  # the usual shape: a prefix done, a few tasks in flight
        "big",
        1.0,
        fingerprint(ds),
        n,
        3,
        (PassCommits(3, frozenset(range(n // 2)), {n // 2 + i: 1 for i in range(64)}),),
    )
    small = encode(in_order)
    assert len(small) < 2048
    assert decode(small) == in_order


# Paths and globs: any text but NUL (no path holds one); jobs: names, no control characters.
names = st.text(st.characters(exclude_characters="\x00"), max_size=12)
jobs = st.text(st.characters(exclude_categories=("Cc", "Cs")), max_size=12)


@st.composite
def checkpoints(draw: st.DrawFn) -> DataCheckpoint:
    num_files = draw(st.integers(0, 3))
    chunks = [draw(st.integers(0, 40)) for _ in range(num_files)]
    cpt = draw(st.integers(1, 4))
    files = tuple(f"/d/{draw(names)}/{i}" for i in range(num_files))
    ds = dataset(files, tuple(chunks), cpt, tuple(draw(st.lists(names, max_size=2))))
    sizes = draw(st.none() | st.just([draw(st.integers(0, 2**40)) for _ in files]))
    fp = fingerprint(ds, sizes)
    floor = draw(st.integers(0, 2**40))
    passes = []
    pass_id = floor + draw(st.integers(0, 3))
    for _ in range(draw(st.integers(0, 3))):
        tasks = (
            draw(st.lists(st.integers(0, ds.num_tasks - 1), unique=True)) if ds.num_tasks else []
        )
        cut = draw(st.integers(0, len(tasks)))
        partial = {t: draw(st.integers(1, 2**64 - 1)) for t in tasks[cut:]}
        ranges = {}
        for t in draw(st.lists(st.integers(0, max(0, ds.num_tasks - 1)), unique=True)):
            if t in tasks[:cut] or not ds.num_tasks or partial.get(t, 0) >= 2**64 - 16:
                continue
            at = partial.get(t, 0) + draw(st.integers(1, 3))
            spans = []
            for _ in range(draw(st.integers(1, 2))):
                spans.append((at, at + draw(st.integers(1, 3))))
                at = spans[-1][1] + draw(st.integers(1, 3))
            ranges[t] = tuple(spans)
        passes.append(PassCommits(pass_id, frozenset(tasks[:cut]), partial, ranges))
        pass_id += draw(st.integers(1, 3))
    created = draw(st.floats(0, 253402300799.0))  # up to the end of year 9999
    return DataCheckpoint(draw(jobs), created, fp, ds.num_tasks, floor, tuple(passes))


@settings(max_examples=300, deadline=None)
@given(checkpoints())
def test_round_trip_any(cp: DataCheckpoint) -> None:
    blob = encode(cp)
    assert decode(blob) == cp
    assert encode(decode(blob)) == blob


# --- hostile content: valid blobs mutated and sealed again ------------------------------------

EDGES = [2**32, 2**62, 2**63, 2**64, -1, -(2**63), 10**400, 1e300, -1e300, "\x00", "a\x1bb"]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(EDGES)
    | st.floats()
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, value in items:
        yield from _paths(value, (*prefix, key))


@st.composite
def mutated_blobs(draw: st.DrawFn) -> bytes:
    """A valid checkpoint's blob with a few fields of its JSON header replaced (by any JSON
    value, or a list nested 5,000 deep), removed or added, or a byte of its sections changed;
    sealed again, so only the content is wrong."""
    head, sections = parts(encode(draw(checkpoints())))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(head))))
        parent: Any = head
        for key in path[:-1]:
            parent = parent[key]
        kind = draw(st.sampled_from(["replace", "replace", "replace", "deep", "delete", "add"]))
        if not path or (kind == "add" and not isinstance(parent[path[-1]], dict)):
            head[draw(st.text(max_size=8))] = draw(json_values)
        elif kind == "add":
            parent[path[-1]][draw(st.text(max_size=8))] = draw(json_values)
        elif kind == "delete":
            del parent[path[-1]]
        else:
            parent[path[-1]] = "DEEP" if kind == "deep" else draw(json_values)
    if sections and draw(st.booleans()):
        at = draw(st.integers(0, len(sections) - 1))
        sections = sections[:at] + bytes([draw(st.integers(0, 255))]) + sections[at + 1 :]
    js = json.dumps(head).encode().replace(b'"DEEP"', b"[" * 5000 + b"]" * 5000)
    return sealed(js, sections, draw(st.sampled_from([VERSION, VERSION_SHUFFLED])))


@settings(max_examples=400, deadline=None)
@given(mutated_blobs())
def test_mutated_blobs_decode_or_are_refused_never_a_traceback(blob: bytes) -> None:
    """And a file of those bytes is refused by its first bytes only if decode refuses it."""
    try:
        read = load(io.BytesIO(blob), len(blob))
    except CheckpointError:
        read = None
    try:
        cp = decode(blob)
    except CheckpointError:
        return
    assert read == blob
    describe(cp)  # what `chunkmaster checkpoint show` prints
    assert decode(encode(cp)) == cp


# --- damage ------------------------------------------------------------------------------------


def test_every_truncation_is_refused() -> None:
    blob = encode(checkpoint())
    refused(b"", "empty", "not a chunkmaster data checkpoint")
    for n in range(1, len(blob)):
        refused(blob[:n], "truncated")


def test_trailing_bytes_are_refused() -> None:
    blob = encode(checkpoint())
    refused(blob + b"\0", "1 bytes after its end")
    refused(blob + blob, "after its end")


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_flipped_byte_is_refused(mask: int) -> None:
    blob = encode(checkpoint())
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= mask
        msg = refused(bytes(bad))
        if i < 8:
            assert "not a chunkmaster data checkpoint" in msg
        elif i < 12:
            assert "version" in msg and "not supported" in msg
        elif i < 20:
            assert "truncated" in msg or "after its end" in msg
        else:
            assert "checksum mismatch" in msg


def test_messages_never_quote_the_blob() -> None:
    secret = "/d/TOPSECRET-path"
    blob = encode(DataCheckpoint(secret, 0.0, fingerprint(dataset((secret,), (2,))), 1, 0, ()))
    bad = bytearray(blob)
    bad[40] ^= 1
    assert "TOPSECRET" not in refused(bytes(bad), "checksum mismatch")
    assert "TOPSECRET" not in refused(blob[:-1], "truncated")


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    recordio = Path(numbered_records(tmp_path / "data.rio", 5)).read_bytes()
    refused(recordio, "not a chunkmaster data checkpoint", "RecordIO")
    refused(encode_snapshot(MasterState()), "not a chunkmaster data checkpoint", "store snapshot")
    refused(random.Random(3).randbytes(4096), "not a chunkmaster data checkpoint")
    refused(b'{"job": "x", "floor": 0}\n', "not a chunkmaster data checkpoint")
    refused(b"\n", "not a chunkmaster data checkpoint")
    refused(MAGIC.replace(b"\r\n", b"\n") + encode(checkpoint())[8:], "not a chunkmaster")


def test_a_future_version_is_refused_naming_the_version_read() -> None:
    head, sections = parts(encode(checkpoint()))
    msg = refused(seal(head, sections, version=6), "version 6 is not supported")
    assert f"reads versions {VERSION}, {VERSION_SHUFFLED}, 3, {VERSION_WINDOWED} and 5" in msg
    refused(seal(head, sections, version=VERSION_RANGES), "committed ranges disagree")
    msg = refused(seal(head, sections, version=VERSION_SHUFFLED), "shuffle seed disagree")
    refused(seal(head, sections, version=VERSION_WINDOWED), "shuffle window disagree")
    assert decode(seal(head, sections)) == checkpoint()  # `seal` follows the documented layout


# --- inconsistent content with a valid checksum ------------------------------------------------


def bitmap(tasks: set[int], n: int = 6) -> bytes:
    value = sum(1 << t for t in tasks)
    return zlib.compress(value.to_bytes((n + 7) // 8, "little"))


def partial(items: list[tuple[int, int]]) -> bytes:
    return array("I", [t for t, _ in items]).tobytes() + array("Q", [r for _, r in items]).tobytes()


def with_pass(entry: list[int], section: bytes, edit: dict[str, Any] | None = None) -> bytes:
    head, _ = parts(encode(checkpoint(())))
    head["passes"] = [entry]
    head.update(edit or {})
    return seal(head, section)


def test_committed_ranges_beyond_a_prefix_round_trip_in_version_5() -> None:
    """Ranges a split task committed beyond its prefix are kept (VERSION_RANGES, which an
    older build refuses rather than drop them); without them a checkpoint keeps its version."""
    cp = checkpoint(
        (PassCommits(2, frozenset({0}), {1: 7}, {1: ((9, 12), (15, 20)), 4: ((3, 5),)}),)
    )
    blob = encode(cp)
    assert struct.unpack_from("<I", blob, 8)[0] == VERSION_RANGES
    assert decode(blob) == cp
    assert parts(blob)[0]["ranges"] == [[2, 1, 9, 12], [2, 1, 15, 20], [2, 4, 3, 5]]
    assert describe(cp)["passes"][0]["tasks_with_ranges_ahead"] == 2  # checkpoint show
    assert "tasks_with_ranges_ahead" not in describe(checkpoint())["passes"][0]
    assert struct.unpack_from("<I", encode(checkpoint()), 8)[0] == VERSION


def with_ranges(ranges: Any, partial_of: list[tuple[int, int]] | None = None) -> bytes:
    """A pass 2 with task 0 whole, the partial commits given (task 1 to 7 by default), and
    `ranges` as the header's, sealed as version 5."""
    items = [(1, 7)] if partial_of is None else partial_of
    head, _ = parts(encode(checkpoint(())))
    head["passes"] = [[2, 1, len(bitmap({0})), len(items)]]
    head["ranges"] = ranges
    return seal(head, bitmap({0}) + partial(items), VERSION_RANGES)


@pytest.mark.parametrize(
    ("ranges", "words"),
    [
        ([[2, 1, 7, 9]], "not after record 7"),  # at the prefix: it would be part of it
        ([[2, 1, 3, 9]], "not after record 7"),
        ([[2, 1, 9, 9]], "is empty"),
        ([[2, 1, 9, 12], [2, 1, 11, 14]], "not after record 12"),  # overlapping
        ([[2, 1, 12, 14], [2, 1, 9, 11]], "not ascending"),
        ([[2, 0, 3, 5]], "wholly committed"),
        ([[2, 6, 3, 5]], "not in 0..5"),
        ([[3, 1, 9, 12]], "pass 3, which has no entry"),
        ([[2, 1, 9]], "committed range is not a list of 4"),
        ([[2, 1, 9, "x"]], "committed range field"),
        ({"2": 1}, "ranges is not a list"),
        ([], "committed ranges disagree"),  # version 5 without any
    ],
)
def test_inconsistent_committed_ranges_are_refused(ranges: Any, words: str) -> None:
    refused(with_ranges(ranges), "inconsistent data checkpoint", words)


def test_committed_ranges_must_lie_within_their_task() -> None:
    cp = decode(with_ranges([[2, 1, 9, 20], [2, 2, 1, 21]]))
    with pytest.raises(CheckpointError, match="task 2 has 20 records, so a range committed up"):
        check_restorable(cp, dataset())
    check_restorable(decode(with_ranges([[2, 1, 9, 20]])), dataset())


def test_a_hand_sealed_pass_decodes() -> None:
    bm = bitmap({0, 3})
    cp = decode(with_pass([2, 2, len(bm), 1], bm + partial([(1, 7)])))
    assert cp.passes == (PassCommits(2, frozenset({0, 3}), {1: 7}),)


@pytest.mark.parametrize(
    ("blob", "words"),
    [
        (with_pass([2, 1, len(bitmap({0})), 1], bitmap({0}) + partial([(6, 1)])), "task 6"),
        (with_pass([2, 1, len(bitmap({0})), 1], bitmap({0}) + partial([(1, 0)])), "0 records"),
        (
            with_pass([2, 1, len(bitmap({1})), 1], bitmap({1}) + partial([(1, 5)])),
            "both wholly and partly",
        ),
        (
            with_pass([2, 0, len(bitmap(set())), 2], bitmap(set()) + partial([(3, 1), (1, 1)])),
            "not ascending",
        ),
        (with_pass([1, 0, len(bitmap(set())), 0], bitmap(set())), "pass 1 is out of order"),
        (with_pass([2, 2, len(bitmap({0})), 0], bitmap({0})), "header says 2"),
        (with_pass([2, 1, len(bitmap({6}, 8)), 0], bitmap({6}, 8)), "bitmap"),  # padding bit
        (with_pass([2, 1, len(bitmap({0})), 0], bitmap({0}) + b"x"), "belong to no section"),
        (with_pass([2, 1, len(bitmap({0})) + 1, 0], bitmap({0}) + b"x"), "bitmap"),
        (with_pass([2, 0, 3, 0], b"abc"), "does not decompress"),
        (with_pass([2, 0, 0, 0], b""), "bitmap"),
        (with_pass([2, 0, 99, 0], b""), "past the end"),
        (with_pass([2, 0, len(bitmap(set())), 0], bitmap(set()), {"num_tasks": 7}), "6 tasks"),
        (with_pass([2, 0, len(bitmap(set())), 0], bitmap(set()), {"floor": -1}), "negative"),
        (with_pass([2, 0, 0], b""), "pass entry"),
        (with_pass([2, 0, len(bitmap(set())), 0], bitmap(set()), {"job": 3}), "job"),
        (with_pass([2, 0, len(bitmap(set())), 0], bitmap(set()), {"created": "x"}), "created"),
        (with_pass([2, 0, len(bitmap(set())), 0], bitmap(set()), {"floor": True}), "floor"),
    ],
)
def test_inconsistent_content_is_refused(blob: bytes, words: str) -> None:
    refused(blob, "inconsistent data checkpoint", words)


def test_malformed_headers_are_refused() -> None:
    head, sections = parts(encode(checkpoint()))
    refused(
        MAGIC
        + struct.pack("<IQ", VERSION, 0)
        + hashlib.blake2b(MAGIC + struct.pack("<IQ", VERSION, 0), digest_size=16).digest(),
        "shorter than its header length",
    )
    del head["dataset"]
    refused(seal(head, sections), "lacks the field 'dataset'")
    body = struct.pack("<I", 3) + b"\xff\xfe{"
    out = MAGIC + struct.pack("<IQ", VERSION, len(body)) + body
    refused(out + hashlib.blake2b(out, digest_size=16).digest(), "not ASCII JSON")
    head, sections = parts(encode(checkpoint()))
    head["dataset"]["files"][0][4] = "zz"
    refused(seal(head, sections), "not hex")
    head["dataset"]["files"][0][4] = "00"
    refused(seal(head, sections), "index digest is not 16 bytes")


def test_encode_refuses_what_decode_would() -> None:
    cases = [
        (checkpoint((PassCommits(2, frozenset({6}), {}),)), "not in 0..5"),
        (checkpoint((PassCommits(2, frozenset({-1}), {}),)), "not in 0..5"),
        (checkpoint((PassCommits(2, frozenset(), {9: 1}),)), "task 9"),
        (checkpoint((PassCommits(2, frozenset(), {1: 0}),)), "0 records"),
        (checkpoint((PassCommits(2, frozenset({1}), {1: 3}),)), "both"),
        (checkpoint((PassCommits(1, frozenset(), {}),)), "out of order"),
        (
            checkpoint((PassCommits(3, frozenset(), {}), PassCommits(3, frozenset(), {}))),
            "out of order",
        ),
    ]
    for cp, words in cases:
        with pytest.raises(CheckpointError, match=words):
            encode(cp)
    nan = DataCheckpoint("j", float("nan"), checkpoint().dataset, 6, 0, ())
    with pytest.raises(CheckpointError, match="finite"):
        encode(nan)


# --- fingerprint and differences ---------------------------------------------------------------


def test_fingerprint_describes_each_file() -> None:
    fp = fingerprint(dataset(sizes=[1, 2, 3]))
    assert fp.globs == ("/d/*.rio",) and fp.chunks_per_task == 2
    assert [(f.path, f.size, f.num_chunks, f.num_records) for f in fp.files] == [
        ("/d/a.rio", 1, 4, 40),
        ("/d/b.rio", 2, 3, 30),
        ("/d/c.rio", 3, 5, 50),
    ]
    assert all(len(f.index_digest) == 16 for f in fp.files)
    assert fingerprint(dataset(), [7, 8, 9]).files[2].size == 9
    assert fingerprint(dataset()).files[0].size == -1
    assert fingerprint(dataset()) == fingerprint(dataset())
    with pytest.raises(ValueError, match="2 file sizes for 3 files"):
        fingerprint(dataset(), [1, 2])


def test_same_dataset_has_no_differences() -> None:
    assert differences(fingerprint(dataset()), fingerprint(dataset())) == []
    assert differences(fingerprint(dataset(sizes=[1, 2, 3])), fingerprint(dataset())) == []


def one_change(actual: DatasetFingerprint) -> str:
    lines = differences(fingerprint(dataset(sizes=[10, 20, 30])), actual)
    assert len(lines) == 1, lines
    return lines[0]


def test_differences_name_each_change() -> None:
    sizes = [10, 20, 30]
    assert one_change(fingerprint(dataset(FILES[:2], (4, 3), sizes=sizes[:2]))) == (
        "file missing: /d/c.rio"
    )
    added = fingerprint(dataset((*FILES, "/d/d.rio"), (4, 3, 5, 1), sizes=[*sizes, 1]))
    assert one_change(added) == "file added: /d/d.rio"
    assert one_change(fingerprint(dataset(sizes=[10, 21, 30]))) == (
        "/d/b.rio: size changed: 20 -> 21 bytes"
    )
    assert "/d/c.rio: chunk count changed: 5 -> 6" in differences(
        fingerprint(dataset()), fingerprint(dataset(chunks=(4, 3, 6)))
    )
    assert "/d/a.rio: records changed: 40 -> 44" in differences(
        fingerprint(dataset()), fingerprint(dataset(records=11))
    )
    moved = Dataset.build(
        ["/d/*.rio"],
        FILES,
        [
            ([0, 100, 200, 300], [10] * 4),
            ([0, 100, 250], [10] * 3),
            ([100 * i for i in range(5)], [10] * 5),
        ],
        2,
        sizes,
    )
    assert (
        one_change(fingerprint(moved))
        == "/d/b.rio: chunk index changed (chunk offsets or records per chunk)"
    )
    assert one_change(fingerprint(dataset(cpt=3, sizes=sizes))) == "chunks per task changed: 2 -> 3"
    assert one_change(fingerprint(dataset(globs=("/e/*",), sizes=sizes))) == (
        "globs changed: ['/d/*.rio'] -> ['/e/*']"
    )
    reordered = fingerprint(dataset((FILES[1], FILES[0], FILES[2]), (3, 4, 5), sizes=[20, 10, 30]))
    assert one_change(reordered).startswith("file order changed: /d/b.rio is where /d/a.rio was")


def test_differences_are_limited() -> None:
    many = tuple(f"/m/{i}" for i in range(30))
    lines = differences(fingerprint(dataset(many, (1,) * 30)), fingerprint(dataset()), limit=5)
    assert lines[:5] == [f"file missing: /m/{i}" for i in range(5)]
    assert lines[5] == "... and 28 more"  # 30 missing + 3 added
    assert len(differences(fingerprint(dataset(many, (1,) * 30)), fingerprint(dataset()))) == 11


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_no_differences_means_equal(data: st.DataObject) -> None:
    def one() -> DatasetFingerprint:
        n = data.draw(st.integers(0, 3))
        files = tuple(sorted(data.draw(st.sets(st.sampled_from("abcd"), min_size=n, max_size=n))))
        chunks = tuple(data.draw(st.integers(0, 3)) for _ in files)
        sizes = [data.draw(st.integers(0, 2)) for _ in files]
        return fingerprint(
            dataset(
                files,
                chunks,
                data.draw(st.integers(1, 2)),
                ("g",),
                sizes,
                data.draw(st.integers(1, 2)),
            )
        )

    a, b = one(), one()
    assert (differences(a, b) == []) == (a == b)


def test_check_restorable() -> None:
    cp = decode(encode(checkpoint()))
    check_restorable(cp, dataset(), [4096, 2048, 512])
    check_restorable(cp, dataset())  # sizes unknown here: not a difference
    with pytest.raises(CheckpointError, match=r"/d/b\.rio: size changed: 2048 -> 2049 bytes"):
        check_restorable(cp, dataset(), [4096, 2049, 512])
    with pytest.raises(CheckpointError, match=r"file missing: /d/c\.rio"):
        check_restorable(cp, dataset(FILES[:2], (4, 3)))
    whole = checkpoint((PassCommits(2, frozenset(), {1: 20}),))
    with pytest.raises(CheckpointError, match="task 1 has 20 records"):
        check_restorable(whole, dataset())


def test_fingerprint_refuses_a_scrambled_dataset() -> None:
    scrambled = Dataset(
        ("g",), ("x", "y"), array("I", [0, 1, 0]), array("Q", [0, 0, 9]), array("I", [1, 1, 1]), 1
    )
    with pytest.raises(ValueError, match="not contiguous"):
        fingerprint(scrambled)
