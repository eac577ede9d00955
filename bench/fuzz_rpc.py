"""Fuzz every Master RPC of a real master process with random and malformed messages.

Not a speed bench: a long property run kept out of the quick suite. For each example it sends
either random bytes or a well-formed message with hostile field values (huge, negative,
non-finite, unicode), then checks that the master answered with a status code of the error
table (never UNKNOWN or INTERNAL), is still alive, reports JSON without NaN or Infinity, and that
a refused request (any non-OK answer to a report or save request) changed nothing. The Session
stream is fuzzed too: short streams of random bytes and hostile messages (Hello, NextTask,
KeepAlive, Commit, failures, Goodbye), whose stream status and every SessionError must carry a
code of the table.

    .venv/bin/python bench/fuzz_rpc.py --examples 2000
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chunkmaster.master.readiness import wait_ready
from chunkmaster.recordio import Writer
from chunkmaster.rpc import master_pb2 as pb

METHODS = {
    "SetDataset": pb.SetDatasetRequest,
    "GetTask": pb.GetTaskRequest,
    "TaskFinished": pb.TaskFinishedRequest,
    "TaskFailed": pb.TaskFailedRequest,
    "RequestSaveModel": pb.SaveModelRequest,
    "Status": pb.StatusRequest,
}
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
ints = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-3, 20))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-5, 5))
texts = st.text(max_size=64)


def _get_task(p: int, w: float, r: str) -> pb.GetTaskRequest:
    wait = min(w, 0.05) if math.isfinite(w) else w  # a finite wait stays short
    return pb.GetTaskRequest(pass_id=p, wait_seconds=wait, request_id=r)


def messages() -> st.SearchStrategy[tuple[str, bytes]]:
    meta = st.builds(pb.TaskMeta, id=ints, epoch=ints)
    finished = st.builds(pb.TaskFinishedRequest, task_id=ints, epoch=ints, pass_id=ints)
    save = st.builds(pb.SaveModelRequest, trainer_id=texts, block_seconds=floats)
    wellformed = st.one_of(
        st.tuples(st.just("SetDataset"), st.builds(pb.SetDatasetRequest, globs=st.lists(texts))),
        st.tuples(st.just("GetTask"), st.builds(_get_task, ints, floats, texts)),
        st.tuples(st.just("TaskFinished"), finished),
        st.tuples(st.just("TaskFailed"), st.builds(pb.TaskFailedRequest, meta=meta, reason=texts)),
        st.tuples(st.just("RequestSaveModel"), save),
    )
    raw = st.tuples(st.sampled_from(sorted(METHODS)), st.binary(max_size=64))
    return st.one_of(wellformed.map(lambda m: (m[0], m[1].SerializeToString())), raw)


def _session_request(seq: int, body: dict[str, Any]) -> bytes:
    return pb.SessionRequest(seq=seq % 2**64, **body).SerializeToString()


def _hello(sid: str, name: str, host: str, pid: int) -> dict[str, Any]:
    return {"hello": pb.Hello(session_id=sid, name=name, host=host, pid=pid)}


def _next(finished: list[Any], want: bool, p: int, w: float, r: str) -> dict[str, Any]:
    wait = min(w, 0.05) if math.isfinite(w) else w  # a finite wait stays short
    msg = pb.NextTask(finished=finished, want_task=want, pass_id=p, wait_seconds=wait, request_id=r)
    return {"next": msg}


def _failed(task: int, epoch: int, reason: str) -> dict[str, Any]:
    return {"failed": pb.TaskFailedRequest(meta=pb.TaskMeta(id=task, epoch=epoch), reason=reason)}


def session_streams() -> st.SearchStrategy[list[bytes]]:
    records = st.integers(0, 2**64 - 1)
    pos = st.builds(pb.TaskPosition, task_id=ints, epoch=ints, pass_id=ints, records=records)
    positions = st.lists(pos, max_size=3)
    bodies = st.one_of(
        st.builds(_hello, st.one_of(st.just(""), texts), texts, texts, ints),
        st.builds(_next, positions, st.booleans(), ints, floats, texts),
        st.builds(lambda ps: {"keep_alive": pb.KeepAlive(progress=ps)}, positions),
        st.builds(lambda ps: {"commit": pb.Commit(positions=ps)}, positions),
        st.builds(lambda ps: {"goodbye": pb.Goodbye(progress=ps)}, positions),
        st.builds(_failed, ints, ints, texts),
        st.just({}),
    )
    item = st.one_of(
        st.tuples(ints, bodies).map(lambda sb: _session_request(*sb)), st.binary(max_size=48)
    )
    framed = st.lists(item, max_size=4).map(
        lambda rest: [_session_request(1, {"hello": pb.Hello(name="fuzz")}), *rest]
    )
    return st.one_of(framed, st.lists(item, min_size=1, max_size=4))


def _saver(status: dict[str, Any]) -> str | None:
    saver = status["save_model"]
    return None if saver is None else str(saver["trainer_id"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="chunkmaster-fuzz-"))
    with Writer(str(tmp / "d.rio"), max_chunk_size=64) as w:
        for i in range(50):
            w.write(b"%04d" % i)
    ready, log = tmp / "ready.json", tmp / "master.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chunkmaster", "master", "--port", "0", "--store", str(tmp / "s.db"),
         "--chunk-per-task", "1", "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"),  # noqa: SIM115
    )  # fmt: skip
    addr = str(wait_ready(ready, proc, 60, log.read_text)["addr"])
    channel = grpc.insecure_channel(addr)
    calls = {
        name: channel.unary_unary(f"/chunkmaster.v1.Master/{name}", lambda b: b, lambda b: b)
        for name in METHODS
    }

    def status() -> dict[str, Any]:
        reply = pb.StatusResponse.FromString(calls["Status"](b"", timeout=10))
        parsed: dict[str, Any] = json.loads(reply.json, parse_constant=_no_constants)
        return parsed

    dataset = pb.SetDatasetRequest(globs=[str(tmp / "d.rio")])
    calls["SetDataset"](dataset.SerializeToString(), timeout=30)
    findings: list[str] = []
    counts = {"examples": 0, "refused": 0}

    @settings(max_examples=args.examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(messages())
    def one(msg: tuple[str, bytes]) -> None:
        name, body = msg
        counts["examples"] += 1
        before = status()
        try:
            calls[name](body, timeout=10)
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
        if code not in ALLOWED:
            findings.append(f"{name} {body!r}: {code}")
        assert proc.poll() is None, "the master died"
        after = status()
        if code is not grpc.StatusCode.OK and name != "GetTask":
            counts["refused"] += 1
            for key in ("cur_pass", "todo", "pending", "done", "failed"):
                if before[key] != after[key]:
                    findings.append(f"refused {name} {body!r} changed {key}")
            if _saver(after) not in (None, _saver(before)):  # a window may only expire
                findings.append(f"refused {name} {body!r} changed the save lock")

    codes = {c.value[0] for c in ALLOWED}
    session = channel.stream_stream(
        "/chunkmaster.v1.Master/Session", lambda b: b, pb.SessionResponse.FromString
    )

    @settings(max_examples=args.examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(session_streams())
    def stream(items: list[bytes]) -> None:
        counts["streams"] += 1
        try:
            for resp in session(iter(items), timeout=10):
                if resp.WhichOneof("body") == "error" and resp.error.code not in codes:
                    findings.append(f"Session {items!r}: SessionError code {resp.error.code}")
        except grpc.RpcError as exc:
            if exc.code() not in ALLOWED:  # type: ignore[attr-defined]
                findings.append(f"Session {items!r}: {exc.code()}")  # type: ignore[attr-defined]
        assert proc.poll() is None, "the master died"
        status()  # still strict JSON

    counts["streams"] = 0
    try:
        one()
        stream()
    finally:
        channel.close()
        proc.terminate()
        proc.wait(30)
    print(
        f"{counts['examples']} examples, {counts['refused']} refused, "
        f"{counts['streams']} session streams, {len(findings)} findings"
    )
    for f in findings[:20]:
        print("  ", f)
    return 1 if findings else 0


def _no_constants(name: str) -> Any:
    raise ValueError(f"status JSON holds {name}")


if __name__ == "__main__":
    sys.exit(main())
