"""A voter's promises outlive it: the vote it granted is on disk before the answer leaves, a
restarted voter keeps it, and a freshly started voter grants nothing for one election timeout
(it may have acked a leader's lease just before it went down)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from app.coordination.p2p.node import MeshNode
from app.coordination.p2p.persist import TermStore
from tests.mesh_helpers import free_ports, signed, wait_for

pytestmark = pytest.mark.timeout(60)
SECRET = b"vote-test-secret"
VOTERS = ["v0", "v1", "v2"]


def voter(data_dir: Path, port: int, peer_ports: list[int]) -> MeshNode:
    """v0, the voter under test; v1 and v2 are never started: this test speaks for them."""
    peers = [f"v{i + 1}@127.0.0.1:{p}" for i, p in enumerate(peer_ports)]
    return MeshNode(node_id="v0", host="127.0.0.1", port=port, data_dir=data_dir, peers=peers,
                    voters=VOTERS, priority=0, profile="fast", secret=SECRET)


async def ask_vote(node: MeshNode, candidate: str, term: int) -> dict:
    body = json.dumps({"term": term, "candidate_id": candidate, "priority": 10, "pre_vote": False}).encode()
    async with aiohttp.ClientSession() as s:
        headers = await signed(SECRET, node.addr, "POST", "/vote", body, sender=candidate)
        async with s.post(f"http://{node.addr}/vote", data=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            return await r.json()


async def past_the_lease(node, candidate: str, term: int, timeout: float = 15.0) -> dict:
    """The first answer that is not the fresh voter's "a leader was heard from recently"
    (a voter just started owes any leader its lease: one election timeout)."""
    answers: list[dict] = []

    async def answered() -> bool:
        answers.append(await ask_vote(node, candidate, term))
        return "leader was heard from recently" not in answers[-1].get("reason", "")
    await wait_for(answered, timeout, interval=0.1)
    return answers[-1]


async def test_granted_vote_is_durable_and_a_fresh_voter_waits_one_election_timeout(tmp_path: Path) -> None:
    port, *peer_ports = free_ports(3)
    node = voter(tmp_path, port, peer_ports)
    await node.start()
    try:
        answer = await ask_vote(node, "v1", 5)  # at once after start: it may still owe a lease
        assert not answer["granted"] and "leader was heard from recently" in answer["reason"]
        answer = await past_the_lease(node, "v1", 5)
        assert answer["granted"] and answer["term"] == 5
        on_disk = TermStore(tmp_path / "mesh_term.json")  # what the answer promised is on disk
        assert (on_disk.term, on_disk.voted_for) == (5, "v1")
    finally:
        await node.stop()

    node = voter(tmp_path, port, peer_ports)  # restart on the same data dir
    await node.start()
    try:
        answer = await past_the_lease(node, "v2", 5)
        assert not answer["granted"] and "already voted for v1" in answer["reason"]
        answer = await ask_vote(node, "v2", 4)
        assert not answer["granted"] and answer["reason"] == "stale term" and answer["term"] == 5
        answer = await ask_vote(node, "v1", 5)  # the same candidate may ask again
        assert answer["granted"]
    finally:
        await node.stop()
