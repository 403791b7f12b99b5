"""Membership table and gossip merge rules, without I/O.

Each node bumps its own `version` every gossip round (a heartbeat counter), so a newer
(incarnation, version) of a peer, however it arrived, is evidence that the peer was alive
recently. Suspicion is local: a peer whose stamp has not advanced for `suspect_after` is
SUSPECT, for `dead_after` DEAD. Peers also gossip their view; a node that finds itself
reported SUSPECT or DEAD refutes by bumping its incarnation, which outranks every older stamp.

The class takes `now` as an argument everywhere so the same code runs inside the node and in
the single-process gossip simulation of `scripts/bench_mesh.py`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

from app.coordination.p2p.schemas import GossipMessage, NodeState


class Liveness(str, Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


def liveness_of(age: float, suspect_after: float, dead_after: float) -> Liveness:
    if age < suspect_after:
        return Liveness.ALIVE
    if age < dead_after:
        return Liveness.SUSPECT
    return Liveness.DEAD


def is_newer(incoming: NodeState, known: NodeState | None) -> bool:
    return known is None or incoming.stamp() > known.stamp()


@dataclass
class PeerRecord:
    state: NodeState
    last_seen: float  # monotonic time the stamp last advanced or the node talked to us


class Membership:
    """The local node's state plus the latest known state of every other node."""

    def __init__(
        self, local: NodeState, suspect_after: float, dead_after: float, now: float
    ) -> None:
        self.local = local
        self.suspect_after = suspect_after
        self.dead_after = dead_after
        self.peers: dict[str, PeerRecord] = {}
        self._started = now

    # -- local state -----------------------------------------------------------------
    @property
    def node_id(self) -> str:
        return self.local.node_id

    def update_local(self, **fields: object) -> None:
        """Change what this node gossips about itself; the version bump makes it win."""
        self.local = self.local.model_copy(
            update={**fields, "version": self.local.version + 1}
        )

    def tick(self) -> None:
        """One heartbeat of the gossip counter."""
        self.local = self.local.model_copy(update={"version": self.local.version + 1})

    def refute(self) -> None:
        self.local = self.local.model_copy(
            update={"incarnation": self.local.incarnation + 1, "version": 0}
        )

    # -- merging ---------------------------------------------------------------------
    def touch(self, node_id: str, now: float) -> None:
        """Direct contact from `node_id` (it answered us or sent us something)."""
        rec = self.peers.get(node_id)
        if rec is not None:
            rec.last_seen = max(rec.last_seen, now)

    def merge_state(self, state: NodeState, now: float) -> bool:
        """Keep `state` if it is newer; True when it changed the table."""
        if state.node_id == self.node_id:
            if state.stamp() > self.local.stamp():
                # Someone holds a newer stamp of us than we do (we restarted without our
                # file): jump past it so our own updates win again.
                self.local = self.local.model_copy(
                    update={"incarnation": state.incarnation + 1, "version": 0}
                )
            return False
        rec = self.peers.get(state.node_id)
        if rec is None:
            self.peers[state.node_id] = PeerRecord(state, now)
            return True
        if is_newer(state, rec.state):
            rec.state = state
            rec.last_seen = max(rec.last_seen, now)
            return True
        return False

    def merge(self, message: GossipMessage, now: float) -> int:
        """Merge a gossip message; refute if the sender thinks we are not alive."""
        changed = sum(self.merge_state(s, now) for s in message.states)
        self.touch(message.sender, now)
        if message.view.get(self.node_id, Liveness.ALIVE.value) != Liveness.ALIVE.value:
            self.refute()
        return changed

    # -- reading ---------------------------------------------------------------------
    def liveness(self, node_id: str, now: float) -> Liveness:
        if node_id == self.node_id:
            return Liveness.ALIVE
        rec = self.peers.get(node_id)
        if rec is None:
            return Liveness.DEAD
        return liveness_of(now - rec.last_seen, self.suspect_after, self.dead_after)

    def view(self, now: float) -> dict[str, str]:
        out = {nid: self.liveness(nid, now).value for nid in self.peers}
        out[self.node_id] = Liveness.ALIVE.value
        return out

    def alive_ids(self, now: float) -> set[str]:
        return {nid for nid in self.peers if self.liveness(nid, now) is Liveness.ALIVE} | {
            self.node_id
        }

    def states(self) -> list[NodeState]:
        return [self.local] + [rec.state for rec in self.peers.values()]

    def state_of(self, node_id: str) -> NodeState | None:
        if node_id == self.node_id:
            return self.local
        rec = self.peers.get(node_id)
        return rec.state if rec else None

    def message(self, now: float) -> GossipMessage:
        return GossipMessage(sender=self.node_id, states=self.states(), view=self.view(now))

    def choose_targets(self, fanout: int, now: float, rng: random.Random) -> list[str]:
        """Up to `fanout` peers, live ones first; one dead peer now and then so healed
        partitions and restarted nodes are found again."""
        live = [n for n in self.peers if self.liveness(n, now) is not Liveness.DEAD]
        dead = [n for n in self.peers if self.liveness(n, now) is Liveness.DEAD]
        picked = rng.sample(live, min(fanout, len(live)))
        if dead and (len(picked) < fanout or rng.random() < 0.25):
            picked.append(rng.choice(dead))
        return picked
