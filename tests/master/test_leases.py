"""The lease keeper's order of expiry (master/leases.py): leases are kept in the order of their
last renewal, renewed in O(1), and a silent session ends when its own lease runs out, not when
the lease it had before its last message would have. A unit test of that logic on a clock the
test moves; the ends seen from outside are in tests/master/test_session_stream.py."""

from __future__ import annotations

from helpers.aio import run, until
from helpers.clock import Clock

from chunkmaster.master.leases import LeaseKeeper


def test_a_renewed_lease_moves_behind_the_others_and_the_oldest_ends_first() -> None:
    clock = Clock(0.0)
    ended: list[str] = []

    async def main() -> None:
        async def end(sid: str) -> None:
            ended.append(sid)
            keeper.drop(sid)

        keeper = LeaseKeeper(10.0, end, clock)
        for t, sid in [(0.0, "a"), (1.0, "b"), (2.0, "c")]:
            clock.now = t
            keeper.renew(sid)
        clock.now = 3.0
        keeper.renew("a")  # a's lease now runs to 13: after b's (11) and c's (12)
        clock.now = 12.5
        keeper.start()
        try:
            await until(lambda: len(ended) == 2, f"b and c to end (ended: {ended})")
            # The keeper waits on the clock again: it looked at a's lease and found it live.
            await until(lambda: clock.idle_timers() == 1, "the keeper to wait on the clock")
            assert ended == ["b", "c"]
            lease = keeper.get("a")
            assert lease is not None and lease.expires == 13.0 and lease.heard == 3.0
            clock.now = 13.5
            await until(lambda: ended == ["b", "c", "a"], f"a to end (ended: {ended})")
            assert keeper.get("a") is None
        finally:
            await keeper.close()

    run(main())


def test_a_lease_whose_ending_failed_is_retried_without_holding_up_the_others() -> None:
    clock = Clock(0.0)
    tried: list[str] = []
    ended: list[str] = []

    async def main() -> None:
        async def end(sid: str) -> None:
            tried.append(sid)
            if sid == "a" and tried.count("a") == 1:
                raise RuntimeError("the journal is unavailable")
            ended.append(sid)
            keeper.drop(sid)

        keeper = LeaseKeeper(10.0, end, clock)
        keeper.grant(["a", "b", "c"])
        clock.now = 100.0
        keeper.start()
        try:
            await until(lambda: ended == ["b", "c"], f"b and c to end (tried: {tried})")
            retried = keeper.get("a")  # still shown (status), due again a second later
            assert retried is not None and retried.expires == 101.0
            clock.now = 101.5
            await until(lambda: ended == ["b", "c", "a"], f"a's retry (tried: {tried})")
            assert tried == ["a", "b", "c", "a"]
        finally:
            await keeper.close()

    run(main())
