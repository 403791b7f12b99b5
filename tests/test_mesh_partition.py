"""Partitions of 7 voter processes through a fault-injecting TCP proxy (one port per directed
pair, owned by the test): 4|3 -> only the 4 side leads; 3|3|1 -> nobody leads, nothing is
mutated, terms do not climb; heal -> one leader. Then the history invariant."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time
from pathlib import Path

import aiohttp
import pytest

from tests.mesh_helpers import LIVENESS_S, SECRET, Cluster, PartitionProxy, signed, wait_for


async def claim_status(session: aiohttp.ClientSession, addr: str) -> int:
    body = json.dumps({"node_id": "probe"}).encode()
    try:
        headers = await signed(SECRET, addr, "POST", "/work/claim", body, sender="probe")
        async with session.post(
            f"http://{addr}/work/claim", data=body, headers=headers,
            timeout=aiohttp.ClientTimeout(total=2.0),
        ) as r:
            return r.status
    except (TimeoutError, aiohttp.ClientError):
        return 0


def durable_state(data_dir: Path) -> dict[str, object]:
    """Everything a node could mutate: its commits, term file, work queue rows and leadership
    history, as digests (the history counts only `became_leader` lines: other lines are logs)."""
    out: dict[str, object] = {}
    for name in ("mesh_commits.json", "mesh_term.json"):
        f = data_dir / name
        out[name] = hashlib.sha256(f.read_bytes()).hexdigest() if f.exists() else None
    db = data_dir / "work_queue.db"
    if db.exists():
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
            out["work_queue"] = {t: con.execute(f'SELECT * FROM "{t}" ORDER BY 1').fetchall() for t in tables}
        finally:
            con.close()
    history = data_dir / "mesh_history.jsonl"
    out["became_leader"] = history.read_text().count('"became_leader"') if history.exists() else 0
    return out


async def hold_no_leader(cluster: Cluster, nodes: list, seconds: float) -> set[int]:
    """Sample for `seconds`: no listed node may be leader; returns the terms seen."""
    terms: set[int] = set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sts = await cluster.statuses(nodes)
        assert not [nid for nid, s in sts.items() if s["role"] == "leader"], sts
        terms |= {s["term"] for s in sts.values()}
        await asyncio.sleep(0.1)
    return terms


@pytest.mark.timeout(300)
async def test_partitions_4_3_then_3_3_1_then_heal(tmp_path: Path) -> None:
    proxy = PartitionProxy(7)
    cluster = Cluster(tmp_path, 7, priorities=list(range(7)), route=proxy.route,
                      extra_args=["--demo-work", "4"])
    cluster.session = aiohttp.ClientSession()
    try:
        await proxy.start([n.port for n in cluster.nodes])
        cluster.start()
        await cluster.wait_ready(30.0)
        leader_id, term = await cluster.wait_single_leader(LIVENESS_S)
        idx = cluster.ids.index(leader_id)

        # 4|3 with the old leader on the minority side
        minority = [idx, (idx + 1) % 7, (idx + 2) % 7]
        majority = [i for i in range(7) if i not in minority]
        proxy.partition([majority, minority])
        maj_nodes = [cluster.nodes[i] for i in majority]
        min_nodes = [cluster.nodes[i] for i in minority]
        new_id, new_term = await cluster.wait_single_leader(LIVENESS_S, maj_nodes)
        assert new_id in {n.node_id for n in maj_nodes} and new_term > term

        async def minority_leaderless() -> bool:
            sts = await cluster.statuses(min_nodes)
            return len(sts) == 3 and all(s["role"] != "leader" for s in sts.values())
        await wait_for(minority_leaderless, LIVENESS_S)
        await hold_no_leader(cluster, min_nodes, 1.5)
        for n in min_nodes:
            assert await claim_status(cluster.session, n.addr) == 503  # read-only side
        assert await claim_status(cluster.session, cluster.by_id(new_id).addr) == 200

        # 3|3|1: no side has a quorum of the 7 configured voters
        proxy.partition([[0, 1, 2], [3, 4, 5], [6]])

        async def nobody_leads() -> bool:
            sts = await cluster.statuses()
            return len(sts) == 7 and all(s["role"] != "leader" for s in sts.values())
        await wait_for(nobody_leads, LIVENESS_S)
        sides = [[cluster.ids[i] for i in side] for side in ([0, 1, 2], [3, 4, 5], [6])]

        async def each_side_agrees_on_its_term() -> bool:
            # a node of the old minority may still learn the newer term its side mates hold:
            # that is catching up, not inflation, so it is done before the snapshot
            sts = await cluster.statuses()
            return len(sts) == 7 and all(len({sts[nid]["term"] for nid in side}) == 1 for side in sides)
        await wait_for(each_side_agrees_on_its_term, LIVENESS_S)
        before = {nid: s["term"] for nid, s in (await cluster.statuses()).items()}
        stored_before = {n.node_id: durable_state(n.data_dir) for n in cluster.nodes}
        await hold_no_leader(cluster, cluster.nodes, 3.0)
        for n in cluster.nodes:
            assert await claim_status(cluster.session, n.addr) == 503  # read-only everywhere
        after = {nid: s["term"] for nid, s in (await cluster.statuses()).items()}
        assert after == before  # pre-vote: isolated nodes do not inflate terms
        assert all(s["quorum_level"] == "lost" for s in (await cluster.statuses()).values())
        # nothing is mutated: no commit, vote, term, work queue row or leadership on any node
        assert {n.node_id: durable_state(n.data_dir) for n in cluster.nodes} == stored_before

        # heal: exactly one leader, agreed by all
        proxy.heal()
        healed_id, healed_term = await cluster.wait_single_leader(LIVENESS_S)
        assert healed_term >= new_term
    finally:
        cluster.stop()
        await proxy.stop()
        await cluster.session.close()
    cluster.check_invariant()
