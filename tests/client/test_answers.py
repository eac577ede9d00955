"""The table of what the master's answers mean to a trainer, and the wait log."""

from __future__ import annotations

import logging

import grpc
import pytest

from chunkmaster.client.answers import Act, meaning
from chunkmaster.client.connection import TransportError
from chunkmaster.client.errors import NeverConnectedError
from chunkmaster.core import errors
from chunkmaster.waitlog import WaitLog


def test_each_answer_means_one_thing_where_it_is_met() -> None:
    assert meaning(errors.NoMoreAvailableError("x")).task is Act.WAIT
    assert meaning(errors.PassAfterError("x")).task is Act.POLL
    assert meaning(errors.PassBeforeError("x")).task is Act.END
    assert meaning(errors.JobStoppedError("x")).task is Act.STOP
    assert meaning(errors.UnavailableError("x")).report is Act.RETRY
    assert meaning(errors.NotReadyError("x")).report is Act.RETRY
    assert meaning(errors.PermissionDeniedError("x")).report is Act.SPLIT
    assert meaning(errors.SessionExpiredError("x")).reach is Act.RENEW
    assert meaning(errors.UnauthenticatedError("x")).reach is Act.STOP
    transport = TransportError("m:1", grpc.RpcError("refused"))
    assert meaning(transport).reach is Act.RECONNECT
    assert meaning(NeverConnectedError(transport, 1.0)).task is Act.STOP
    assert meaning(errors.MasterError("other")).task is Act.RAISE
    assert meaning(ValueError("a bug")).reach is Act.RAISE


def test_a_wait_is_said_as_it_starts_then_every_so_often(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    monkeypatch.setattr("chunkmaster.waitlog.time.monotonic", lambda: now[0])
    waits = WaitLog(logging.getLogger("test.waits"), "pass 3", every=30.0)
    with caplog.at_level(logging.INFO, "test.waits"):
        assert waits.wait(KeyError, "no task free", first=logging.INFO)
        now[0] = 10.0
        assert not waits.wait(KeyError, "no task free")
        now[0] = 31.0
        waits.wait(KeyError, "no task free")
        assert waits.over() == 31.0 and waits.over() is None
        assert waits.wait(KeyError, "no task free", first=None)  # a new wait, said later
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (logging.INFO, "pass 3: no task free"),
        (logging.WARNING, "pass 3: no task free (for 31s, 3 tries)"),
    ]


def test_a_pass_s_answers_end_it_or_mean_a_wait(caplog: pytest.LogCaptureFixture) -> None:
    from chunkmaster.client.errors import EndOfPass
    from chunkmaster.client.fetcher import PassAnswers
    from chunkmaster.client.link import CancelToken

    answers = PassAnswers(4, CancelToken(), None)
    over = errors.PassBeforeError("the master is in pass 5")
    assert isinstance(answers.end(over, got_task=True, joined=False), EndOfPass)
    assert isinstance(answers.end(over, got_task=False, joined=False), errors.PassOverError)
    stopped = errors.JobStoppedError("budget")
    assert answers.end(stopped, got_task=True, joined=False) is stopped
    with pytest.raises(errors.UnavailableError):
        answers.end(errors.UnavailableError("x"), got_task=True, joined=False)
    with caplog.at_level(logging.INFO, "chunkmaster.client"):
        dry = errors.NoMoreAvailableError("none free")
        assert answers.end(dry, got_task=True, joined=False) is None
        assert answers.end(dry, got_task=True, joined=False) is None  # the same wait
        answers.tasks()
        quiet = PassAnswers(4, CancelToken(), None, (errors.NoMoreAvailableError,))
        assert quiet.end(dry, got_task=True, joined=False) is None
    assert [r.getMessage() for r in caplog.records] == [
        "pass 4: no task free; waiting for the other trainers' tasks to finish or come back"
    ]
