"""The outbox on its own: what awaits an answer, sent again on a new stream or a new session."""

from __future__ import annotations

from chunkmaster.client.outbox import Outbox
from chunkmaster.client.stream import SessionStream
from chunkmaster.rpc import master_pb2 as pb


def _sent(stream: SessionStream) -> list[int]:
    seqs = []
    while not stream.queue.empty():
        req = stream.queue.get()
        assert req is not None
        seqs.append(req.seq)
    return seqs


def test_what_awaits_an_answer_goes_again_in_order_on_the_next_stream() -> None:
    box = Outbox()
    box.send("keep_alive", pb.KeepAlive(), False, 1.0)  # nothing to wait for: gone
    commit = box.send("commit", pb.Commit(), True, 1.0)
    ask = box.send("next", pb.NextTask(want_task=True, request_id="r"), True, 1.0)
    assert commit is not None and ask is not None
    assert box.asking() and box.pending[2].sent_at == 0.0  # no stream yet
    stream = SessionStream("m:1")
    assert box.resend(stream, 5.0) == 2
    assert _sent(stream) == [2, 3] and box.pending[3].sent_at == 5.0
    answered = box.answered(2)
    assert answered is not None and answered.reply is commit and box.answered(2) is None


def test_a_new_session_keeps_what_still_means_something() -> None:
    box = Outbox()
    failed = box.send("failed", pb.TaskFailedRequest(reason="x"), True, 0.0)
    finish = pb.TaskPosition(task_id=1)
    box.send("next", pb.NextTask(finished=[finish], want_task=True, request_id="old"), True, 0.0)
    gave_up = box.send("next", pb.NextTask(want_task=True, request_id="gone"), True, 0.0)
    box.send("next", pb.NextTask(finished=[finish]), True, 0.0)
    assert failed is not None and gave_up is not None
    assert len(box.carrying_finishes()) == 2
    gave_up.cancel()
    box.renew()
    assert failed.cancelled and sorted(box.pending) == [2, 4]
    asking = box.pending[2].request.next
    assert not asking.finished and asking.request_id not in ("old", "")
    assert not box.pending[4].request.next.finished and not box.carrying_finishes()


def test_a_session_over_without_the_goodbyes_ack_releases_its_waiter() -> None:
    box = Outbox()
    bye = box.send("goodbye", pb.Goodbye(), True, 0.0)
    assert bye is not None
    box.end_goodbye()
    assert bye.done and bye.result(0).ack.applied == 0 and not box.pending
