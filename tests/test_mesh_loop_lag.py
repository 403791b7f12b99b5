"""The event loop's own lag (issue 54, item 3): timeouts are judged less this node's stalls."""

from __future__ import annotations

import asyncio
import time

from hypothesis import given
from hypothesis import strategies as st

from app.coordination.p2p.loop_lag import LoopLag, check_quorum_deadline, judged_age

seconds = st.floats(0, 1e6, allow_nan=False)


@given(raw=seconds, stall=st.floats(-10, 1e6, allow_nan=False))
def test_a_stall_shortens_the_judged_silence_never_below_zero_never_above_the_wall(raw: float, stall: float) -> None:
    age = judged_age(raw, stall)
    assert 0.0 <= age <= raw
    assert age == max(0.0, raw - max(0.0, stall))


def test_overshoots_add_up() -> None:
    lag = LoopLag(0.1)
    assert lag.observe(0.1, 0.1) == 0.0 and lag.observe(0.1, 0.05) == 0.0
    assert abs(lag.observe(0.1, 2.1) - 2.0) < 1e-9 and abs(lag.since(0.0) - 2.0) < 1e-9
    assert lag.status()["worst_s"] == 2.0


async def test_a_blocked_loop_is_measured() -> None:
    lag = LoopLag(0.01)
    task = asyncio.create_task(lag.run())
    try:
        await asyncio.sleep(0.05)
        before = lag.stalled
        time.sleep(0.5)  # the loop blocked, as a starved process is
        deadline = time.monotonic() + 5
        while lag.since(before) < 0.4 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert lag.since(before) >= 0.4
    finally:
        task.cancel()


def test_an_overdue_tick_counts_before_it_wakes() -> None:
    now = [100.0]
    lag = LoopLag(0.1, clock=lambda: now[0])
    lag._due = 100.1  # a tick pending, as in run()
    now[0] = 103.1
    assert abs(lag.stalled - 3.0) < 1e-9  # seen by any timer that runs first
    lag._due = None
    lag.observe(0.1, 3.1)
    assert abs(lag.stalled - 3.0) < 1e-9  # the same stall, counted once


@given(until=st.floats(0, 1e6, allow_nan=False), lease=st.floats(0.1, 10, allow_nan=False),
       timeout=st.floats(0.1, 20, allow_nan=False), stall=st.floats(-5, 100, allow_nan=False))
def test_a_leader_steps_down_no_sooner_than_its_lease_and_an_election_timeout_after_the_last_acks(
        until: float, lease: float, timeout: float, stall: float) -> None:
    deadline = check_quorum_deadline(until, lease, timeout, stall)
    assert deadline >= until - 1e-6  # never before the lease ran out
    assert deadline >= until - lease + timeout + max(0.0, stall) - 1e-6  # an election timeout after the acks
    assert abs(check_quorum_deadline(until, lease, timeout, stall + 1) - deadline - (1 if stall >= 0 else
                                                                                     max(0.0, stall + 1))) < 1e-6
