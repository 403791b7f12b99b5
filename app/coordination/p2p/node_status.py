"""What `GET /status` shows of a node, and what a machine offers: read-only views of MeshNode."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.coordination.p2p.node import MeshNode


def node_status(node: "MeshNode") -> dict[str, Any]:
    """Node, role, term, leader, voters alive, quorum level, peers with state and last seen,
    the work queue (leader) and the claims it holds."""
    now = time.monotonic()
    m = node.membership
    alive = m.alive_ids(now)
    peers = []
    for nid, rec in sorted(m.peers.items()):
        peers.append({
            "node_id": nid, "addr": node.addr_of(nid), "state": m.liveness(nid, now).value,
            "last_seen_s": round(now - rec.last_seen, 3), "role": rec.state.role,
            "term": rec.state.term, "leader": rec.state.leader,
            "incarnation": rec.state.incarnation, "version": rec.state.version,
        })
    return {
        "node_id": node.node_id, "addr": node.addr, "role": node.role.value, "term": node.term,
        "leader": node.leader_id, "leader_addr": node.addr_of(node.leader_id) if node.leader_id else None,
        "voters": node.voters, "voters_alive": sorted(set(node.voters) & alive),
        "quorum_size": len(node.voters) // 2 + 1, "quorum_level": node.quorum_level.value,
        "lease_valid": node.consensus.lease_valid(now), "incarnation": m.local.incarnation,
        "peers": peers,
        "work": node.queue.summary() if node.is_leader else None,
        "claims_held": [c.model_dump() for c in m.local.claims],
        # what upper layers gossip about this node (games, models, best generation), minus long lists
        "inventory": {k: v for k, v in m.local.inventory.items() if not isinstance(v, list)},
    }


def default_capabilities() -> dict[str, Any]:
    """What this machine offers, cheaply detected (the GPU count is filled in by upper layers)."""
    mem_gb = 0.0
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        pass
    return {"cpus": os.cpu_count() or 1, "gpus": 0, "memory_gb": round(mem_gb, 1)}
