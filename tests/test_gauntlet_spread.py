"""The claimant's spread gauntlet between two real MeshNodes on loopback: a shard another node
published is taken from gossip, pending shards are claimed and played here, and a shard a
peer claimed but never answered is played here once `shard_wait_s` has passed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.config import load_settings
from app.coordination.pipeline.cluster import ClusterPipeline
from app.coordination.pipeline.gauntlet_plan import RESULTS_KEY
from app.coordination.pipeline.shard_board import ShardBoard
from app.coordination.pipeline.gauntlet_spread import build_request, spread_gauntlet
from app.coordination.p2p.node import MeshNode
from app.workloads import pipeline_context
from app.db.registry import ModelRegistry
from app.games.train.gauntlet_baselines import planned_baselines
from app.games.train.gauntlet_shard import ShardGame, ShardResult, play_shard
from app.coordination.pipeline.state import PipelineState, Stage
from app.coordination.pipeline.runner_settings import ExportSettings
from tests.mesh_helpers import free_ports, wait_for

pytestmark = pytest.mark.timeout(60)
SECRET = "spread-secret"
ARCH = Architecture(8, 1, (3, 6, 7), 7)
GAUNTLET = {"games_vs_baseline": 8, "shard_games": 2, "shard_wait_s": 3.0, "net_simulations": 2,
            "opening_plies_min": 2, "opening_plies_max": 4}


async def test_claimant_takes_published_shards_and_plays_an_unanswered_one_after_the_wait(tmp_path: Path) -> None:
    ports = free_ports(2)
    settings = load_settings(None, node={"node_id": "n0", "data_dir": str(tmp_path / "n0")}, gauntlet=GAUNTLET)
    pipe = pipeline_context(settings, export=ExportSettings(min_new_games=10**9))  # the leader schedules no training
    cand = tmp_path / "cand.safetensors"
    sha = str(save_model(new_model(ARCH, seed=2), ModelMeta(ARCH, "connect4", generation=1), cand).sha256)
    state = PipelineState(generation=1, stage=Stage.TRAINED, candidate_path=str(cand), candidate_sha256=sha)
    n0 = MeshNode(node_id="n0", host="127.0.0.1", port=ports[0], data_dir=tmp_path / "n0",
                  peers=[f"n1@127.0.0.1:{ports[1]}"], voters=["n0"], profile="fast", secret=SECRET)
    n1 = MeshNode(node_id="n1", host="127.0.0.1", port=ports[1], data_dir=tmp_path / "n1",
                  peers=[f"n0@127.0.0.1:{ports[0]}"], voters=["n0"], profile="fast", secret=SECRET)
    cluster = ClusterPipeline(n0, pipe)
    pipe.cluster = cluster
    n0.set_work_source(cluster.work_source)
    await n0.start()
    await n1.start()
    publisher = asyncio.create_task(cluster.publish_loop(0.2))
    holder: asyncio.Task | None = None
    try:
        await wait_for(lambda: _leader_is(n1, "n0"), 15)
        baselines = planned_baselines(["random"], settings)  # the gate's random, 8 games; the anchor, 4
        pipe.cluster.gauntlet.set_request(build_request(pipe, state, baselines))
        peer = n1.work_client()
        held = await wait_for(lambda: peer.claim(kinds=["gauntlet"]), 15)  # claimed, never answered
        holder = asyncio.create_task(_renew_forever(peer, held))
        answered = await wait_for(lambda: peer.claim(kinds=["gauntlet"]), 15)
        p = answered.item.payload
        renewing = asyncio.create_task(_renew_forever(peer, answered))  # held while it plays, as a shard worker does
        try:
            published = await asyncio.to_thread(
                play_shard, cand, p["baseline"], p["games"], p["seed"], answered.item.item_id, settings,
                tmp_path / "n1-registry.db", p["net_simulations"], 1, "n1")
        finally:
            renewing.cancel()
        n1.update_local_state(inventory={RESULTS_KEY: {answered.item.item_id: {**published.to_json(), "generation": 1}}})
        done = await peer.complete(answered)  # as shard_worker: published first, so gossip may beat the
        assert done.ok or done.reason == "stale token: the claim is no longer held", done  # completion

        started = time.monotonic()
        report = await spread_gauntlet(pipe, state, baselines, 1, lambda: False)
        elapsed = time.monotonic() - started
    finally:
        if holder is not None:
            holder.cancel()
        publisher.cancel()
        await n1.stop()
        await n0.stop()

    random_, anchor = report.results
    assert random_.kind == "random" and random_.games == 8 and report.candidate_sha256 == sha
    assert (anchor.kind, anchor.opponent, anchor.games) == ("anchor", "heuristic-d2", 4)  # its own count
    assert report.anchor == "heuristic-d2"  # every Elo below is relative to it
    played_by = {iid: r["played_by"] for iid, r in pipe.cluster.gauntlet.results().items()}
    assert sum("-anchor-" in iid for iid in played_by) + ("-anchor-" in answered.item.item_id) == 2  # 4 games in 2s
    assert held.item.item_id in played_by and played_by[held.item.item_id] == "n0"  # after the wait
    assert answered.item.item_id not in played_by  # n1's result was used, not replayed
    assert set(played_by.values()) == {"n0"} and len(played_by) == 5
    assert elapsed >= GAUNTLET["shard_wait_s"] - 0.5
    assert pipe.cluster.gauntlet.request is None  # every shard in: the request is withdrawn
    with ModelRegistry(pipe.paths.registry_db) as registry:
        games = registry.match_games()
        assert len(games) == 12 and len({g.uid for g in games}) == 12
        assert {g.uid for g in games} >= {g.uid for g in published.games}  # the peer's games recorded here
    assert any(r.player == report.candidate and r.games == 12 for r in report.ratings)
    assert next(r for r in report.ratings if r.player == "heuristic-d2").elo == 0.0


async def _leader_is(node: MeshNode, leader: str) -> bool:
    return node.leader_id == leader


async def _renew_forever(peer, claim) -> None:  # type: ignore[no-untyped-def]
    while True:
        await asyncio.sleep(claim.ttl / 3)
        await peer.renew(claim)


def test_the_board_keeps_results_across_restarts_until_their_generation_is_decided(tmp_path: Path) -> None:
    def result(shard_id: str) -> ShardResult:
        return ShardResult(shard_id, "a" * 64, "random", 1, 0, 0, (ShardGame(f"{shard_id}#0", "c", "random", 0, "44"),))

    board = ShardBoard(tmp_path / "gauntlet_results.json", keep_generations=2)
    for generation in (1, 2, 3):
        board.publish(generation, result(f"gauntlet:generation-{generation}-random-0"))
    assert sorted(board.results()) == ["gauntlet:generation-2-random-0", "gauntlet:generation-3-random-0"]
    again = ShardBoard(tmp_path / "gauntlet_results.json", keep_generations=2)  # a restarted node
    assert again.inventory()[RESULTS_KEY] == board.results()
    again.prune({2})
    assert list(again.results()) == ["gauntlet:generation-3-random-0"]
    assert ShardResult.from_json(again.results()["gauntlet:generation-3-random-0"]).wins == 1

    (tmp_path / "gauntlet_results.json").write_text("{not json")
    assert ShardBoard(tmp_path / "gauntlet_results.json").results() == {}  # refused (logged with its path)
