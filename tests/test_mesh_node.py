"""Three real MeshNodes on loopback in one event loop: election, gossip, work, commits."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from app.coordination.p2p.node import ClusterView, MeshNode
from app.coordination.p2p.work_rules import TRAINING_KIND, WorkSpec
from tests.mesh_helpers import assert_one_leader_per_term, free_ports, signed, wait_for

pytestmark = pytest.mark.timeout(90)
SECRET = b"node-test-secret"


def source(view: ClusterView) -> list[WorkSpec]:
    return [WorkSpec("demo", "a"), WorkSpec("demo", "b"), WorkSpec(TRAINING_KIND, "gen1", ttl=30.0)]


@pytest.fixture
async def trio(tmp_path: Path):  # type: ignore[no-untyped-def]
    ids = ["n0", "n1", "n2"]
    ports = free_ports(3)
    nodes = []
    for i, nid in enumerate(ids):
        peers = [f"{ids[j]}@127.0.0.1:{ports[j]}" for j in range(3) if j != i]
        node = MeshNode(
            node_id=nid, host="127.0.0.1", port=ports[i], data_dir=tmp_path / nid, peers=peers,
            voters=ids, priority=i, profile="fast", secret=SECRET, work_source=source,
        )
        if nid == "n2":
            async def hello(request: web.Request) -> web.Response:
                return web.json_response({"hello": "world"})
            node.add_routes([web.get("/hello", hello)], public=[("GET", "/hello")])
        nodes.append(node)
    try:
        for node in nodes:
            await node.start()
        yield nodes
    finally:
        for node in nodes:
            await node.stop()
        assert_one_leader_per_term([tmp_path / nid for nid in ids])


async def leader_of(nodes: list[MeshNode], timeout: float = 10.0) -> MeshNode:
    async def agreed() -> MeshNode | None:
        leads = [n for n in nodes if n.is_leader]
        if len(leads) == 1 and all(n.leader_id == leads[0].node_id for n in nodes):
            return leads[0]
        return None
    return await wait_for(agreed, timeout)


async def test_highest_ranked_leads_and_gossip_spreads_state(trio: list[MeshNode]) -> None:
    leader = await leader_of(trio)
    assert leader.node_id == "n2"  # bully order: priority 2 is preferred
    trio[0].update_local_state(inventory={"games": 42})

    async def seen() -> bool:
        st = trio[2].cluster_view().nodes.get("n0")
        return st is not None and st.inventory.get("games") == 42
    await wait_for(seen, 5.0)
    status = leader.status()
    assert status["role"] == "leader" and status["quorum_level"] == "healthy"
    assert {p["node_id"] for p in status["peers"]} == {"n0", "n1"}
    assert all(p["state"] == "alive" for p in status["peers"])
    assert status["work"]["pending"] == 3
    with pytest.raises(ValueError, match="unknown fields"):
        trio[0].update_local_state(role="leader")
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{trio[2].addr}/hello") as r:
            assert (await r.json()) == {"hello": "world"}


async def test_work_claims_through_any_node(trio: list[MeshNode]) -> None:
    leader = await leader_of(trio)
    follower = next(n for n in trio if not n.is_leader)
    wc = follower.work_client()
    training = await wc.claim(training=True)
    assert training is not None and training.item.kind == TRAINING_KIND and training.token.term == leader.term
    assert await wc.claim(training=True) is None  # only one training item exists

    async def gossiped() -> bool:
        st = leader.cluster_view().nodes[follower.node_id]
        return [c.item_id for c in st.claims] == [training.item.item_id]
    await wait_for(gossiped, 5.0)
    assert (await wc.renew(training)).ok
    done = await wc.complete(training, {"loss": 0.1})
    assert done.ok and follower.membership.local.claims == []
    again = await wc.complete(training)
    assert again.status == 409
    demo = await wc.claim(kinds=["demo"])
    assert demo is not None
    failed = await wc.fail(demo, "oom")
    assert failed.ok and leader.queue.item(demo.item.item_id)["state"] == "pending"
    # a claim sent to a follower is refused with a hint where the leader is
    async with aiohttp.ClientSession() as s:
        body = b'{"node_id": "w"}'
        async with s.post(f"http://{follower.addr}/work/claim", data=body,
                          headers=await signed(SECRET, follower.addr, "POST", "/work/claim", body, sender="w")) as r:
            data = await r.json()
            assert r.status == 503 and data["leader"] == leader.node_id and data["leader_addr"] == leader.addr


async def test_commit_through_quorum_and_conflicts(trio: list[MeshNode]) -> None:
    leader = await leader_of(trio)
    follower = next(n for n in trio if not n.is_leader)
    assert await follower.commit("gen:1", "aaa") is False  # only the leader commits
    assert await leader.commit("gen:1", "aaa") is True
    assert await leader.commit("gen:1", "aaa") is True  # idempotent
    assert await leader.commit("gen:1", "bbb") is False  # never two models for one generation
    assert sum(n.stored_value("gen:1") == "aaa" for n in trio) >= 2


async def test_failover_when_leader_stops_and_quorum_levels(trio: list[MeshNode]) -> None:
    leader = await leader_of(trio)
    old_term = leader.term
    await leader.stop()
    rest = [n for n in trio if n is not leader]
    new = await leader_of(rest, timeout=10.0)
    assert new.term > old_term

    async def minimum() -> bool:
        return all(n.quorum_level.value == "minimum" for n in rest)
    await wait_for(minimum, 5.0)
    # the new leader rebuilt its queue from the work source: nothing lost
    assert new.status()["work"]["pending"] == 3
    other = next(n for n in rest if n is not new)
    await other.stop()

    async def lost() -> bool:
        return new.quorum_level.value == "lost" and not new.is_leader
    await wait_for(lost, 5.0)  # check-quorum: a leader without a quorum steps down
    assert await new.commit("k", "v") is False
    await asyncio.sleep(0)


async def test_leadership_moves_by_explicit_transfer_and_stays(trio: list[MeshNode]) -> None:
    """n2 (highest priority) leads; handed to n0 it stays with n0 (a healthy leader is not
    preempted); the operator CLI hands it on to n1 through a follower."""
    import os
    import sys

    leader = await leader_of(trio)
    assert leader.node_id == "n2"
    old_term = leader.term

    async def transfer(node: MeshNode, target: str) -> tuple[int, dict]:
        body = f'{{"target": "{target}"}}'.encode()
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://{node.addr}/admin/transfer", data=body,
                              headers=await signed(SECRET, node.addr, "POST", "/admin/transfer", body)) as r:
                return r.status, await r.json()

    follower = next(n for n in trio if n is not leader)
    assert (await transfer(follower, "n0"))[0] == 503  # only the leader hands over
    status, answer = await transfer(leader, "nobody")
    assert status == 409 and "not a voter" in answer["error"] and leader.is_leader  # refused: nothing changed
    status, answer = await transfer(leader, "n0")
    assert status == 200, answer

    async def n0_leads() -> bool:
        return trio[0].is_leader and all(n.leader_id == "n0" for n in trio)
    await wait_for(n0_leads, 5.0)
    assert trio[0].term > old_term
    await asyncio.sleep(3 * trio[0].timing.election_timeout_min)  # n2 outranks n0 but does not take it back
    assert trio[0].is_leader and not leader.is_leader

    env = {**os.environ, "MESH_SECRET": SECRET.decode()}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "mesh_admin.py"), "transfer", "--to", "n1", "--node", trio[2].addr, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (out, err)
    assert '"transferred_to": "n1"' in out.decode()

    async def n1_leads() -> bool:
        return trio[1].is_leader and all(n.leader_id == "n1" for n in trio)
    await wait_for(n1_leads, 5.0)
