"""Membership table and gossip merge rules, without I/O.

Each node bumps its own `version` every gossip round (a heartbeat counter), so a newer
(incarnation, version) of a peer, however it arrived, is evidence that the peer was alive
recently. Suspicion is local: a peer whose stamp has not advanced for `suspect_after` is
SUSPECT, for `dead_after` DEAD. Peers also gossip their view; a node that finds itself
reported SUSPECT or DEAD refutes by bumping its incarnation, which outranks every older stamp.

A node's state is its owner's word: gossip carries it as the owner signed it (SignedState; the
node checks the signature before merging, `merge(check=...)`), and relays pass it on unchanged.
A state that comes straight from its owner replaces a stored one that claims a higher
incarnation than the owner itself does, so a forged incarnation, however high, is refuted by the
owner's next message. Where signatures cannot tell owners apart (the shared secret),
`relay_step` bounds how far a relayed state may move an incarnation, so no relay can push one
near the bound.

The table is bounded: configured peers (voters, pinned ids) are always kept; a peer learned
only from others' gossip is dropped once nothing fresh was heard of it for `evict_after`, and
when the table is full a new stranger is not added. A peer is *credible* when it is configured,
talked to us itself, or its stamp advanced since we first heard of it (it is alive somewhere);
a name that merely appeared in someone's gossip is not. The message this node gossips stays
under a byte budget (credible peers first), so no flood of fake peers can make our own gossip
too large for the others to accept; leader heartbeats and most gossip go to credible peers.

The class takes `now` as an argument everywhere so the same code runs inside the node and in
the single-process gossip simulation of `scripts/bench_mesh.py`.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from pydantic import ValidationError

from app.coordination.p2p.jsonwire import BadJson, parse_json
from app.coordination.p2p.schemas import MAX_TERM, GossipMessage, NodeState, SignedState, state_text

FIRST_SIGHT_MAX = 2**32  # a relayed incarnation of a node never seen before (one per boot: decades of restarts)
StateCheck = Callable[[NodeState, SignedState], bool]  # the owner's signature is good (node.py)
Refused = Callable[[str, str], None]  # (node id the state is of, why)


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
    envelope: SignedState  # the state as its owner signed it: what we gossip on
    size: int = 0  # bytes of its signed state, for the message budget
    direct: float | None = None  # monotonic time it last talked to us itself
    advanced: float | None = None  # monotonic time its stamp last advanced after we first heard of it


def _size(envelope: SignedState) -> int:
    return len(envelope.state) + len(envelope.sig) + len(envelope.cert or "") + 32


@functools.lru_cache(maxsize=32)
def _decoded(text: str) -> NodeState:
    return NodeState.model_validate(parse_json(text))


def decode(envelope: SignedState) -> NodeState:
    """The state a signed envelope carries; ValueError when it is not a valid NodeState.

    The same text arrives several times (checked by the gossip handler, then merged; relayed
    by every peer until the owner's next version), so the last few decoded states are kept by
    their text: parsing them was most of a loaded node's event loop. The states are read only
    (every change is a `model_copy`), so sharing one object is safe. Failures are not kept."""
    try:
        return _decoded(envelope.state)
    except (BadJson, ValidationError) as exc:
        raise ValueError(f"malformed gossiped state: {str(exc)[:300]}") from None


class Membership:
    """The local node's state plus the latest known state of every other node."""

    def __init__(
        self, local: NodeState, suspect_after: float, dead_after: float, now: float,
        known: Iterable[str] = (), max_peers: int = 1024, evict_after: float | None = None,
        message_budget: int = 768 * 1024, sign: Callable[[bytes], tuple[str, str | None]] | None = None,
        relay_step: int | None = None,
    ) -> None:
        """`sign`: how this node signs its own state (None: unsigned, for simulations);
        `relay_step`: how far a relayed state may raise a known incarnation (None: no bound,
        when every state carries its owner's own signature)."""
        self.local = local
        self.sign = sign
        self.relay_step = relay_step
        self._envelope: tuple[NodeState, SignedState] | None = None
        self.suspect_after = suspect_after
        self.dead_after = dead_after
        self.known = set(known) - {local.node_id}  # configured: never evicted, always room
        self.max_peers = max_peers
        self.evict_after = evict_after if evict_after is not None else 10 * dead_after
        self.message_budget = message_budget
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
            update={"incarnation": min(MAX_TERM, self.local.incarnation + 1), "version": 0}
        )

    def local_envelope(self) -> SignedState:
        """Our state as we sign it, signed again only when it changed."""
        if self._envelope is None or self._envelope[0] is not self.local:
            text = self.local.model_dump_json()
            sig, cert = self.sign(state_text(text)) if self.sign is not None else ("", None)
            self._envelope = (self.local, SignedState(state=text, sig=sig, cert=cert))
        return self._envelope[1]

    # -- merging ---------------------------------------------------------------------
    def touch(self, node_id: str, now: float) -> None:
        """Direct contact from `node_id` (it answered us or sent us something)."""
        rec = self.peers.get(node_id)
        if rec is not None:
            rec.last_seen = max(rec.last_seen, now)
            rec.direct = now

    def credible(self, node_id: str, now: float) -> bool:
        """Configured; or, within `dead_after`, it talked to us itself or its stamp advanced."""
        rec = self.peers.get(node_id)
        if node_id in self.known:
            return True
        if rec is None:
            return False
        return any(t is not None and now - t < self.dead_after for t in (rec.direct, rec.advanced))

    def evict(self, now: float) -> list[str]:
        """Drop peers nobody configured that nothing fresh was heard of for `evict_after`."""
        gone = [nid for nid, rec in self.peers.items()
                if nid not in self.known and now - rec.last_seen >= self.evict_after]
        for nid in gone:
            del self.peers[nid]
        return gone

    def merge_state(self, state: NodeState, now: float, envelope: SignedState | None = None,
                    direct: bool = False, refused: Refused | None = None) -> bool:
        """Keep `state` if it is newer (or, `direct` from its owner, if the stored one claims
        more than the owner does); True when it changed the table."""
        envelope = envelope or SignedState(state=state.model_dump_json())
        if state.node_id == self.node_id:
            ceiling = MAX_TERM - 1 if self.relay_step is None else \
                max(FIRST_SIGHT_MAX, self.local.incarnation + self.relay_step)
            if state.stamp() > self.local.stamp() and state.incarnation <= ceiling:
                # Someone holds a newer stamp of us than we do (we restarted without our
                # file, or a forger): jump past it so our own updates win again.
                self.local = self.local.model_copy(
                    update={"incarnation": state.incarnation + 1, "version": 0}
                )
            return False
        rec = self.peers.get(state.node_id)
        if not direct and self.relay_step is not None:
            ceiling = FIRST_SIGHT_MAX if rec is None else max(FIRST_SIGHT_MAX, rec.state.incarnation + self.relay_step)
            if state.incarnation > ceiling:
                if refused is not None:
                    refused(state.node_id, f"a relayed incarnation {state.incarnation} of {state.node_id} "
                                           f"is above {ceiling}: only the node itself may raise it that far")
                return False
        if rec is None:
            if state.node_id not in self.known and self._strangers() >= self.max_peers - len(self.known):
                self.evict(now)
                if self._strangers() >= self.max_peers - len(self.known):
                    return False  # full of peers heard of recently: a stranger waits
            self.peers[state.node_id] = PeerRecord(state, now, envelope, _size(envelope))
            return True
        owner_refutes = direct and state.incarnation < rec.state.incarnation
        if is_newer(state, rec.state) or owner_refutes:
            rec.state, rec.envelope = state, envelope
            rec.size = _size(envelope)
            rec.last_seen = max(rec.last_seen, now)
            rec.advanced = now
            return True
        return False

    def _strangers(self) -> int:
        return len(self.peers) - sum(1 for k in self.known if k in self.peers)

    def merge(self, message: GossipMessage, now: float, check: StateCheck | None = None,
              direct: str | None = None, refused: Refused | None = None) -> int:
        """Merge a gossip message (`direct`: the proven sender, whose own state is its word);
        refute if the sender thinks we are not alive. `check` is asked only about states that
        would change the table, so an unchanged state costs no signature check."""
        changed = 0
        for envelope in message.states:
            try:
                state = decode(envelope)
            except ValueError as exc:
                if refused is not None:
                    refused(message.sender, str(exc))
                continue
            if not self._would_change(state, direct == state.node_id):
                continue
            if check is not None and not check(state, envelope):
                continue
            changed += self.merge_state(state, now, envelope, direct=direct == state.node_id, refused=refused)
        self.touch(message.sender, now)
        if message.view.get(self.node_id, Liveness.ALIVE.value) != Liveness.ALIVE.value:
            self.refute()
        return changed

    def _would_change(self, state: NodeState, direct: bool) -> bool:
        if state.node_id == self.node_id:
            return state.stamp() > self.local.stamp()
        rec = self.peers.get(state.node_id)
        return rec is None or is_newer(state, rec.state) or (direct and state.incarnation < rec.state.incarnation)

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
        """Our state and the peers' under the byte budget: credible peers first, then the
        most recently refreshed."""
        order = sorted(self.peers.items(), key=lambda kv: (not self.credible(kv[0], now), -kv[1].last_seen))
        own = self.local_envelope()
        budget = self.message_budget - _size(own)
        states, view = [own], {self.node_id: Liveness.ALIVE.value}
        for nid, rec in order[:4095]:
            budget -= rec.size + 64
            if budget < 0:
                break
            states.append(rec.envelope)
            view[nid] = self.liveness(nid, now).value
        return GossipMessage(sender=self.node_id, states=states, view=view)

    def choose_targets(self, fanout: int, now: float, rng: random.Random) -> list[str]:
        """Up to `fanout` live peers: half of them credible (a flood of made-up names cannot crowd
        those out), the rest drawn from all live peers (so gossip mixes and no closed clique
        forms); one dead peer now and then, so healed partitions and restarted nodes are found."""
        live = [n for n in self.peers if self.liveness(n, now) is not Liveness.DEAD]
        near = [n for n in live if self.credible(n, now)]
        picked = rng.sample(near, min((fanout + 1) // 2, len(near)))  # credible ones always get slots
        chosen = set(picked)
        others = [n for n in live if n not in chosen]  # the rest uniformly: no closed cliques
        picked += rng.sample(others, min(fanout - len(picked), len(others)))
        dead = [n for n in self.peers if self.liveness(n, now) is Liveness.DEAD]
        if dead and (len(picked) < fanout or rng.random() < 0.25):
            picked.append(rng.choice(dead))
        return picked
