"""What a work source sees of the cluster: every known node's gossiped state and its liveness."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.coordination.p2p.membership import Liveness
from app.coordination.p2p.schemas import ClaimInfo, NodeState
from app.coordination.p2p.work_rules import WorkSpec


@dataclass(frozen=True)
class ClusterView:
    """What a work source sees: every known node's gossiped state and its liveness."""

    self_id: str
    term: int
    leader: str | None
    nodes: dict[str, NodeState]
    liveness: dict[str, Liveness]

    def alive(self) -> list[NodeState]:
        return [s for nid, s in self.nodes.items() if self.liveness.get(nid) is Liveness.ALIVE]

    def live_claims(self) -> list[tuple[str, ClaimInfo]]:
        """(holder, claim) of every claim an alive node gossips: what a new leader adopts."""
        return [(s.node_id, c) for s in self.alive() for c in s.claims]


WorkSource = Callable[[ClusterView], Iterable[WorkSpec]]
