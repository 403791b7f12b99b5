"""Gossip, the node's side: push-pull rounds with a few peers, and what is believed of the answers.

Every state in a gossip message must carry its owner's signature (identity.py over
schemas.state_text); one that does not is refused and counted (`state_*` refusals), so a member
cannot say anything about another node, whatever it relays. A gossip answer is believed only
when the node that signed it is the sender it names. The merge rules themselves (newer stamp
wins, the owner's own word refutes, a relayed incarnation moves by bounded steps under the
shared secret) are membership.py's, without I/O.
"""

from __future__ import annotations

import asyncio
import random
import time

from app.config.mesh import TimingProfile
from app.coordination.p2p.client import MeshClient
from app.coordination.p2p.consensus import Consensus
from app.coordination.p2p.identity import AuthError, Identity
from app.coordination.p2p.membership import Membership
from app.coordination.p2p.refusals import Refusals
from app.coordination.p2p.schemas import GossipMessage, NodeState, SignedState, state_text


class Gossiping:
    """MeshNode's gossip: the attributes below are the node's."""

    membership: Membership
    consensus: Consensus
    client: MeshClient
    identity: Identity
    refusals: Refusals
    timing: TimingProfile
    pinned: dict[str, str]
    seeds: list[str]
    seed_ids: dict[str, str]
    _gossip_in_flight: set[str]
    _bg: set[asyncio.Task]
    _rng: random.Random

    @property
    def addr(self) -> str: ...  # MeshNode's
    def addr_of(self, node_id: str) -> str | None: ...  # MeshNode's

    def _sync_local(self) -> None:
        c, local = self.consensus, self.membership.local
        if (local.role, local.term, local.leader) != (c.role.value, c.term, c.leader_id):  # else: no re-signing
            self.membership.local = local.model_copy(update={"role": c.role.value, "term": c.term, "leader": c.leader_id})

    def gossip_round(self) -> None:
        """Bump our heartbeat counter and push-pull with up to `fanout` peers (+ unknown seeds)."""
        now = time.monotonic()
        self._sync_local()
        self.membership.tick()
        self.membership.evict(now)
        targets = [(nid, self.addr_of(nid)) for nid in self.membership.choose_targets(
            self.timing.gossip_fanout, now, self._rng)]
        known_addrs = {self.addr_of(n) for n in self.membership.peers}
        targets += [(nid, addr) for nid, addr in self.pinned.items() if nid not in self.membership.peers]
        targets += [(None, seed) for seed in self.seeds if seed not in self.seed_ids or seed not in known_addrs]
        for nid, addr in targets:
            if not addr or addr in self._gossip_in_flight or addr == self.addr:
                continue
            self._gossip_in_flight.add(addr)
            task = asyncio.create_task(self._gossip_one(addr))
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)

    def gossip_message(self) -> GossipMessage:
        """What we gossip: our signed state and the peers' as their owners signed them."""
        self._sync_local()
        return self.membership.message(time.monotonic())

    async def _gossip_one(self, addr: str) -> None:
        try:
            msg = self.gossip_message()
            reply = await self.client.post(addr, "/gossip", msg, GossipMessage, self.timing.request_timeout)
            if reply is None:
                return
            answerer = self.client.peers.get(addr, ("", 0))[0]  # whose signed answer it was
            if reply.sender != answerer:
                self.refusals.refused_in(answerer or addr, "answer_sender",
                                         f"a gossip answer signed by {answerer} names {reply.sender} as its sender")
                return
            if addr in self.seeds:
                self.seed_ids[addr] = reply.sender
            self.absorb(reply, direct=reply.sender)
        finally:
            self._gossip_in_flight.discard(addr)

    def absorb(self, message: GossipMessage, direct: str | None = None) -> None:
        """Merge gossip (either direction; `direct`: the proven sender). Each state must carry its
        owner's signature; one that does not is refused and counted. The terms states carry are
        what nodes say of themselves, never adopted: terms move only through votes, heartbeats
        and commits (gossiped terms are only the reference that bounds their steps)."""

        def owner_signed(state: NodeState, envelope: SignedState) -> bool:
            try:
                self.identity.verify(state.node_id, state_text(envelope.state), envelope.sig, envelope.cert)
            except AuthError as exc:
                self.refusals.refused_in(direct or message.sender, f"state_{exc.code}",
                                         f"gossiped state of {state.node_id}: {exc}")
                return False
            return True

        def refused(node_id: str, why: str) -> None:
            self.refusals.refused_in(direct or message.sender, "state_refused", why[:300])

        self.membership.merge(message, time.monotonic(), check=owner_signed, direct=direct, refused=refused)
