"""Anti-entropy replication between real MeshNodes on loopback: ranges and placement (pure),
convergence to the replication factor, idempotence, re-replication after a node is lost,
the under-replicated count, and the endpoints' bounds and signatures."""

from __future__ import annotations

import uuid
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.coordination.p2p.client import MeshClient
from app.coordination.p2p.node import MeshNode
from app.coordination.sync import GameSyncServer
from app.coordination.sync.ranges import (
    bounds,
    children,
    effective_factor,
    holders,
    range_of,
    under_replicated,
)
from app.coordination.sync.replica_push import Pusher
from app.coordination.sync.replica_store import GameStore
from app.coordination.sync.replication import Replicator
from app.db.replay_db import GameRecord, MoveRecord, ReplayDB

pytestmark = pytest.mark.timeout(120)
SECRET = b"replication-test-secret"
IDS = ["n0", "n1", "n2"]


# -- pure parts ---------------------------------------------------------------------------------
@settings(max_examples=120, deadline=None)
@given(st.text(max_size=12), st.integers(min_value=0, max_value=5))
def test_every_id_lies_in_one_range_per_depth_and_in_its_parents_child(uid: str, depth: int) -> None:
    prefix = range_of(uid, depth)
    lo, hi = bounds(prefix)
    assert lo <= uid and (hi is None or uid < hi)
    assert range_of(uid, depth + 1) in children(prefix)


def test_placement_keeps_the_origin_and_moves_only_the_lost_nodes_share() -> None:
    members = ["a", "b", "c", "d"]
    for fine in ("00", "3a", "ff"):
        placed = holders("a", fine, members, 2)
        assert placed[0] == "a" and len(placed) == 2 and len(set(placed)) == 2
        other = next(m for m in members if m not in placed)
        assert holders("a", fine, [m for m in members if m != other], 2) == placed  # unaffected
        gone = holders("a", fine, [m for m in members if m != placed[1]], 2)
        assert gone[0] == "a" and placed[1] not in gone
        assert holders("a", fine, ["b", "c", "d"], 2) == [m for m in holders("a", fine, members, 3) if m != "a"][:2]
    assert effective_factor(2, clustered=False) == 1 and effective_factor(3, clustered=True) == 3


def test_under_replicated_counts_games_fewer_than_factor_nodes_hold() -> None:
    assert under_replicated({"b": {"x"}, "c": {"x", "y"}}, 2) == {"x"}
    assert under_replicated({"b": {"x"}, "c": {"x", "y"}}, 3) == {"x", "y"}
    assert under_replicated({"b": None, "c": set()}, 2) == set()
    assert under_replicated({"b": None, "c": None}, 2) is None  # nobody else holds any: all of them
    assert under_replicated({}, 1) == set()


# -- real nodes ---------------------------------------------------------------------------------
def game(uid: str, origin: str, plies: int = 6) -> GameRecord:
    moves = [MoveRecord(i % 7, [1.0 if a == i % 7 else 0.0 for a in range(7)], 0.1) for i in range(plies)]
    return GameRecord(uid=uid, game="connect4", moves=moves, winner=plies % 2, model_sha256=None,
                      node_id=origin, started_at=1.0, finished_at=2.0)


def play(path: Path, origin: str, n: int) -> set[str]:
    uids = {uuid.uuid4().hex for _ in range(n)}
    with ReplayDB(path) as db:
        db.add_games(game(u, origin) for u in uids)
    return uids


def held(path: Path) -> set[str]:
    with ReplayDB(path) as db:
        assert db.integrity_problems() == []
        uids = db.uids()
        assert len(uids) == len(set(uids))
        return set(uids)


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.nodes: dict[str, MeshNode] = {}
        self.servers: dict[str, GameSyncServer] = {}
        self.stores: dict[str, GameStore] = {}
        self.clients: dict[str, MeshClient] = {}

    def db(self, nid: str) -> Path:
        return self.tmp / nid / "games.db"

    async def start(self, nid: str) -> None:
        self.servers[nid] = GameSyncServer(self.db(nid))
        node = MeshNode(node_id=nid, host="127.0.0.1", port=0, data_dir=self.tmp / nid, profile="fast", secret=SECRET)
        node.add_routes(self.servers[nid].routes())
        await node.start()
        self.nodes[nid] = node
        self.stores[nid] = GameStore(self.db(nid))
        self.clients[nid] = MeshClient(SECRET, timeout=5.0, node_id=nid)

    def replicator(self, nid: str, **kw) -> Replicator:
        return Replicator(nid, self.clients[nid], self.stores[nid], factor=kw.pop("factor", 2), **kw)

    async def round(self, reps: dict[str, Replicator]):
        members = sorted(self.nodes)
        out = {}
        for nid, rep in reps.items():
            peers = {p: n.addr for p, n in self.nodes.items() if p != nid}
            out[nid] = await rep.run_round(peers, members)
        return out

    async def stop(self, nid: str) -> None:
        await self.nodes.pop(nid).stop()
        self.servers.pop(nid).close()
        self.stores.pop(nid).close()
        await self.clients.pop(nid).close()

    async def close(self) -> None:
        for nid in list(self.nodes):
            await self.stop(nid)


@pytest.fixture
async def cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()


async def test_placement_only_reaches_the_factor_then_a_lost_node_is_re_replicated(cluster: Cluster) -> None:
    for nid in IDS:
        await cluster.start(nid)
    made = {nid: play(cluster.db(nid), nid, 60) for nid in IDS}
    everything = set().union(*made.values())
    reps = {nid: cluster.replicator(nid, prefetch=False, batch=16) for nid in IDS}
    first = await cluster.round(reps)
    assert all(not r.errors for r in first.values()), first
    copies = {nid: held(cluster.db(nid)) for nid in IDS}
    for uid in everything:
        assert sum(uid in copies[n] for n in IDS) >= 2, uid
    for nid in IDS:
        assert made[nid] <= copies[nid] and len(copies[nid]) < len(everything)  # a share, not all
    # One more round: placement is met, so nothing moves and nothing is under-replicated.
    second = await cluster.round(reps)
    assert sum(r.pulled for r in second.values()) == 0
    for nid, r in second.items():
        assert r.status.under_replicated == 0 and r.status.own == 60, r.status
        assert sum(r.status.own_held_by.values()) >= 60
    # Idle rounds then cost only the top digests (ranges that differ for good are cached).
    idle = await cluster.round(reps)
    assert sum(r.pulled for r in idle.values()) == 0
    assert max(r.bytes_in for r in idle.values()) < 2 * 500, {n: r.bytes_in for n, r in idle.items()}

    # n2 leaves for good: its share moves so every game is on both survivors again.
    await cluster.stop("n2")
    del reps["n2"]
    await cluster.round(reps)
    after = {nid: held(cluster.db(nid)) for nid in ("n0", "n1")}
    assert after["n0"] == after["n1"] == everything
    third = await cluster.round(reps)
    assert all(r.pulled == 0 and r.status.under_replicated == 0 for r in third.values())


async def test_prefetch_copies_everything_and_new_games_follow_in_one_round(cluster: Cluster) -> None:
    for nid in IDS:
        await cluster.start(nid)
    made = {nid: play(cluster.db(nid), nid, 20) for nid in IDS}
    reps = {nid: cluster.replicator(nid) for nid in IDS}
    await cluster.round(reps)
    everything = set().union(*made.values())
    assert all(held(cluster.db(nid)) == everything for nid in IDS)
    new = play(cluster.db("n1"), "n1", 3)
    reports = await cluster.round(reps)
    assert reports["n0"].pulled == 3 and reports["n2"].pulled == 3
    assert all(held(cluster.db(nid)) == everything | set(new) for nid in IDS)
    # bytes moved stay near the games' own size: the range walk did not list every id
    one_game = len(str(game("x" * 32, "n1").to_json()))
    assert reports["n0"].bytes_in < 3 * one_game + 8000


async def test_under_replicated_games_are_counted_with_the_oldest_age(cluster: Cluster) -> None:
    for nid in ("n0", "n1"):
        await cluster.start(nid)
    play(cluster.db("n0"), "n0", 10)
    alone = cluster.replicator("n0")
    report = await alone.run_round({}, ["n0"])  # the only alive node: nothing has a second copy
    assert report.status.under_replicated == 10 and report.status.oldest_under_replicated_s > 0
    peer = {"n1": cluster.nodes["n1"].addr}
    report = await alone.run_round(peer, ["n0", "n1"])  # n1 is alive but holds none yet
    assert report.status.under_replicated == 10 and report.status.own_held_by == {"n1": 0}
    await cluster.replicator("n1", prefetch=False).run_round({"n0": cluster.nodes["n0"].addr}, ["n0", "n1"])
    report = await alone.run_round(peer, ["n0", "n1"])
    assert report.status.under_replicated == 0 and report.status.oldest_under_replicated_s is None
    assert report.status.own_held_by == {"n1": 10}
    assert cluster.replicator("n0", factor=1).factor == 1


async def test_endpoints_refuse_malformed_and_unsigned_requests(cluster: Cluster) -> None:
    await cluster.start("n0")
    addr = cluster.nodes["n0"].addr
    client = cluster.clients["n0"]
    status, data = await client.request("POST", addr, "/replica/games/digest", {"origin": "n0", "prefix": "xyz"})
    assert status == 400 and "prefix" in data["error"]
    status, data = await client.request("POST", addr, "/replica/games/ids", {"origin": "n0", "limit": 10**6})
    assert status == 400 and "limit" in data["error"]
    status, data = await client.request("POST", addr, "/replica/games/fetch", {"ids": []})
    assert status == 400
    status, _ = await client.request("GET", addr, "/replica/games/digest")
    assert status == 200
    async with aiohttp.ClientSession() as session, session.get(f"http://{addr}/replica/games/digest") as resp:
        assert resp.status == 401  # unsigned


async def test_a_game_is_pushed_to_its_holders_as_soon_as_it_is_stored(cluster: Cluster) -> None:
    """Issue 45, item 5: the origin pushes what it makes (no pull round in between); placement
    decides the holders, a peer that does not answer keeps its games pending (and counted as
    such) until it does, and a node takes a push of a record only from the record's origin."""
    for nid in IDS:
        await cluster.start(nid)
    peers = {p: cluster.nodes[p].addr for p in ("n1", "n2")}
    before = play(cluster.db("n0"), "n0", 5)  # made before the pusher started: anti-entropy's
    pusher = Pusher("n0", cluster.clients["n0"], cluster.stores["n0"], factor=2, prefetch=False)
    assert await pusher.push_new(peers, IDS) == 0
    made = play(cluster.db("n0"), "n0", 40)
    assert await pusher.push_new(peers, IDS) == 40  # one holder besides the origin, each
    copies = {p: held(cluster.db(p)) for p in peers}
    for uid in made:
        (holder,) = [p for p in peers if uid in copies[p]]
        assert holder == holders("n0", range_of(uid, 2), IDS, 2)[1]
    assert not before & (copies["n1"] | copies["n2"])
    status = pusher.status()
    assert status.pending == 0 and status.samples == 40 and status.pushed_total == 40
    assert status.lag_p50_s is not None and status.lag_p99_s is not None

    # n1 does not answer: its games stay pending, the rest go; once it answers, they follow
    more = play(cluster.db("n0"), "n0", 30)
    await pusher.push_new({**peers, "n1": "127.0.0.1:9"}, IDS)
    on_n1 = {u for u in more if holders("n0", range_of(u, 2), IDS, 2)[1] == "n1"}
    assert on_n1 and pusher.status().pending == len(on_n1) and pusher.status().oldest_pending_s is not None
    assert more - on_n1 <= held(cluster.db("n2"))
    import asyncio
    await asyncio.sleep(0.3)  # past the failed peer's backoff
    assert await pusher.push_new(peers, IDS) == len(on_n1)
    assert on_n1 <= held(cluster.db("n1")) and pusher.status().pending == 0

    # with prefetch every alive peer gets every game at once
    everywhere = Pusher("n0", cluster.clients["n0"], cluster.stores["n0"], factor=2, prefetch=True)
    await everywhere.push_new(peers, IDS)
    newest = play(cluster.db("n0"), "n0", 4)
    assert await everywhere.push_new(peers, IDS) == 8
    assert all(newest <= held(cluster.db(p)) for p in peers)

    # only a record's origin pushes it
    stranger = game(uuid.uuid4().hex, "n2").to_json()
    status_code, data = await cluster.clients["n1"].request("POST", cluster.nodes["n0"].addr, "/replica/games/push",
                                                            {"records": [stranger]})
    assert status_code == 400 and "only a record's origin pushes it" in data["error"], data
    assert stranger["uid"] not in held(cluster.db("n0"))


class DictStore:
    """Another workload's records (e.g. LM rollouts) behind the same ReplicatedStore interface."""

    def __init__(self, records: dict[str, dict] | None = None) -> None:
        self.records = dict(records or {})

    def _of(self, origin: str, prefix: str) -> list[str]:
        return sorted(u for u, r in self.records.items()
                      if r["origin"] == origin and range_of(u, len(prefix)) == prefix)

    def top_digests(self):
        from app.coordination.sync.ranges import digest_of
        origins = {r["origin"] for r in self.records.values()}
        return {o: digest_of(self._of(o, "")) for o in origins}

    def digest(self, origin: str, prefix: str):
        from app.coordination.sync.ranges import digest_of
        return digest_of(self._of(origin, prefix))

    def ids(self, origin: str, prefix: str, after: str, limit: int) -> list[str]:
        return [u for u in self._of(origin, prefix) if u > after][:limit]

    def fetch_json(self, ids, max_bytes):
        import json
        return [json.dumps(self.records[u]) for u in ids if u in self.records], [], [u for u in ids if u not in self.records]

    def insert(self, records) -> int:
        new = [r for r in records if r["uid"] not in self.records]
        self.records.update({r["uid"]: dict(r) for r in new})
        return len(new)

    def finished_at(self, ids):
        return {u: self.records[u]["t"] for u in ids if u in self.records}

    def oldest_finished_at(self, origin: str):
        return min((r["t"] for r in self.records.values() if r["origin"] == origin), default=None)

    def count(self) -> int:
        return len(self.records)


async def test_any_store_replicates_the_same_way(tmp_path: Path) -> None:
    from app.coordination.sync.replica_server import replica_routes

    def rollout(origin: str, i: int) -> dict:
        return {"uid": uuid.uuid4().hex, "origin": origin, "t": float(i), "tokens": list(range(i % 5))}

    stores = {nid: DictStore({r["uid"]: r for r in (rollout(nid, i) for i in range(30))}) for nid in ("a", "b")}
    nodes = {}
    client = MeshClient(SECRET, timeout=5.0)
    try:
        for nid, store in stores.items():
            node = MeshNode(node_id=nid, host="127.0.0.1", port=0, data_dir=tmp_path / nid, profile="fast", secret=SECRET)
            node.add_routes(replica_routes("rollouts", store))
            await node.start()
            nodes[nid] = node
        rep = Replicator("a", client, stores["a"], factor=2, store_name="rollouts", prefetch=False, list_max=8)
        report = await rep.run_round({"b": nodes["b"].addr}, ["a", "b"])
        assert report.pulled == 30 and stores["a"].records.keys() >= stores["b"].records.keys()
        assert report.status.under_replicated == 30  # b holds none of a's rollouts yet
        await Replicator("b", client, stores["b"], factor=2, store_name="rollouts").run_round(
            {"a": nodes["a"].addr}, ["a", "b"])
        again = await rep.run_round({"b": nodes["b"].addr}, ["a", "b"])
        assert again.pulled == 0 and again.status.under_replicated == 0
        assert stores["a"].records == stores["b"].records
    finally:
        for node in nodes.values():
            await node.stop()
        await client.close()
