"""The event loop's own lag: how long this node was not running, so that its timeouts are
judged by the time it could have heard from its peers, not by the wall clock alone.

On a starved machine (three full nodes on two cores) a process is descheduled for hundreds of
milliseconds at a time; when it runs again, its clock says the leader was silent for the
whole stall, while the leader's heartbeats sit unread in its socket buffers. A node that then
starts an election (or grants one) on the strength of its own stall makes leadership churn.
So a `LoopLag` sleeps in short ticks and adds up how far each wake-up overshot: `stalled`
is the total, and a timeout started at mark `m` is extended by `stalled - m` (`judged_age`),
as raft's pre-vote and check-quorum are judged against the same clock. The leader's lease is
never extended this way: a leader stalled past its lease stops mutating at once, and steps
down only when an election timeout (less its stalls) passed without a quorum's acks.
"""

from __future__ import annotations

import asyncio
import time


def judged_age(raw_age: float, own_stall: float) -> float:
    """How long a peer was silent as this node could have heard it: the wall time less the
    time this node itself was stalled meanwhile (never below zero)."""
    return max(0.0, raw_age - max(0.0, own_stall))


def check_quorum_deadline(lease_until: float, lease: float, election_timeout: float, own_stall: float) -> float:
    """When a leader without a quorum's acks steps down (raft's check-quorum): an election
    timeout after the quorum's last ack, whose lease ran out earlier (`lease_until`: it stops
    mutating then), plus its own stalls since: followers do not elect another before their
    timeout, so a leader that was merely starved keeps its term instead of ending it."""
    return lease_until - lease + max(lease, election_timeout) + max(0.0, own_stall)


class LoopLag:
    """Total seconds this event loop overshot its ticks (monotonic, only grows)."""

    def __init__(self, tick: float, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self.tick = tick
        self.clock = clock
        self.realized = 0.0  # overshoots of the ticks that woke
        self._due: float | None = None  # when the pending tick should wake
        self.last = 0.0  # the last tick's overshoot
        self.worst = 0.0  # the largest single overshoot seen

    def observe(self, expected: float, actual: float) -> float:
        """One tick that should have taken `expected` s took `actual`: the overshoot, added up."""
        over = max(0.0, actual - expected)
        self.realized += over
        self.last = over
        self.worst = max(self.worst, over)
        return over

    @property
    def stalled(self) -> float:
        """Seconds stalled so far, the tick now overdue included: after a stall, whichever
        timer the loop runs first sees it, not only the lag's own."""
        pending = 0.0 if self._due is None else max(0.0, self.clock() - self._due)
        return self.realized + pending

    async def run(self) -> None:
        while True:
            start = self.clock()
            self._due = start + self.tick
            await asyncio.sleep(self.tick)
            self._due = None
            self.observe(self.tick, self.clock() - start)

    def since(self, mark: float) -> float:
        return max(0.0, self.stalled - mark)

    def status(self) -> dict[str, float]:
        return {"stalled_s": round(self.stalled, 3), "last_s": round(self.last, 4), "worst_s": round(self.worst, 3)}
