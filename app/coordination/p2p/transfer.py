"""Explicit leadership transfer (DESIGN.md: "leadership moves by explicit transfer").

A healthy leader is never preempted, not even by a higher-priority node that comes back, so
the way to move leadership (to a better machine, before maintenance) is to hand it over:

  1. the operator asks the leader: `POST /admin/transfer {"target": id}` (signed);
  2. the leader checks the target is another live voter, **steps down first** (it stops
     mutating at once, so no lease of the old leader overlaps the new one), and sends the
     target `POST /transfer/timeout_now` with its term;
  3. the target, if it still follows that leader in that term, stands for election at once,
     without a pre-vote; voters that follow the same leader waive their loyalty to it (and the
     bully preference) for this one vote; the term and one-vote-per-term rules still hold.

If the target never wins (it died meanwhile), the cluster elects a leader as after any leader
loss. `transfer_refusal` is the pure part; `Transferring` holds Consensus's two methods.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from app.coordination.p2p.consensus_core import ConsensusCore
from app.coordination.p2p.election import Role
from app.coordination.p2p.schemas import TimeoutNowRequest, TokenResponse
from app.log import get_logger

log = get_logger(__name__)


def transfer_refusal(is_leader: bool, self_id: str, target: str, voters: Iterable[str],
                     alive: Iterable[str]) -> str | None:
    """Why this node cannot hand leadership to `target` now, or None when it can."""
    if not is_leader:
        return "not the leader"
    if target == self_id:
        return f"{target} is already the leader"
    if target not in set(voters):
        return f"{target} is not a voter: only voters may lead"
    if target not in set(alive):
        return f"{target} is not alive"
    return None


class Transferring(ConsensusCore):
    async def transfer_leadership(self, target: str, alive: Iterable[str]) -> str | None:
        """Leader: step down and hand over to `target`; None once the handover was delivered,
        else why not (nothing changed when refused before stepping down)."""
        refusal = transfer_refusal(self.role is Role.LEADER, self.node_id, target, self.voters, alive)
        if refusal is not None:
            return refusal
        addr = self.addr_of(target)
        if not addr:
            return f"no address known for {target}"
        term = self.term
        self.step_down(f"transferring leadership to {target}")
        self.last_leader_contact = time.monotonic()  # no election of our own, no vote but the target's, for a while
        log.info("leadership_transfer", term=term, target=target)
        answer = await self.client.post(addr, "/transfer/timeout_now", TimeoutNowRequest(term=term, leader_id=self.node_id),
                                        TokenResponse, self.timing.request_timeout, expect=target)
        if answer is None or not answer.ok:
            return f"{target} did not take the handover; the cluster elects a leader as after a leader loss"
        return None

    def handle_timeout_now(self, sender: str, req: TimeoutNowRequest) -> TokenResponse:
        """Target: stand for election now if the handover comes from our leader in our term."""
        if req.term != self.term or sender != req.leader_id or req.leader_id != self.leader_id or not self.is_voter:
            return TokenResponse(ok=False, reason=f"handover from {sender} for {req.leader_id} in term {req.term} "
                                                  f"does not match term {self.term}, leader {self.leader_id}")
        self.spawn(self.run_election(transfer_from=req.leader_id))
        return TokenResponse(ok=True)
