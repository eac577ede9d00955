"""Checking that Client.close() ends everything the client started: its threads (and gRPC's
for its calls) gone, and no gRPC call object left for the garbage collector to delete at
interpreter exit (docs/client.md, "Threads and performance")."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import pytest

from chunkmaster.client import Client
from chunkmaster.client.connection import MasterConnection

#: The longest a test lets close() take: far above its bound (flush_timeout + 2 x rpc_timeout),
#: a deadline against a hang, not a measurement.
CLOSE_DEADLINE = 60.0


def track_calls(monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[Any]]:
    """Weak references to every gRPC call object the clients start from now on (session
    streams and long-polling GetTasks)."""
    out: list[weakref.ref[Any]] = []
    real_open, real_get = MasterConnection.open_session, MasterConnection.get_task_async

    def open_session(self: MasterConnection, requests: Any) -> Any:
        call = real_open(self, requests)
        out.append(weakref.ref(call))
        return call

    def get_task_async(self: MasterConnection, pass_id: int, **kw: Any) -> Any:
        pending = real_get(self, pass_id, **kw)
        out.append(weakref.ref(pending._future))
        return pending

    monkeypatch.setattr(MasterConnection, "open_session", open_session)
    monkeypatch.setattr(MasterConnection, "get_task_async", get_task_async)
    return out


def close_within(client: Client, flush_timeout: float = 5.0) -> None:
    """close() in another thread, failing the test (not hanging it) if it never returns."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            client.close(flush_timeout)
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=run, name="test-close")
    t.start()
    t.join(CLOSE_DEADLINE)
    assert not t.is_alive(), f"close() did not return within {CLOSE_DEADLINE}s"
    assert not failed, failed


def assert_all_ended(before: set[threading.Thread], calls: list[weakref.ref[Any]]) -> None:
    """No thread alive that was not in `before`; every call of `calls` deleted (some made)."""
    left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not left, f"threads still alive after close(): {left}"
    assert calls, "the client started no call: the scenario did not happen"
    alive = [ref() for ref in calls if ref() is not None]
    assert not alive, f"gRPC call objects left for the garbage collector: {alive}"
