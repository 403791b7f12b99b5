"""The mesh's changes as events: a new leader (LEADER_ELECTED), a new quorum level
(QUORUM_CHANGED), and generations decided elsewhere (MODEL_PROMOTED), so the daemons that
act on them wake at once instead of finding out at their next safety-net poll.

Who acts (docs/ARCHITECTURE.md has the whole map): a new leader rebuilt its work queue, so
the export, train_join and gauntlet_shards daemons ask it for work; a quorum regained lets
the export and promote daemons claim and propose again; a promotion decided by another node
wakes the distribution daemon, which fetches the model.

`mesh_changes` is pure (what changed between two snapshots); `watch_mesh` is the loop that
reads the node's in-memory state and publishes. Reading memory every 0.2 s costs nothing
and keeps the mesh package free of the event router.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.coordination.daemons.event_router import EventRouter
from app.coordination.daemons.events import EventType
from app.log import get_logger

if TYPE_CHECKING:
    from app.coordination.p2p.node import MeshNode

log = get_logger(__name__)
WATCH_INTERVAL_S = 0.2


@dataclass(frozen=True)
class MeshSnapshot:
    term: int
    leader_id: str | None
    quorum_level: str
    alive_voters: int
    total_voters: int


def mesh_changes(before: MeshSnapshot | None, now: MeshSnapshot) -> list[tuple[EventType, dict[str, Any]]]:
    """The events that take `before` to `now`; none for the first snapshot's quorum level
    (nothing changed yet), but a leader known at start is announced (daemons may be waiting)."""
    events: list[tuple[EventType, dict[str, Any]]] = []
    if now.leader_id is not None and (before is None or (before.leader_id, before.term) != (now.leader_id, now.term)):
        events.append((EventType.LEADER_ELECTED, {"term": now.term, "leader_id": now.leader_id}))
    if before is not None and before.quorum_level != now.quorum_level:
        events.append((EventType.QUORUM_CHANGED, {
            "level": now.quorum_level, "previous": before.quorum_level,
            "alive_voters": now.alive_voters, "total_voters": now.total_voters}))
    return events


def snapshot(node: MeshNode) -> MeshSnapshot:
    view = node.cluster_view()
    alive = {state.node_id for state in view.alive()}
    voters = list(node.voters)
    return MeshSnapshot(term=node.term, leader_id=node.leader_id, quorum_level=node.quorum_level.name,
                        alive_voters=sum(v in alive for v in voters), total_voters=len(voters))


async def watch_mesh(node: MeshNode, router: EventRouter, interval_s: float = WATCH_INTERVAL_S) -> None:
    """Publish the mesh's changes until cancelled."""
    before: MeshSnapshot | None = None
    while True:
        now = snapshot(node)
        for event_type, payload in mesh_changes(before, now):
            log.info("mesh_event", event_type=event_type.value, **payload)
            await router.publish(event_type, payload)
        before = now
        await asyncio.sleep(interval_s)
