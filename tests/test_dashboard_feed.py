"""What the dashboard, /progress and the mesh gauges say, read from a node's real stores: on
SQLite files and on a registry and replay store given by a PostgreSQL URL (where the sampler
once failed every 5 s on `'str' object has no attribute 'exists'`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.config import load_settings
from app.coordination.p2p.node import MeshNode
from app.coordination.pipeline import state as ps
from app.coordination.pipeline.dashboard_feed import DashboardFeed, model_elo
from app.workloads import pipeline_context
from app.coordination.sync import install_model
from app.db.registry import MatchGame, ModelRegistry
from app.db.replay_db import GameRecord, MoveRecord, ReplayDB
from app.games import get_game
from app.games.train.gauntlet import recompute_ratings
from app.games.train.solved_accuracy import ACCURACY_FILE, AccuracyCache
from tests.mesh_helpers import free_ports

pytestmark = pytest.mark.timeout(120)
GAME = get_game("connect4")


def _models(work: Path, n: int) -> list[tuple[Path, str]]:
    arch = Architecture(8, 1, GAME.plane_shape, GAME.num_actions)
    out: list[tuple[Path, str]] = []
    for g in range(1, n + 1):
        path = work / f"gen{g}.safetensors"
        meta = save_model(new_model(arch, seed=g), ModelMeta(arch, GAME.name, g, out[-1][1] if out else None), path)
        out.append((path, meta.sha256))
    return out


@pytest.fixture
def lone_node(db_target, tmp_path):
    """A lone node's pipeline with three promoted generations (each candidate played only the
    previous best, as with no gate configured), its best installed, games in its replay store,
    and generations 1 and 2 scored on the solved positions."""
    url = db_target if isinstance(db_target, str) else None
    settings = load_settings(None, node={"node_id": "solo", "data_dir": str(tmp_path / "data"), "db_url": url})
    pipe = pipeline_context(settings)
    models = _models(tmp_path, 3)
    player = lambda sha: f"model:{sha}:s4"  # noqa: E731
    with ModelRegistry(pipe.paths.registry_db) as registry:
        for g, (path, sha) in enumerate(models, 1):
            registry.register(sha, str(path), g, models[g - 2][1] if g > 1 else None)
            registry.promote(sha, "no gate configured")
            if g > 1:  # the gauntlet's real uid format: long enough to break a varchar(64)
                registry.add_match_games([
                    MatchGame(f"{g:016x}-{player(models[g - 2][1])}-{i}", f"{g:016x}", "connect4", player(sha),
                              player(models[g - 2][1]), 0 if i < 12 else 1, "44", 2) for i in range(20)])
        recompute_ratings(registry, net_simulations=4)
    with ReplayDB(pipe.paths.games_db) as games:
        for i in range(5):
            games.add_game(GameRecord(uid=f"g{i}", game="connect4", moves=[MoveRecord(3, [1 / 7] * 7, 0.0)],
                                      winner=0, node_id="solo"))
    best_path, best_sha = models[-1]
    installed = install_model(best_path, pipe.paths.models_dir, best_sha)
    asyncio.run(pipe.update(lambda s: ps.switched_best(s, best_sha, str(installed), 3)))  # as distribution does
    cache = AccuracyCache(pipe.paths.data_dir / ACCURACY_FILE)
    for _, sha in models[:2]:
        cache.add(sha, {"exact": 0.5, "outcome": 0.75, "positions": 931})
    return pipe, models


@pytest.fixture
async def feed(lone_node):
    """The node's real mesh node, started on a free port (its membership exists from start())."""
    pipe, _ = lone_node
    [port] = free_ports(1)
    node = MeshNode(pipe.settings, port=port)
    await node.start()
    try:
        feed = DashboardFeed(pipe, node)
        feed.cache = await asyncio.to_thread(feed._read_disk)  # what run() does every 5 s
        yield feed
    finally:
        await node.stop()


async def test_the_sampler_reads_the_nodes_stores_on_either_backend(lone_node, feed) -> None:
    pipe, models = lone_node
    assert feed.cache.local_games == 5 and feed.cache.local_positions == 5
    assert feed.cache.best_installed_at is not None
    gauges = feed.mesh_gauges()
    assert gauges["cluster_games_created"] == 5 and gauges["best_model_installed_timestamp_seconds"] > 0
    generations = feed.generations()
    assert [g["generation"] for g in generations] == [1, 2, 3] and all(g["promoted"] for g in generations)
    # every generation rated from the chain of best matches, the first at 0, each with its interval
    assert generations[0]["elo"] == 0.0 and 0 < generations[1]["elo"] < generations[2]["elo"]
    assert all(g["elo_low"] <= g["elo"] <= g["elo_high"] for g in generations)
    assert [g["accuracy"] for g in generations] == [{"exact": 0.5, "outcome": 0.75}] * 2 + [None]
    # the gauges: the best's Elo and the newest candidate's, two series however many generations
    assert gauges["model_elo"] == {"best": generations[2]["elo"], "candidate": generations[2]["elo"]}


async def test_progress_of_a_lone_node_names_its_best_and_lists_its_generations(lone_node, feed) -> None:
    from app.p2p_orchestrator import _local_progress

    pipe, models = lone_node
    progress = feed.progress(_local_progress(pipe))
    assert progress["best_generation"] == 3 and progress["current_best"] == models[-1][1]
    assert [g["generation"] for g in progress["generations"]] == [1, 2, 3]
    assert progress["generations"][2]["elo"] > 0 and progress["generations"][0]["accuracy"]["exact"] == 0.5
    # every candidate played only the previous best: no Elo here is "vs random", and none says so
    assert progress["anchor"] == "generation 1" and {g["elo_anchor"] for g in progress["generations"]} == {"generation 1"}
    assert feed.snapshot()["elo_anchor"] == "generation 1"
    # the feedback loops (off by default) and the values the node plays and trains with
    assert set(progress["feedback"]) == {"quality", "plateau"} and \
        progress["feedback"]["plateau"]["dirichlet_fraction"] == pipe.settings.search.dirichlet_fraction
    assert not progress["feedback"]["quality"]["enabled"] and progress["feedback"]["quality"]["values"] == {}


def test_model_elo_names_the_best_and_the_newest_candidate() -> None:
    gens = [{"generation": 1, "sha256": "a", "elo": 0.0}, {"generation": 2, "sha256": "b", "elo": 80.0},
            {"generation": 3, "sha256": "c", "elo": 60.0}]
    assert model_elo(gens, "b") == {"best": 80.0, "candidate": 60.0}
    assert model_elo(gens, None) == {"candidate": 60.0}
    assert model_elo([], None) == {}


async def test_the_work_queue_panel_is_fed_on_the_leader_itself(lone_node, feed) -> None:
    """A lone node leads itself: its queue counts are on its own dashboard, as /status has them
    (they used to wait for gossip, which a node never sends itself)."""
    node = feed.node
    deadline = asyncio.get_running_loop().time() + 30
    while not node.is_leader and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
    assert node.is_leader
    feed.cache = await asyncio.to_thread(feed._read_disk)
    snapshot = feed.snapshot()
    assert snapshot["work"] == node.queue.summary() == node.status()["work"]
    [me] = snapshot["nodes"]
    assert me["under_replicated"] is None  # a lone node replicates nothing: shown as such, not as 0
