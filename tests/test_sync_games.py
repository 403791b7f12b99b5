"""Game sync between real MeshNodes on loopback: manifest paging, idempotent fetch, resume after
a peer dies mid-sync, bounds and signatures."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from app.coordination.p2p.client import MeshClient
from app.coordination.p2p.node import MeshNode
from app.coordination.sync import GameSyncServer, PeerCursor, SyncError, pull_games, sync_from_peers
from app.coordination.sync.wire import MAX_FETCH_UIDS, MAX_MANIFEST_LIMIT
from app.db.replay_db import GameRecord, MoveRecord, ReplayDB
from tests.mesh_helpers import free_ports, wait_for
from tests import sync_helpers
from tests.sync_helpers import signed_client

pytestmark = pytest.mark.timeout(60)
SECRET = b"sync-test-secret"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def game(uid: str, plies: int = 4) -> GameRecord:
    moves = [MoveRecord(i % 7, [1.0 if a == i % 7 else 0.0 for a in range(7)], 0.1 * i) for i in range(plies)]
    return GameRecord(uid=uid, game="connect4", moves=moves, winner=plies % 2, model_sha256="ab" * 32,
                      node_id="peer", search={"sims": 8}, config={"c": 1}, started_at=1.0, finished_at=2.0)


def fill(path: Path, uids: list[str]) -> None:
    with ReplayDB(path) as db:
        assert db.add_games(game(u) for u in uids) == len(uids)


async def start_node(tmp: Path, node_id: str, routes: list[web.RouteDef]) -> MeshNode:
    return await sync_helpers.start_node(tmp, node_id, routes, SECRET)


@pytest.fixture
async def client():  # type: ignore[no-untyped-def]
    async with signed_client(SECRET) as c:
        yield c


def local_uids(path: Path) -> list[str]:
    with ReplayDB(path) as db:
        assert db.integrity_problems() == []
        return db.uids()


async def test_pull_copies_missing_games_once_and_then_only_new_ones(tmp_path: Path, client: MeshClient) -> None:
    peer_db, local_db = tmp_path / "peer.db", tmp_path / "local.db"
    uids = [f"g{i:03d}" for i in range(25)]
    fill(peer_db, uids)
    fill(local_db, uids[5:8])  # already here, e.g. from an earlier partial sync
    server = GameSyncServer(peer_db)
    node = await start_node(tmp_path, "peer", server.routes())
    try:
        cursor = PeerCursor.for_peer(tmp_path / "sync", "peer")
        report = await pull_games(client, node.addr, local_db, cursor, page_size=10, fetch_batch=4)
        assert (report.new, report.skipped, report.cursor, report.complete) == (22, 3, 25, True)
        assert sorted(local_uids(local_db)) == uids
        assert cursor.load() == (25, "g000")
        with ReplayDB(local_db) as db:
            assert db.games(uids=["g017"])[0].to_json() == game("g017").to_json()

        again = await pull_games(client, node.addr, local_db, cursor)
        assert (again.new, again.skipped, again.cursor) == (0, 0, 25)

        fill(peer_db, ["h1", "h2"])
        later = await pull_games(client, node.addr, local_db, cursor)
        assert (later.new, later.skipped, later.cursor) == (2, 0, 27)
        assert len(local_uids(local_db)) == 27
    finally:
        await node.stop()
        server.close()


async def test_byte_budget_defers_games_and_the_pull_still_gets_them_all(tmp_path: Path, client: MeshClient) -> None:
    peer_db, local_db = tmp_path / "peer.db", tmp_path / "local.db"
    uids = [f"g{i}" for i in range(9)]
    fill(peer_db, uids)
    one_game = len(json.dumps(game("g0").to_json()))
    server = GameSyncServer(peer_db, max_fetch_bytes=2 * one_game + 10)
    node = await start_node(tmp_path, "peer", server.routes())
    try:
        status, data = await client.request("POST", node.addr, "/games/fetch", {"uids": uids[:5] + ["nope"]})
        assert status == 200 and len(data["games"]) == 2
        assert data["deferred"] == uids[2:5] and data["missing"] == ["nope"]
        report = await pull_games(client, node.addr, local_db, PeerCursor(tmp_path / "c.json"), fetch_batch=9)
        assert report.new == 9 and sorted(local_uids(local_db)) == uids
    finally:
        await node.stop()
        server.close()


def dies_on_call(handler: Handler, n: int) -> Handler:
    """The peer's connection drops during its n-th fetch (0-based), as when the peer dies."""
    calls = {"n": 0}

    async def wrapped(request: web.Request) -> web.StreamResponse:
        calls["n"] += 1
        if calls["n"] - 1 == n:
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(0.05)
        return await handler(request)

    return wrapped


async def test_interrupted_sync_resumes_where_it_stopped_and_stores_each_game_once(
    tmp_path: Path, client: MeshClient
) -> None:
    peer_db, local_db = tmp_path / "peer.db", tmp_path / "local.db"
    uids = [f"g{i:02d}" for i in range(30)]
    fill(peer_db, uids)
    cursor = PeerCursor.for_peer(tmp_path / "sync", "peer")

    server = GameSyncServer(peer_db)
    routes = [web.get("/games/manifest", server.manifest), web.post("/games/fetch", dies_on_call(server.fetch, 2))]
    node = await start_node(tmp_path, "peer", routes)
    try:
        with pytest.raises(SyncError, match="/games/fetch failed"):
            await pull_games(client, node.addr, local_db, cursor, page_size=100, fetch_batch=6)
    finally:
        await node.stop()
        server.close()
    assert cursor.load() == (12, "g00")  # two batches of 6 stored, the cursor saved behind them
    assert local_uids(local_db) == uids[:12]

    # The peer comes back (new process, new port); record what the resumed pull asks for.
    seen_after: list[str] = []
    fetched: list[str] = []
    server = GameSyncServer(peer_db)

    async def manifest(request: web.Request) -> web.StreamResponse:
        seen_after.append(request.query["after"])
        return await server.manifest(request)

    async def fetch(request: web.Request) -> web.StreamResponse:
        response = await server.fetch(request)
        fetched.extend(g["uid"] for g in json.loads(response.text)["games"])  # type: ignore[attr-defined]
        return response

    node = await start_node(tmp_path, "peer2", [web.get("/games/manifest", manifest), web.post("/games/fetch", fetch)])
    try:
        report = await pull_games(client, node.addr, local_db, cursor, page_size=100, fetch_batch=6)
        assert seen_after[0] == "12" and sorted(fetched) == uids[12:]
        assert (report.new, report.skipped, report.cursor) == (18, 0, 30)
        assert local_uids(local_db) == uids

        # A crash between "batch stored" and "cursor saved" rewinds the cursor: nothing twice.
        cursor.save(0, "g00")
        fetched.clear()
        report = await pull_games(client, node.addr, local_db, cursor)
        assert (report.new, report.skipped, report.cursor, fetched) == (0, 30, 30, [])
        assert local_uids(local_db) == uids
    finally:
        await node.stop()
        server.close()


async def test_a_replaced_peer_db_is_synced_from_the_start(tmp_path: Path, client: MeshClient) -> None:
    local_db = tmp_path / "local.db"
    cursor = PeerCursor(tmp_path / "c.json")
    fill(tmp_path / "old.db", [f"old{i}" for i in range(3)])
    fill(tmp_path / "new.db", [f"new{i}" for i in range(5)])  # more rows than the old cursor
    for name, expect_new in [("old.db", 3), ("new.db", 5)]:
        server = GameSyncServer(tmp_path / name)
        node = await start_node(tmp_path, "peer", server.routes())
        try:
            report = await pull_games(client, node.addr, local_db, cursor)
            assert report.new == expect_new and report.complete
        finally:
            await node.stop()
            server.close()
    assert cursor.load() == (5, "new0")
    assert len(local_uids(local_db)) == 8


async def test_bounds_and_malformed_requests_are_400_and_unsigned_are_401(tmp_path: Path, client: MeshClient) -> None:
    fill(tmp_path / "peer.db", ["a", "b"])
    server = GameSyncServer(tmp_path / "peer.db")
    node = await start_node(tmp_path, "peer", server.routes())
    try:
        status, data = await client.request("GET", node.addr, "/games/manifest?after=0&limit=1")
        assert status == 200 and data["entries"] == [[1, "a"]] and data["max_id"] == 2
        for query, needle in [
            (f"limit={MAX_MANIFEST_LIMIT + 1}", "limit"), ("limit=0", "limit"), ("after=-1", "after"),
            ("after=abc", "after"), ("after=0&bogus=1", "bogus"),
        ]:
            status, data = await client.request("GET", node.addr, f"/games/manifest?{query}")
            assert status == 400 and needle in data["error"], (query, data)
        for body, needle in [
            ({"uids": [f"u{i}" for i in range(MAX_FETCH_UIDS + 1)]}, "uids"),
            ({"uids": []}, "uids"), ({"uids": ["x" * 65]}, "uids"),
            ({"uids": ["a"], "more": 1}, "more"), ([1, 2], "JSON object"),
        ]:
            status, data = await client.request("POST", node.addr, "/games/fetch", body)
            assert status == 400 and needle in data["error"], (body, data)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://{node.addr}/games/manifest") as r:
                assert r.status == 401
            async with s.post(f"http://{node.addr}/games/fetch", json={"uids": ["a"]}) as r:
                assert r.status == 401
        wrong = MeshClient(b"another-secret", timeout=5.0)
        try:
            with pytest.raises(SyncError, match="bad signature"):  # it believes none of the node's answers
                await pull_games(wrong, node.addr, tmp_path / "local.db", PeerCursor(tmp_path / "c.json"))
        finally:
            await wrong.close()
    finally:
        await node.stop()
        server.close()


async def test_sync_from_peers_pulls_every_alive_peer_and_survives_a_failing_one(tmp_path: Path) -> None:
    ids = ["n0", "n1", "n2"]
    ports = free_ports(3)
    fill(tmp_path / "n1.db", [f"n1-{i}" for i in range(7)])
    servers = {"n1": GameSyncServer(tmp_path / "n1.db")}
    nodes = []
    for i, nid in enumerate(ids):
        peers = [f"{ids[j]}@127.0.0.1:{ports[j]}" for j in range(3) if j != i]
        node = MeshNode(node_id=nid, host="127.0.0.1", port=ports[i], data_dir=tmp_path / nid, peers=peers,
                        voters=ids, profile="fast", secret=SECRET)
        if nid in servers:
            node.add_routes(servers[nid].routes())  # n2 serves no games: its pull fails with 404
        nodes.append(node)
    try:
        for node in nodes:
            await node.start()

        async def peers_alive() -> bool:
            return {s.node_id for s in nodes[0].cluster_view().alive()} == set(ids)
        await wait_for(peers_alive, 10.0)
        reports = await sync_from_peers(nodes[0], tmp_path / "n0.db", tmp_path / "sync", budget_s=20)
        by_addr = {r.peer: r for r in reports}
        assert set(by_addr) == {nodes[1].addr, nodes[2].addr}
        assert by_addr[nodes[1].addr].new == 7 and by_addr[nodes[1].addr].error is None
        assert by_addr[nodes[2].addr].error is not None and "404" in by_addr[nodes[2].addr].error
        assert len(local_uids(tmp_path / "n0.db")) == 7
        assert PeerCursor.for_peer(tmp_path / "sync", "n1").load() == (7, "n1-0")
        with pytest.raises(ValueError, match="peer id '..' cannot name a cursor file"):
            PeerCursor.for_peer(tmp_path / "sync", "..")
    finally:
        for node in nodes:
            await node.stop()
        for s in servers.values():
            s.close()
