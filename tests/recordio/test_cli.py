"""`chunkmaster recordio ...` through main() and once through the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.vectors import load_manifest, manifest_records, vector_path

from chunkmaster.cli.main import main
from chunkmaster.digest import Digest, file_digest, record_digest
from chunkmaster.recordio import Writer, load_index, scan


def test_inspect_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(vector_path("mixed_snappy"))
    assert main(["recordio", "inspect", path]) == 0
    out = capsys.readouterr().out
    assert "13 chunks, 32 records, compressor snappy" in out
    assert main(["recordio", "inspect", "--verify", "--json", path]) == 0
    report = json.loads(capsys.readouterr().out)
    manifest = load_manifest("mixed_snappy")
    assert report["records"] == 32 and report["chunks"] == 13 and report["verified"]
    assert report["raw_size"] == sum(c["uncompressed_size"] for c in manifest["chunks"])
    assert report["stored_size"] == sum(c["compressed_size"] for c in manifest["chunks"])
    assert [c["offset"] for c in report["chunk_list"]] == [c["offset"] for c in manifest["chunks"]]


def test_inspect_verify_names_the_damage(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(vector_path("errors/checksum_mismatch_chunk1"))
    assert main(["recordio", "inspect", path]) == 0  # headers alone look fine
    capsys.readouterr()
    assert main(["recordio", "inspect", "--verify", path]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert path in err and "chunk 1" in err and "offset 29" in err and "Checksum" in err


def test_cat_lines_range_and_raw(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    path = str(vector_path("small_none"))
    records = manifest_records(load_manifest("small_none"))
    assert main(["recordio", "cat", path]) == 0
    assert capsysbinary.readouterr().out == b"".join(r + b"\n" for r in records)
    assert main(["recordio", "cat", path, "--range", "1:3"]) == 0
    assert capsysbinary.readouterr().out == b"".join(r + b"\n" for r in records[1:4])
    assert main(["recordio", "cat", path, "--raw", "--range", "5:-1"]) == 0
    raw = b"".join(len(r).to_bytes(4, "little") + r for r in records[5:])
    assert capsysbinary.readouterr().out == raw


def test_write_from_lines_and_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.txt"
    src.write_bytes(b"alpha\n\nbeta\ngamma")
    out = tmp_path / "out.rio"
    args = ["recordio", "write", str(out), str(src), "--compressor", "gzip"]
    assert main([*args, "--max-chunk-size", "5"]) == 0
    assert list(scan(out)) == [b"alpha", b"", b"beta", b"gamma"]
    assert load_index(out).chunk_records == [2, 1, 1]
    blobs = []
    for i in range(3):
        p = tmp_path / f"blob{i}"
        p.write_bytes(bytes([i]) * (i + 1) + b"\nx")
        blobs.append(p)
    out2 = tmp_path / "blobs.rio"
    assert main(["recordio", "write", str(out2), "--from", "files", *map(str, blobs)]) == 0
    assert list(scan(out2)) == [p.read_bytes() for p in blobs]
    capsys.readouterr()


def test_digest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = str(vector_path("mixed_none")), str(vector_path("mixed_gzip"))
    assert main(["recordio", "digest", a, b]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = Digest()
    for r in manifest_records(load_manifest("mixed_none")):
        expected.add(r)
    assert lines[0] == f"{a}\t32 records\t{expected.hex()}"
    assert lines[1] == f"{b}\t32 records\t{expected.hex()}"
    twice = Digest()
    twice.merge(expected)
    twice.merge(expected)
    assert lines[2] == f"total\t64 records\t{twice.hex()}"
    assert file_digest(a) == expected


def test_digest_definition() -> None:
    # sha256(b"") = e3b0c44298fc1c14...; the digest is order-independent and wraps mod 2^64.
    assert record_digest(b"") == 0xE3B0C44298FC1C14
    d1, d2 = Digest(), Digest()
    for r in (b"a", b"b", b"c"):
        d1.add(r)
    for r in (b"c", b"a", b"b"):
        d2.add(r)
    assert d1 == d2 and d1.count == 3 and len(d1.hex()) == 16
    assert d1.value == sum(record_digest(r) for r in (b"a", b"b", b"c")) % 2**64


@pytest.mark.parametrize(
    "argv, text",
    [
        (["recordio", "cat", "/nonexistent/x.rio"], "/nonexistent/x.rio: no such file"),
        (["recordio", "digest", "VEC:errors/bad_magic_chunk2"], "Failed to parse magic number"),
        (["recordio", "cat", "VEC:small_none", "--range", "a:b"], "--range"),
        (["recordio", "write", "OUT", "--from", "files"], "needs at least one INPUT"),
    ],
)
def test_errors_are_one_line(
    argv: list[str], text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        str(vector_path(a[4:])) if a.startswith("VEC:") else str(tmp_path / a) if a == "OUT" else a
        for a in argv
    ]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert err.startswith("chunkmaster: error: ") and err.count("\n") == 1 and text in err


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["recordio", "write", "x", "--compressor", "lz4"])
    assert info.value.code == 2
    capsys.readouterr()


def test_console_script(tmp_path: Path) -> None:
    exe = shutil.which("chunkmaster", path=str(Path(sys.executable).parent))
    assert exe, "the chunkmaster console script is not installed in this environment"
    out = tmp_path / "s.rio"
    run = subprocess.run(
        [exe, "recordio", "write", str(out), "--compressor", "none"],
        input=b"one\ntwo\n",
        capture_output=True,
        check=True,
    )
    assert b"2 records in 1 chunks" in run.stderr
    with Writer(tmp_path / "t.rio", compressor=0) as w:
        w.write(b"one")
        w.write(b"two")
    assert out.read_bytes() == (tmp_path / "t.rio").read_bytes()
    cat = subprocess.run([exe, "recordio", "cat", str(out)], capture_output=True, check=True)
    assert cat.stdout == b"one\ntwo\n"
