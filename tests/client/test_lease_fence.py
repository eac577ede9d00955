"""The lease fence on its own: what a trainer may still read, on the times it is given."""

from __future__ import annotations

import grpc
import pytest

from chunkmaster.client.connection import TransportError
from chunkmaster.client.lease import LEASE_SAFE, LeaseFence
from chunkmaster.client.link import NeverConnectedError


def test_before_a_welcome_nothing_is_fenced() -> None:
    assert LeaseFence().ok(1e9)


def test_the_lease_holds_for_its_safe_part_after_an_answered_message() -> None:
    f = LeaseFence()
    f.welcomed(10.0)
    assert not f.heard(100.0, 100.1)  # nobody waited
    assert f.ok(100.0 + LEASE_SAFE * 10.0 - 0.01)
    assert not f.ok(100.0 + LEASE_SAFE * 10.0)
    assert f.waiting and f.ping(108.0)
    assert not f.ping(108.1)  # asked already
    assert not f.heard(99.0, 108.2)  # an older answer says nothing new
    assert f.heard(108.0, 108.2)  # the ping's answer: read on
    assert not f.waiting and f.ok(108.3)


def test_a_reading_trainer_pings_ahead_of_need() -> None:
    f = LeaseFence()
    f.welcomed(9.0)
    f.heard(0.0, 0.0)
    assert f.ok(2.0) and not f.ping(2.0)  # a third of the TTL has not passed
    assert f.ok(3.5) and f.ping(3.5)
    assert not f.ping(3.6)  # not reading since


def test_a_master_out_of_reach_ends_the_wait_with_its_failure() -> None:
    f = LeaseFence()
    f.welcomed(1.0)
    assert not f.ok(5.0)
    failure = NeverConnectedError(TransportError("m:1", grpc.RpcError("refused")), 5.0)
    assert f.unreachable(failure)
    assert not f.unreachable(failure)  # nobody waits now
    with pytest.raises(NeverConnectedError):
        f.ok(6.0)
    f.welcomed(1.0)  # reached again
    assert not f.ok(6.0)
