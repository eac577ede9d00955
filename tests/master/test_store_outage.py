"""The ledger's bookkeeping of a store that refuses writes (master/outage.py): plain values,
the times given."""

from __future__ import annotations

from chunkmaster.master.outage import StoreOutage


def outage() -> StoreOutage:
    return StoreOutage(retry_first=0.1, retry_max=5.0, log_every=30.0)


def test_an_outage_counts_its_attempts_and_logs_once_every_log_every() -> None:
    out = outage()
    out.begin("disk full", now=100.0)
    assert (out.error, out.since, out.attempts) == ("disk full", 100.0, 1)
    assert not out.failed_again("disk full", now=110.0)  # logged at 100: not again yet
    assert out.failed_again("read-only", now=130.0)
    assert not out.failed_again("read-only", now=150.0)
    assert (out.error, out.attempts, out.lasted(150.0)) == ("read-only", 4, 50.0)


def test_the_backoff_doubles_up_to_its_cap() -> None:
    out = outage()
    delays = [out.retry_first]
    for _ in range(8):
        delays.append(out.backoff(delays[-1]))
    assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
    assert delays[-1] == 5.0


def test_the_end_of_an_outage_forgets_it() -> None:
    out = outage()
    out.begin("disk full", now=1.0)
    out.next_retry_at = 2.0
    out.end()
    assert (out.error, out.since, out.next_retry_at, out.attempts) == (None, None, None, 0)
    assert out.lasted(9.0) == 0.0


def test_a_refusal_for_good_has_no_retry() -> None:
    out = outage()
    out.begin("etcd", now=1.0)
    out.next_retry_at = 2.0
    out.refuse_for_good("no longer the leader: lease lost")
    assert out.error == "no longer the leader: lease lost"
    assert out.next_retry_at is None
