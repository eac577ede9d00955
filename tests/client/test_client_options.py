"""The Client's options in three groups (client/options.py): the simple cases stay simple, the
flat keyword arguments of before still work with a DeprecationWarning naming the replacement,
and what did nothing (`buffer_size`) says so wherever a user could pass it."""

from __future__ import annotations

import logging
import pickle
import warnings
from collections import Counter
from pathlib import Path

import pytest
from helpers.datasets import numbered_records
from helpers.inproc import InProcessMaster

import chunkmaster
from chunkmaster.cli.main import main
from chunkmaster.client import Client, Connection, Reading, Session
from chunkmaster.client.options import resolve
from chunkmaster.paddle import cloud_reader, recordio
from chunkmaster.recordio import Writer


def _no_deprecation(fn: object) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()  # type: ignore[operator]
    assert [w for w in caught if issubclass(w.category, DeprecationWarning)] == []


def test_the_simple_cases_warn_of_nothing() -> None:
    def make() -> None:
        Client("127.0.0.1:1", session=False).close()
        Client("127.0.0.1:1", token="t", name="n", session=False).close()
        Client(
            "127.0.0.1:1",
            session=False,
            connection=Connection(rpc_timeout=1.0, retry_timeout=1.0),
            reading=Reading(prefetch_tasks=3, shuffle_buffer=10),
        ).close()

    _no_deprecation(make)
    assert chunkmaster.Connection is Connection and chunkmaster.Reading is Reading
    assert chunkmaster.Session is Session


@pytest.mark.parametrize(
    ("old", "value", "group", "replacement"),
    [
        ("report_every", 7, "session_options", "session=chunkmaster.Session(report_every=...)"),
        ("world_size", 0, "session_options", "session=chunkmaster.Session(world_size=...)"),
        ("prefetch_tasks", 3, "reading", "reading=chunkmaster.Reading(prefetch_tasks=...)"),
        ("storage_options", {"anon": True}, "reading", "reading=chunkmaster.Reading("),
        ("retry_timeout", 9.0, "connection", "connection=chunkmaster.Connection(retry_timeout"),
        ("tls_ca", "ca.pem", "connection", "connection=chunkmaster.Connection(tls_ca=...)"),
        ("etcd_job", "j", "connection", "connection=chunkmaster.Connection(etcd_job=...)"),
    ],
)
def test_a_flat_option_of_before_warns_naming_its_replacement_and_still_applies(
    old: str, value: object, group: str, replacement: str
) -> None:
    with pytest.warns(DeprecationWarning, match=rf"Client\({old}=\.\.\.\) is deprecated") as w:
        opts = resolve(addr="127.0.0.1:1", legacy={old: value})
    assert replacement in str(w[0].message)
    assert getattr(getattr(opts, group), old) == value


def test_the_warning_points_at_the_callers_line() -> None:
    with pytest.warns(DeprecationWarning) as w:
        Client("127.0.0.1:1", session=False, retry_timeout=5.0).close()
    assert w[0].filename == __file__


def test_buffer_size_does_nothing_and_says_so() -> None:
    with pytest.warns(DeprecationWarning, match=r"Client\(buffer_size=\.\.\.\) does nothing"):
        Client("127.0.0.1:1", session=False, buffer_size=8).close()
    with pytest.warns(DeprecationWarning, match=r"Client\(worker=\.\.\.\) is deprecated: use"):
        c = Client("127.0.0.1:1", session=False, worker="w1")
    assert c.name == "w1"
    c.close()


def test_wrong_and_doubled_options_are_refused() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'report_evry'"):
        Client("127.0.0.1:1", report_evry=5)
    with pytest.raises(TypeError, match="both report_every= and session="):
        Client("127.0.0.1:1", session=Session(), report_every=5)
    with pytest.raises(TypeError, match=r"both token= and Connection\(token=\.\.\.\)"):
        Client("127.0.0.1:1", token="a", connection=Connection(token="b"))
    with pytest.raises(TypeError, match="session must be True, False or a chunkmaster.Session"):
        Client("127.0.0.1:1", session="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly one of addr and etcd_endpoints"):
        Client()


def test_each_group_checks_its_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match="shuffle_buffer must be 0"):
        Reading(shuffle_buffer=-1)
    with pytest.raises(ValueError, match="prefetch_tasks must be 0 or more"):
        Reading(prefetch_tasks=-1)
    with pytest.raises(ValueError, match="read_ahead must be 0"):
        Reading(read_ahead=-2)
    with pytest.raises(ValueError, match="limit on inflated bytes"):
        Reading(max_inflated_bytes=0)
    with pytest.raises(ValueError, match="report_every must be >= 0"):
        Session(report_every=-1)
    with pytest.raises(ValueError, match=r"Connection\(rpc_timeout=0\)"):
        Connection(rpc_timeout=0)
    with pytest.raises(ValueError, match=r"Connection\(retry_timeout=-1\)"):
        Connection(retry_timeout=-1)
    assert "secret" not in repr(Connection(token="secret"))  # never in a log line


def test_grouped_options_reach_the_master(tmp_path: Path) -> None:
    path = numbered_records(tmp_path / "d.rio", 30)
    with InProcessMaster(chunks_per_task=3, timeout_dur=60.0) as m:
        with Client(
            m.addr,
            name="grouped",
            session=Session(report_every=4),
            reading=Reading(prefetch_tasks=0),
        ) as c:
            c.set_dataset([path])
            assert sorted(c.records(0)) == [b"%06d" % i for i in range(30)]
            names = [t["name"] for t in c.status()["trainers"]]
        assert names == ["grouped"]


def test_the_paddle_readers_buf_size_warns(tmp_path: Path) -> None:
    objects = [{"i": i} for i in range(5)]
    path = tmp_path / "p.rio"
    with Writer(str(path)) as w:
        for o in objects:
            w.write(pickle.dumps(o))
    with pytest.warns(DeprecationWarning, match=r"recordio\(buf_size=\.\.\.\) does nothing"):
        local = recordio(str(path), 100)
    assert list(local()) == objects
    with InProcessMaster(chunks_per_task=1, timeout_dur=60.0) as m:
        with pytest.warns(DeprecationWarning, match=r"cloud_reader\(buf_size=\.\.\.\)"):
            reader = cloud_reader([str(path)], None, 5, 64, addr=m.addr)
        try:
            assert Counter(map(repr, reader())) == Counter(map(repr, objects))
        finally:
            reader.close()  # type: ignore[attr-defined]


def test_read_buffer_size_warns_and_is_hidden(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    path = numbered_records(tmp_path / "d.rio", 4)
    with InProcessMaster(chunks_per_task=1, timeout_dur=60.0) as m:
        with caplog.at_level(logging.WARNING, logger="chunkmaster.cli.read"):
            args = ["read", "--addr", m.addr, "--dataset", path, "--passes", "1"]
            assert main([*args, "--buffer-size", "8"]) == 0
        assert "--buffer-size does nothing and is deprecated: remove it" in caplog.text
    assert "pass 0: 4 records" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["read", "--help"])
    assert "--buffer-size" not in capsys.readouterr().out
