"""What `GET /status` shows of a node, and what a machine offers: read-only views of a node
(anything shaped like `StatusSource`; MeshNode is one)."""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

from app.coordination.p2p.consensus import Consensus
from app.coordination.p2p.election import TERM_ALERT, TERM_CEILING, QuorumLevel, Role
from app.coordination.p2p.identity import Identity
from app.coordination.p2p.membership import Membership
from app.coordination.p2p.persist import CommitStore
from app.coordination.p2p.refusals import Refusals
from app.coordination.p2p.work_queue import WorkQueue


class StatusSource(Protocol):
    node_id: str
    voters: list[str]
    boot: int
    consensus: Consensus
    membership: Membership
    queue: WorkQueue
    refusals: Refusals
    identity: Identity
    commits: CommitStore

    @property
    def addr(self) -> str: ...
    @property
    def role(self) -> Role: ...
    @property
    def term(self) -> int: ...
    @property
    def leader_id(self) -> str | None: ...
    @property
    def is_leader(self) -> bool: ...
    @property
    def quorum_level(self) -> QuorumLevel: ...
    def addr_of(self, node_id: str) -> str | None: ...


def node_status(node: StatusSource) -> dict[str, Any]:
    """Node, role, term, leader, voters alive, quorum level, peers with state, last seen and the
    last refusal each way (we_refused / they_refused: e.g. "clock 400 s ahead of ours"), the
    work queue (leader) and the claims it holds."""
    now = time.monotonic()
    m = node.membership
    alive = m.alive_ids(now)
    peers = []
    for nid in sorted(set(m.peers) | m.known):  # a configured peer we never heard from shows too
        addr = node.addr_of(nid)
        rec = m.peers.get(nid)
        peers.append({
            "node_id": nid, "addr": addr, "state": m.liveness(nid, now).value,
            "last_seen_s": round(now - rec.last_seen, 3) if rec else None,
            "role": rec.state.role if rec else None, "term": rec.state.term if rec else None,
            "leader": rec.state.leader if rec else None,
            "incarnation": rec.state.incarnation if rec else None, "version": rec.state.version if rec else None,
            "credible": m.credible(nid, now),
            "replication": rec.state.inventory.get("replication") if rec else None,  # its copies, as it gossips them
            **node.refusals.of_peer(nid, *([addr] if addr else [])),
        })
    return {
        "node_id": node.node_id, "addr": node.addr, "role": node.role.value, "term": node.term,
        "leader": node.leader_id, "leader_addr": node.addr_of(node.leader_id) if node.leader_id else None,
        "voters": node.voters, "voters_alive": sorted(set(node.voters) & alive),
        "quorum_size": len(node.voters) // 2 + 1, "quorum_level": node.quorum_level.value,
        "lease_valid": node.consensus.lease_valid(now), "incarnation": m.local.incarnation, "boot": node.boot,
        "auth": node.identity.mode,  # shared: every holder of the secret can sign as any node
        "trust": trust_status(node),
        "loop_lag": node.consensus.lag.status(),  # timeouts are judged less these stalls (loop_lag.py)
        "terms": term_status(node),
        "peers": peers,
        "work": node.queue.summary() if node.is_leader else None,
        "claims_held": [c.model_dump() for c in m.local.claims],
        # what upper layers gossip about this node (games, models, best generation), minus long lists
        "inventory": {k: v for k, v in m.local.inventory.items() if not isinstance(v, list)},
    }


def trust_status(node: StatusSource) -> dict[str, Any]:
    """What a compromised member could do here, and every refusal by reason (each field has one
    writer; a decided value or a leader needs a majority's signatures: quorum_cert.py)."""
    shared = node.identity.mode == "shared"
    c = node.consensus
    return {
        "certificates": True,
        "protects_against_compromised_member": not shared,
        **({"warning": "a shared secret does not protect against a compromised member: every holder can sign "
                       "as any node, votes and acks included; issue per-node keys (python -m "
                       "app.coordination.p2p.tls init) and set mesh.node_keys or mesh.tls"} if shared else {}),
        "leader_certified": c.leader_id is not None and c.certified.get(c.term) == c.leader_id,
        "decided_with_certificate": len(node.commits.certs),
        # an earlier version's mesh_commits.json: decided there without proof; not applied or gossiped (persist.py)
        "decided_before_certificates": {"count": len(node.commits.before_certificates),
                                        "keys": list(node.commits.before_certificates)[-20:]},
        "refused": {d: dict(sorted(v.items())) for d, v in node.refusals.counts.items()},
    }


def term_status(node: StatusSource) -> dict[str, Any]:
    """Terms refused for coming too far ahead (election.term_refusal), the last one, and how
    far this node's own term is from the ceiling: `alert` past election.TERM_ALERT, and
    `far_ahead` when its own term is beyond the bounded step of every other voter's (a term
    persisted before the rule, or set by hand: the others will not follow it)."""
    c = node.consensus
    others = [st.term for v in node.voters if v != node.node_id
              and (st := node.membership.state_of(v)) is not None]
    far_ahead = bool(others) and node.term > max(others) + c.max_term_step
    return {"refused": c.terms_refused, "last_refused": c.last_term_refusal, "ceiling": TERM_CEILING,
            "headroom": TERM_CEILING - node.term, "alert": node.term >= TERM_ALERT, "far_ahead": far_ahead}


def default_capabilities() -> dict[str, Any]:
    """What this machine offers, cheaply detected (the GPU count is filled in by upper layers)."""
    mem_gb = 0.0
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        pass
    return {"cpus": os.cpu_count() or 1, "gpus": 0, "memory_gb": round(mem_gb, 1)}
