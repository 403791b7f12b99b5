"""The mesh against hostile and broken messages (issue 11), on real nodes on 127.0.0.1: term
bombs, impersonated leaders, replays, bad timestamps, a skewed clock. Every message here is
correctly signed with the cluster secret: the checks under test are the ones after the HMAC."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from app.config.mesh import TimingProfile
from app.coordination.p2p.auth import sign
from app.coordination.p2p.node import MeshNode
from tests.mesh_helpers import assert_one_leader_per_term, free_ports, signed_state, wait_for
from tests.orchestrator_helpers import BUSY_CPU_TIMING

pytestmark = pytest.mark.timeout(120)
SECRET = b"hostile-test-secret"
IDS = ["n0", "n1", "n2"]


def make_node(root: Path, i: int, ports: list[int], clock: Callable[[], float] = time.time) -> MeshNode:
    peers = [f"{IDS[j]}@127.0.0.1:{ports[j]}" for j in range(3) if j != i]
    # three nodes share one event loop: the busy-CPU timing keeps a loaded machine from deposing the
    # leader mid-test (a lease lapse, then an honest election, is not what these tests look for)
    return MeshNode(node_id=IDS[i], host="127.0.0.1", port=ports[i], data_dir=root / IDS[i], peers=peers,
                    voters=IDS, priority=i, timing=TimingProfile(**BUSY_CPU_TIMING), secret=SECRET, wall_clock=clock)


@pytest.fixture
async def trio(tmp_path: Path):  # type: ignore[no-untyped-def]
    ports = free_ports(3)
    nodes = [make_node(tmp_path, i, ports) for i in range(3)]
    try:
        for node in nodes:
            await node.start()
        yield nodes
    finally:
        for node in nodes:
            await node.stop()
        assert_one_leader_per_term([tmp_path / nid for nid in IDS])


async def settled(nodes: list[MeshNode], timeout: float = 15.0) -> MeshNode:
    """One leader all nodes follow, in one term."""
    async def agreed() -> MeshNode | None:
        leads = [n for n in nodes if n.is_leader]
        if len(leads) == 1 and all(n.leader_id == leads[0].node_id and n.term == leads[0].term for n in nodes):
            return leads[0]
        return None
    return await wait_for(agreed, timeout)


def durable(node: MeshNode) -> tuple[str, str]:
    """What a node keeps on disk of terms, votes and commits."""
    commits = node.data_dir / "mesh_commits.json"
    return ((node.data_dir / "mesh_term.json").read_text(),
            commits.read_text() if commits.exists() else "")


async def send(node: MeshNode, path: str, body: object, sender: str, **sign_kw: object) -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    kw = {"receiver": node.node_id, "boot": node.boot, **sign_kw}
    headers = sign(SECRET, "POST", path, raw, sender=sender, **kw)  # type: ignore[arg-type]
    return await post_raw(node.addr, path, raw, headers)


async def post_raw(addr: str, path: str, raw: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://{addr}{path}", data=raw, headers=headers,
                          timeout=aiohttp.ClientTimeout(total=10)) as r:
            return r.status, json.loads(await r.text())


def state(node_id: str, term: int, incarnation: int = 10**6, **extra: object) -> dict:
    return {"node_id": node_id, "addr": "127.0.0.1:1", "incarnation": incarnation, "version": 1,
            "role": "leader", "term": term, "leader": node_id, **extra}


async def test_a_term_bomb_by_gossip_from_a_stranger_or_a_voter_changes_no_term(trio: list[MeshNode]) -> None:
    leader = await settled(trio)
    term = leader.term
    before = {n.node_id: n.store.term for n in trio}
    for n in trio:
        stranger = {"sender": "mallory", "states": [signed_state(SECRET, state("mallory", 10**15))], "view": {}}
        assert (await send(n, "/gossip", stranger, "mallory"))[0] == 200
        voter = next(v for v in IDS if v != n.node_id)  # a voter's own gossip, claiming a huge term
        bomb = {"sender": voter, "states": [signed_state(SECRET, state(voter, 10**15, incarnation=2**40))], "view": {}}
        assert (await send(n, "/gossip", bomb, voter))[0] == 200
        status, data = await send(n, "/gossip", {"sender": "mallory", "states": [signed_state(SECRET, state("mallory", 2**63))]},
                                  "mallory")
        assert status == 400 and "term" in data["error"]  # above the bound: refused, with the reason

    async def spread() -> bool:  # the fake peer reached every node, and gossip went round since
        return all(n.membership.state_of("mallory") is not None for n in trio)
    await wait_for(spread, 10.0)
    await asyncio.sleep(5 * trio[0].timing.gossip_interval)
    assert {n.node_id: n.store.term for n in trio} == before
    assert all(n.term == term for n in trio) and leader.is_leader


async def test_heartbeats_and_commits_from_non_leaders_change_nothing_durable(trio: list[MeshNode]) -> None:
    leader = await settled(trio)
    followers = [n for n in trio if n is not leader]
    target, other = followers
    kept = {n.node_id: durable(n) for n in trio}
    term = leader.term
    attempts = [  # (path, body, sender, the refusal it must get)
        ("/heartbeat", {"term": term + 5, "leader_id": "mallory"}, "mallory", "not a configured voter"),
        ("/heartbeat", {"term": term, "leader_id": other.node_id}, other.node_id, "election certificate"),
        ("/heartbeat", {"term": term + 1, "leader_id": leader.node_id}, other.node_id, "on behalf of"),
        ("/commit", {"term": term + 1, "leader_id": "mallory", "key": "generation/1", "value": "evil"}, "mallory",
         "not a configured voter"),
        ("/commit", {"term": term, "leader_id": other.node_id, "key": "generation/1", "value": "evil"},
         other.node_id, "election certificate"),
        ("/commit/decided", {"term": term + 1, "leader_id": "mallory", "key": "generation/1", "value": "evil"},
         "mallory", "no ack certificate"),
        ("/commit/read", {"term": term + 9, "leader_id": "mallory", "key": "generation/1"}, "mallory", None),
        ("/transfer/timeout_now", {"term": term, "leader_id": leader.node_id}, other.node_id, "does not match"),
        ("/vote", {"term": term + 3, "candidate_id": "mallory", "priority": 99}, "mallory", "not an eligible voter"),
        ("/vote", {"term": term + 3, "candidate_id": other.node_id, "priority": 99}, "mallory", "on behalf of"),
    ]
    for path, body, sender, why in attempts:
        status, data = await send(target, path, body, sender)
        assert status in (200, 409), (path, data)
        refused = data.get("ok") is False or data.get("stored") is False or data.get("granted") is False
        assert refused, (path, data)
        if why is not None:
            assert why in data.get("reason", ""), (path, data)
    assert target.leader_id == leader.node_id and target.term == term
    assert {n.node_id: durable(n) for n in trio} == kept
    assert target.commits.decided_values() == {}


async def test_replays_to_another_node_and_after_a_restart_are_refused(tmp_path: Path) -> None:
    ports = free_ports(3)
    nodes = [make_node(tmp_path, i, ports) for i in range(3)]
    for node in nodes:
        await node.start()
    try:
        leader = await settled(nodes)
        a, b = [n for n in nodes if n is not leader]
        raw = json.dumps({"term": leader.term, "leader_id": leader.node_id}).encode()
        captured = sign(SECRET, "POST", "/heartbeat", raw, sender=leader.node_id, receiver=a.node_id, boot=a.boot)
        status, data = await post_raw(a.addr, "/heartbeat", raw, captured)
        assert status == 200 and data["ok"]
        status, data = await post_raw(b.addr, "/heartbeat", raw, captured)
        assert status == 401 and f"addressed to {a.node_id}" in data["error"]
        status, data = await post_raw(a.addr, "/heartbeat", raw, captured)
        assert status == 401 and "replayed" in data["error"]
        await a.stop()  # restart a: the nonces it saw are gone with it, its boot is not
        i = nodes.index(a)
        nodes[i] = a = make_node(tmp_path, i, ports)
        await a.start()
        status, data = await post_raw(a.addr, "/heartbeat", raw, captured)
        assert status == 401 and "signed for boot" in data["error"], data
    finally:
        for node in nodes:
            await node.stop()


async def test_nan_infinite_and_out_of_window_timestamps_are_refused(trio: list[MeshNode]) -> None:
    node = trio[0]
    body = {"sender": "n1", "states": []}
    for ts, why in [(float("nan"), "not a finite number"), (float("inf"), "not a finite number"),
                    (time.time() + 400, "clock 400 s ahead of ours"), (time.time() - 301, "clock 301 s behind ours")]:
        status, data = await send(node, "/gossip", body, "n1", now=ts)
        assert status == 401 and why in data["error"], (ts, data)
    assert (await send(node, "/gossip", body, "n1"))[0] == 200


async def test_a_skewed_node_is_refused_and_its_peers_say_why(tmp_path: Path) -> None:
    ports = free_ports(3)
    nodes = [make_node(tmp_path, 0, ports), make_node(tmp_path, 1, ports),
             make_node(tmp_path, 2, ports, clock=lambda: time.time() + 400)]
    for node in nodes:
        await node.start()
    try:
        healthy, skewed = nodes[:2], nodes[2]

        def peer(node: MeshNode, other: str) -> dict:
            return next(p for p in node.status()["peers"] if p["node_id"] == other)

        async def explained() -> bool:
            ours = [peer(n, "n2")["we_refused"] for n in healthy]
            theirs = [peer(skewed, n.node_id)["they_refused"] for n in healthy]
            return all(r and "clock 400 s ahead of ours" in r["reason"] for r in ours) and \
                all(r and "clock 400 s ahead of ours" in r["reason"] for r in theirs)
        await wait_for(explained, 20.0)

        async def refused_back() -> bool:  # and the skewed node says why it refuses the others
            return all((r := peer(skewed, n.node_id)["we_refused"]) and "clock 400 s behind ours" in r["reason"]
                       for n in healthy)
        await wait_for(refused_back, 20.0)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://{healthy[0].addr}/metrics") as r:
                text = await r.text()
        assert 'mesh_refusals_total{direction="in",reason="clock"}' in text
        assert all(n.leader_id != "n2" for n in healthy)
    finally:
        for node in nodes:
            await node.stop()
