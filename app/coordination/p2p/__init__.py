"""The mesh: membership and gossip, bully-order election with a voter quorum, fenced work
claims, quorum commits, and the HTTP API on port 8770.

Modules (pure rules first, I/O at the edge):
    election.py    quorum_size, quorum_level, should_grant_vote, bully_rank, lease rules (pure)
    decision.py    one value per key: may_store, choose_value (pure)
    quorum_cert.py quorum certificates: the texts voters sign, certificate_refusal (pure, given a verifier)
    loop_lag.py    the event loop's own stalls, which timeouts are judged less of
    work_rules.py  WorkSpec, fits, token_refusal, adoption of a claim, when a completion is live (pure)
    completions.py work completes only by its claimant's signed completion that the leader admits
    schemas.py     wire models with bounded numbers (MAX_TERM) and typed capabilities
    membership.py  bounded node table, gossip merge, ALIVE -> SUSPECT -> DEAD, eviction (no I/O)
    view.py        ClusterView: what a work source sees
    persist.py     term/vote file, quorum-commit store, append-only history (atomic writes)
    identity.py    who signs: the shared secret (quick start) or this node's own key (node keys / TLS)
    auth.py        request signatures naming sender, receiver and its boot, checked before the body; replay cache
    answers.py     signed answers, bound to the request's nonce, method and path, checked by the caller
    jsonwire.py    bounded JSON in (finite numbers only), valid JSON out
    tls.py         the cluster tool: CA and per-node keys (`python -m app.coordination.p2p.tls init`), optional mutual TLS
    conn_guard.py  connection caps and header deadlines against slow and many clients
    refusals.py    refusals counted by reason (/metrics), last one per peer (/status), bounded logs
    client.py      signed client that learns who answers where
    consensus_core.py  shared state, the one transition function, `admit` (the gate of leader messages)
    deciding.py, transfer.py, consensus.py  Consensus: decisions, handover, election and heartbeats
    work_queue.py  the leader's queue (models in app/db/work_queue.py)
    node.py        MeshNode: wiring and loops; gossip.py: its gossip rounds (owner-signed states);
                   server.py: routes; node_status.py: /status; worker.py: WorkClient
    discovery.py   static peers, `tailscale status --json`

Embedding (what the orchestrator uses):

    node = MeshNode(settings, node_id=..., port=..., peers=[...], voters=[...], priority=0,
                    profile="lan", secret=None, work_source=None, capabilities=None)
    node.add_routes(routes, public=[("GET", "/models")])   # before start(); signed unless public
    node.set_work_source(fn)            # fn(ClusterView) -> Iterable[WorkSpec], leader calls it
    node.set_progress_provider(fn)      # fn() -> JSON-able, served at GET /progress
    await node.start(); ...; await node.stop()
    node.update_local_state(capabilities=..., inventory=..., claims=[ClaimInfo, ...])  # gossiped
    node.cluster_view()                 # ClusterView: nodes' gossiped NodeState + Liveness
    node.is_leader, node.term, node.leader_id, node.quorum_level, node.role, node.status()
    await node.decide(key, proposal) -> str | None  # leader: the key's one decided value (deciding.py):
                                        # read a quorum, finish what an earlier leader half-stored,
                                        # else have floor(V/2)+1 voters store `proposal`
    await node.commit(key, value) -> bool    # decide(key, value) == value
    node.stored_value(key) -> str | None     # this voter's stored value: tentative, never acted on
    node.commits.decided_values()       # what this node knows decided, each with its certificate
    node.decided_for_gossip(prefixes, n) / node.learn_decided(peer, entries)  # decided values over gossip
    WorkClient(node.client, node_id, addrs=lambda: [...]).claim() / renew / complete / fail

Rules (DESIGN.md, "The mesh"): quorum = floor(V/2)+1 of the configured voters; terms are
persisted before a vote; lower terms refused, higher terms obeyed; pre-vote plus leader
stickiness, so a healthy leader is never preempted; the leader's lease is shorter than the
election timeout and it steps down without quorum acks; quorum LOST is read-only.

Security: every node-to-node request is signed, with this node's own key (mesh.node_keys or
mesh.tls: a signature speaks only for the node its certificate names) or with the cluster's
shared secret (env MESH_SECRET, env MESH_SECRET_FILE, or mesh.secret / mesh.secret_file: the
quick start, which trusts every holder), and names its sender, its receiver and the receiver's
boot, so a request is good once, for one node, in one run of it, within seconds of its signed
time; the signature covers the body's digest and is checked before the body is read. Every
answer is signed by the node that gives it and checked by the caller; gossip carries each
node's state as its owner signed it. A message must come from the node it speaks for, and
terms move only through Raft's messages from configured voters, never by gossip, and only by
bounded steps. One compromised member decides nothing (quorum_cert.py): a leader is followed
only on its election certificate (a majority's signed votes for its term), a value is decided
anywhere only on its decision certificate (a majority's signed acks), and every field has one
writer. Work completes only by the claimant's signed completion (item, fencing token, result
digest) that the leader admits for the claim it granted (completions.py); the leader signs each
grant, and after a leader change the new leader admits a completion, and adopts a claim, of an
earlier term only on the grant of that term's proven leader: gossip alone marks no work done. Timeouts are judged less the node's own stalls
(loop_lag.py), so a starved node does not start an election on the strength of its own stall. GET /status, /progress, /mesh/hello and /metrics are operator endpoints,
readable unsigned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.coordination.p2p.node import ClusterView, MeshNode

__all__ = ["ClusterView", "MeshNode"]


def __getattr__(name: str) -> Any:
    # Lazy, so importing the pure rules does not pull in aiohttp and SQLAlchemy.
    if name in __all__:
        from app.coordination.p2p import node

        return getattr(node, name)
    raise AttributeError(name)
